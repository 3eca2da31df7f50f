"""The acceptance rules and sampling filters, on hand-made vectors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

from localspec.errors import SamplingError
from localspec.sampling.acceptance import (
    ProbRows,
    SamplingParams,
    accept_greedy,
    accept_sampled,
    probabilities,
    residual,
    sample,
)

ALPHA = 1e-3  # seeded tests: a failure means a wrong distribution, not bad luck


def goodness_of_fit(counts: np.ndarray, p: np.ndarray) -> float:
    """p-value of observed counts against probabilities p (zero-probability cells must be empty)."""
    assert counts[p == 0].sum() == 0, "sampled a token with zero probability"
    keep = p > 0
    return float(stats.chisquare(counts[keep], p[keep] * counts.sum()).pvalue)


def test_greedy_params_give_one_hot_argmax():
    p = probabilities(np.array([0.1, 3.0, -1.0, 2.9]), SamplingParams())
    assert p.tolist() == [0.0, 1.0, 0.0, 0.0]


def test_temperature_is_a_scaled_softmax():
    logits = np.array([1.0, 2.0, 0.5, -1.0])
    p = probabilities(logits, SamplingParams(temperature=0.7))
    expected = np.exp(logits / 0.7) / np.exp(logits / 0.7).sum()
    np.testing.assert_allclose(p, expected, rtol=1e-12)


def test_top_k_top_p_min_p_filter_then_renormalise():
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.06, 0.04]))
    assert np.count_nonzero(probabilities(logits, SamplingParams(temperature=1, top_k=2))) == 2
    # 0.4 + 0.3 = 0.7 < 0.75, so the nucleus needs the third token.
    p = probabilities(logits, SamplingParams(temperature=1, top_p=0.75))
    np.testing.assert_allclose(p, [0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9, 0, 0])
    p = probabilities(logits, SamplingParams(temperature=1, min_p=0.6))  # keeps p >= 0.24
    np.testing.assert_allclose(p, [0.4 / 0.7, 0.3 / 0.7, 0, 0, 0])


def test_top_p_beyond_the_candidate_window_falls_back_to_a_full_sort():
    logits = -np.arange(5000) * 1e-4  # nearly flat: the nucleus holds thousands of tokens
    p = probabilities(logits, SamplingParams(temperature=1, top_p=0.9))
    full = np.exp(logits) / np.exp(logits).sum()
    expected = int(np.searchsorted(np.cumsum(full), 0.9)) + 1  # smallest prefix reaching 0.9
    assert expected > 1024
    assert np.count_nonzero(p) == expected
    np.testing.assert_allclose(p[:expected], full[:expected] / full[:expected].sum())


@pytest.mark.parametrize("kwargs", [
    dict(temperature=-0.1), dict(temperature=float("nan")), dict(temperature=float("inf")),
    dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1), dict(top_k=2.5), dict(min_p=-0.1), dict(min_p=1.1),
])
def test_out_of_range_sampling_values_are_refused(kwargs):
    with pytest.raises(SamplingError) as err:
        SamplingParams(**kwargs)
    name = next(iter(kwargs))
    assert name in str(err.value)


def test_accept_greedy_keeps_the_agreeing_prefix_then_corrects():
    rows = np.eye(6)[[1, 2, 3, 4, 5]]  # the target's argmax: 1, 2, 3, 4, 5
    assert accept_greedy([1, 2, 9, 4], rows) == (2, 3)
    assert accept_greedy([7], rows[:2]) == (0, 1)


def test_accept_greedy_all_accepted_takes_the_bonus_from_the_last_row():
    rows = np.eye(6)[[1, 2, 3, 4]]
    assert accept_greedy([1, 2, 3], rows) == (3, 4)
    assert accept_greedy([], rows[:1]) == (0, 1)


def test_residual_is_the_positive_part_of_p_minus_q():
    p = np.array([0.5, 0.2, 0.2, 0.1])
    q = np.array([0.1, 0.6, 0.2, 0.1])
    np.testing.assert_allclose(residual(p, q, 1), [0.4, 0, 0, 0])
    np.testing.assert_allclose(residual(p, None, 0), [0, 0.2, 0.2, 0.1])  # one-hot q: p without x


def test_sample_never_picks_zero_weight_tokens():
    rng = np.random.default_rng(0)
    w = np.array([0.0, 2.0, 0.0, 1.0, 0.0])
    counts = np.bincount([sample(w, rng) for _ in range(3000)], minlength=5)
    assert goodness_of_fit(counts, w / w.sum()) > ALPHA


def _first_token_counts(p_rows, q_rows, n, rng, *, one_hot_x=None):
    """Counts of the first emitted token over n speculative steps, drafts drawn from q."""
    v = p_rows.shape[1]
    counts = np.zeros(v, dtype=int)
    kept_total = 0
    for _ in range(n):
        if one_hot_x is None:
            draft = [sample(q, rng) for q in q_rows]
            kept, nxt = accept_sampled(draft, q_rows, p_rows, rng)
        else:
            draft = list(one_hot_x)
            kept, nxt = accept_sampled(draft, None, p_rows, rng)
        first = draft[0] if kept > 0 else nxt
        counts[first] += 1
        kept_total += kept
    return counts, kept_total


def test_sampled_acceptance_reproduces_p_with_a_sampled_draft():
    rng = np.random.default_rng(1)
    p = np.array([[0.5, 0.2, 0.2, 0.1, 0.0], [0.1, 0.1, 0.1, 0.1, 0.6]])
    q = np.array([[0.1, 0.5, 0.1, 0.1, 0.2], [0.2, 0.2, 0.2, 0.2, 0.2]])
    counts, _ = _first_token_counts(p, q[:1], 20000, rng)
    assert goodness_of_fit(counts, p[0]) > ALPHA


def test_sampled_acceptance_with_a_one_hot_draft_reproduces_p():
    rng = np.random.default_rng(2)
    p = np.array([[0.3, 0.5, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25]])
    counts, kept = _first_token_counts(p, None, 20000, rng, one_hot_x=[1])
    assert goodness_of_fit(counts, p[0]) > ALPHA
    # x is kept with probability p(x) = 0.5
    assert stats.binomtest(kept, 20000, 0.5).pvalue > ALPHA


def test_a_draft_equal_to_the_target_is_always_kept_and_the_bonus_follows_the_last_row():
    rng = np.random.default_rng(3)
    p = np.array([[0.6, 0.4, 0.0], [0.0, 0.5, 0.5], [0.2, 0.3, 0.5]])
    bonus = np.zeros(3, dtype=int)
    for _ in range(6000):
        draft = [sample(p[0], rng), sample(p[1], rng)]
        kept, nxt = accept_sampled(draft, p[:2], p, rng)
        assert kept == 2
        bonus[nxt] += 1
    assert goodness_of_fit(bonus, p[2]) > ALPHA


def test_second_position_keeps_the_joint_distribution():
    # Two-token drafts: the pair (first, second) must follow p0(a) * p1(b);
    # here p1 does not depend on a, so the marginal of the second is p1.
    rng = np.random.default_rng(4)
    p = np.array([[0.7, 0.3, 0.0], [0.1, 0.2, 0.7], [1 / 3, 1 / 3, 1 / 3]])
    q = np.array([[0.2, 0.2, 0.6], [0.6, 0.3, 0.1]])
    seconds = np.zeros(3, dtype=int)
    for _ in range(20000):
        draft = [sample(q[0], rng), sample(q[1], rng)]
        kept, nxt = accept_sampled(draft, q, p, rng)
        if kept >= 1:  # the second token is the kept draft[1] or the correction at position 1
            seconds[draft[1] if kept == 2 else nxt] += 1
    assert goodness_of_fit(seconds, p[1]) > ALPHA


def test_prob_rows_are_computed_lazily_and_once():
    logits = np.array([[0.0, 1.0], [2.0, 0.0]])
    rows = ProbRows(logits, SamplingParams(temperature=1.0))
    assert len(rows) == 2
    first = rows[0]
    assert rows[0] is first
    np.testing.assert_allclose(rows[1], probabilities(logits[1], SamplingParams(temperature=1.0)))


def _llama_cpp_candidates(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """llama.cpp's own sampler chain (llama-cpp-python's order) on ``logits``: the probabilities it samples from."""
    import ctypes

    import llama_cpp as ll

    chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
    for s in (ll.llama_sampler_init_top_k(params.top_k), ll.llama_sampler_init_top_p(params.top_p, 1),
              ll.llama_sampler_init_min_p(params.min_p, 1), ll.llama_sampler_init_temp(params.temperature)):
        ll.llama_sampler_chain_add(chain, s)
    data = (ll.llama_token_data * len(logits))(*[ll.llama_token_data(i, float(x), 0.0) for i, x in enumerate(logits)])
    cur = ll.llama_token_data_array(data, len(logits), -1, False)
    ll.llama_sampler_apply(chain, ctypes.byref(cur))
    ids = np.array([data[i].id for i in range(cur.size)])
    z = np.array([data[i].logit for i in range(cur.size)], dtype=np.float64)  # already divided by the temperature
    ll.llama_sampler_free(chain)
    out = np.zeros(len(logits))
    out[ids] = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    return out


@pytest.mark.parametrize("kw", [
    dict(temperature=0.7, top_p=0.9),
    dict(temperature=0.7, min_p=0.1),
    dict(temperature=1.5, top_k=40, top_p=0.8),
    dict(temperature=0.5, top_k=20, top_p=0.95, min_p=0.05),
    dict(temperature=2.0, top_p=0.5, min_p=0.2),
])
def test_filters_and_temperature_match_llama_cpps_sampler(kw):
    # Filters first, temperature last: with temperature 0.7 and top-p 0.9 the
    # nucleus is chosen on the untempered distribution, as llama-cli does.
    logits = np.random.default_rng(3).normal(0, 2.5, 2000).astype(np.float32)
    params = SamplingParams(**kw)
    ours = probabilities(logits, params)
    theirs = _llama_cpp_candidates(logits, params)
    assert set(np.flatnonzero(ours)) == set(np.flatnonzero(theirs))
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-7)


def _whole_vocabulary(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The filters over every token, with no search window: what ``probabilities`` must equal."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max()
    p = np.exp(z) / np.exp(z).sum()
    n = len(p)
    if 0 < params.top_k < n:
        p[p < np.sort(p)[n - params.top_k]] = 0.0
        p /= p.sum()
    if params.top_p < 1.0:
        ranked = np.sort(p)[::-1]
        cut = min(int(np.searchsorted(np.cumsum(ranked), params.top_p)), n - 1)
        p[p < ranked[cut]] = 0.0
    if params.min_p > 0:
        p[p < params.min_p * p.max()] = 0.0
    out = np.where(p > 0, np.exp(z / params.temperature), 0.0)
    return out / out.sum()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(2, 5000), spread=st.floats(0.01, 12.0),
       peaks=st.integers(0, 30), height=st.floats(0.0, 30.0), masked=st.floats(0.0, 0.9),
       temperature=st.floats(0.1, 3.0), top_k=st.sampled_from([0, 1, 5, 40, 1000, 6000]),
       top_p=st.sampled_from([1.0, 0.999, 0.95, 0.9, 0.5, 0.05]),
       min_p=st.sampled_from([0.0, 1e-9, 1e-4, 0.05, 0.5]))
def test_the_search_window_never_changes_the_filters_answer(seed, n, spread, peaks, height, masked, temperature,
                                                             top_k, top_p, min_p):
    # Peaked rows are decided among the tokens near the top; flat ones, masked ones (a grammar's -inf) and
    # large k or tiny min-p fall back to the whole vocabulary. The answer must be the same either way.
    rng = np.random.default_rng(seed)
    logits = (rng.normal(0, spread, n) + np.isin(np.arange(n), rng.choice(n, min(peaks, n))) * height)
    logits[rng.random(n) < masked] = -np.inf
    logits[rng.integers(n)] = 0.0 if not np.isfinite(logits).any() else logits[np.isfinite(logits)].max()
    logits = logits.astype(np.float32)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    ours, theirs = probabilities(logits, params), _whole_vocabulary(logits, params)
    # a token at the very edge of the nucleus may be kept by one and not the other, from float32 rounding
    differ = np.flatnonzero((ours > 0) != (theirs > 0))
    assert len(differ) <= 1 or np.allclose(ours[differ], 0, atol=1e-6) and np.allclose(theirs[differ], 0, atol=1e-6)
    if not len(differ):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-9)
    assert abs(ours.sum() - 1.0) < 1e-9


def test_sampling_a_large_vocabulary_follows_its_weights_across_blocks():
    # More tokens than one block, mass in several blocks and in the short last one; zero weights never drawn.
    rng = np.random.default_rng(5)
    w = np.zeros(5000)
    hot = [3, 1023, 1024, 2500, 4099, 4999]
    w[hot] = [1.0, 2.0, 0.5, 3.0, 1.5, 2.0]
    counts = np.bincount([sample(w, rng) for _ in range(20000)], minlength=len(w))
    assert goodness_of_fit(counts, w / w.sum()) > ALPHA


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 4000), share=st.floats(0.0005, 1.0))
def test_sample_lands_on_a_positive_weight(seed, n, share):
    rng = np.random.default_rng(seed)
    w = np.where(rng.random(n) < share, rng.random(n) * 10.0 ** rng.integers(-300, 3, n), 0.0)
    w[rng.integers(n)] = rng.random() + 1e-300
    for _ in range(20):
        assert w[sample(w, rng)] > 0


@pytest.mark.parametrize("k", [5, 6])
def test_top_p_sees_the_top_k_distribution_when_the_likeliest_tokens_are_exactly_k(k):
    # Five tokens near the top and 5000 a little further down hold a sixth of the mass: top-p must be taken
    # over the top k's own distribution, whether the search window holds exactly k tokens or more.
    logits = np.concatenate([-0.3 * np.arange(5), np.full(5000, -8.5)]).astype(np.float32)
    params = SamplingParams(temperature=1.0, top_k=k, top_p=0.5)
    np.testing.assert_allclose(probabilities(logits, params), _whole_vocabulary(logits, params), atol=1e-12)


def test_sample_with_no_weight_anywhere_gives_the_last_index_at_any_length():
    rng = np.random.default_rng(0)
    for n in (5, 1024, 2048, 3000):  # one block, whole blocks, whole blocks and a short one
        assert sample(np.zeros(n), rng) == n - 1


def test_a_nan_row_under_min_p_does_not_raise():
    logits = np.full(3000, np.nan, dtype=np.float32)
    p = probabilities(logits, SamplingParams(temperature=0.7, min_p=0.05))
    assert p.shape == (3000,)


def test_large_float64_logits_keep_their_differences():
    # float64 rows far from zero: the mass must be taken after subtracting the top, not in float32 before
    logits = np.random.default_rng(2).standard_normal(32000) * 3 + 1e5
    params = SamplingParams(temperature=1.0, top_p=0.9)
    ours, theirs = probabilities(logits, params), _whole_vocabulary(logits, params)
    assert np.count_nonzero(ours) == np.count_nonzero(theirs)
    np.testing.assert_allclose(ours, theirs, rtol=1e-9, atol=1e-12)
