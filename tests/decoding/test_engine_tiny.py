"""The engine on tiny random models: exactness, cache truncation, stops, distributions."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import same_distribution, token_counts
from hypothesis import given, settings
from hypothesis import strategies as st

import localspec
from localspec.drafting.drafters import Drafter
from localspec.events import SOURCE_BONUS, SOURCE_CORRECTION, SOURCE_DRAFT, SOURCE_TARGET
from localspec.runtime.model import Model

PROMPTS = [
    "The cat sat on the mat and the dog sat on the",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n",
    "in the end, in the end, in the",
    "Zebra quartz fjord vex nymph",
]
CONFIGS = [("draft", 1), ("draft", 4), ("draft", 8), ("lookup", 2), ("lookup", 8)]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_speculation_matches_plain_decoding(tiny_pair, prompt):
    plain = tiny_pair.generate(prompt, max_tokens=96, method="plain")
    assert plain.stats.rounds > 0
    for method, k in CONFIGS:
        r = tiny_pair.generate(prompt, max_tokens=96, method=method, k=k)
        assert r.tokens == plain.tokens, f"{method} k={k} diverged from plain decoding"
        assert r.text == plain.text
        assert r.finish_reason == plain.finish_reason


def test_lookup_copies_after_the_first_match_of_the_longest_suffix():
    from localspec.drafting.drafters import PromptLookupDrafter

    look = PromptLookupDrafter()
    # the last 2 tokens (2, 3) occur twice before: the first occurrence is the source of a copy
    draft = look.propose(np.array([1, 2, 3, 9, 4, 5, 2, 3, 7, 6, 2, 3], dtype=np.int32), 3, None)
    assert draft.tokens == [9, 4, 5] and look.last_match == 2
    # a longer match wins over an earlier shorter one: (8, 2, 3) occurs only second
    draft = look.propose(np.array([2, 3, 4, 8, 2, 3, 5, 8, 2, 3], dtype=np.int32), 2, None)
    assert draft.tokens == [5, 8] and look.last_match == 3
    assert look.propose(np.array([1, 2, 3], dtype=np.int32), 2, None).tokens == []
    assert PromptLookupDrafter(max_ngram=1).propose(np.array([4, 1, 4, 2, 4], dtype=np.int32), 1, None).tokens == [1]


def test_the_tests_exercise_both_acceptance_and_rejection(tiny_pair):
    r = tiny_pair.generate(PROMPTS[0], max_tokens=96, method="draft", k=4)
    assert 0 < r.stats.accepted < r.stats.drafted
    r = tiny_pair.generate(PROMPTS[2], max_tokens=96, method="lookup", k=4)
    assert r.stats.drafted > 0 and r.stats.accepted > 0


def test_events_say_where_each_token_came_from(tiny_pair):
    events = list(tiny_pair.stream(PROMPTS[0], max_tokens=64, method="draft", k=4))
    sources = {ev.source for ev in events}
    assert events[0].source == SOURCE_TARGET
    assert {SOURCE_DRAFT, SOURCE_CORRECTION} <= sources
    assert sources <= {SOURCE_TARGET, SOURCE_DRAFT, SOURCE_CORRECTION, SOURCE_BONUS}


def test_a_model_used_as_its_own_draft_accepts_every_guess(tiny_dir):
    with localspec.load(tiny_dir / "target.gguf", tiny_dir / "target.gguf") as pair:
        plain = pair.generate(PROMPTS[1], max_tokens=60, method="plain")
        r = pair.generate(PROMPTS[1], max_tokens=60, method="draft", k=5)
    assert r.tokens == plain.tokens
    assert r.stats.drafted > 0 and r.stats.accepted == r.stats.drafted
    assert r.stats.acceptance_by_position == [1.0] * 5


def _next_logits_match_fresh(model: Model, path, extra: int) -> None:
    """The cached model's logits for one more token equal a fresh context fed the same tokens."""
    cached = model.tokens.copy()
    got = model.eval([extra], logits="last")[0].copy()
    model.truncate(len(cached))
    with Model(path, n_ctx=model.n_ctx, **EXACT) as fresh:
        want = fresh.eval(list(cached) + [extra], logits="last")[0]
        # Only summation order differs between batch shapes here (about 1e-4);
        # a cache holding a wrong or stale token moves logits by far more.
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-3)


EXACT = dict(cache_type="f32", flash_attn=False)  # no f16 rounding in the cache or attention


@pytest.fixture(scope="module")
def f32_pair(tiny_dir):
    t = Model(tiny_dir / "target.gguf", n_ctx=1024, **EXACT)
    d = Model(tiny_dir / "draft.gguf", n_ctx=1024, **EXACT)
    pair = localspec.Pair(t, d)
    yield pair
    pair.close()


def test_the_fresh_context_check_notices_a_wrong_cache(tiny_dir):
    with Model(tiny_dir / "target.gguf", n_ctx=256, **EXACT) as m:
        tokens = m.tokenize(PROMPTS[0])
        m.eval(tokens[:5] + [7] + tokens[6:], logits="none")  # one token differs from the record below
        m._tokens[5] = tokens[5]
        with pytest.raises(AssertionError):
            _next_logits_match_fresh(m, tiny_dir / "target.gguf", extra=42)


@pytest.mark.parametrize("max_tokens", [7, 23, 50, 90])
def test_after_rejections_both_caches_equal_a_fresh_context(tiny_dir, f32_pair, max_tokens):
    pair = f32_pair
    r = pair.generate(PROMPTS[0], max_tokens=max_tokens, method="draft", k=6)
    assert r.stats.drafted > r.stats.accepted  # there were rejections to truncate after
    full = r.prompt_tokens + r.tokens
    for model, path in ((pair.target, tiny_dir / "target.gguf"), (pair.draft, tiny_dir / "draft.gguf")):
        assert list(model.tokens) == full[: model.n_past]  # the record is a prefix of the context
        assert model.n_past >= len(full) - 2
        _next_logits_match_fresh(model, path, extra=42)


def test_eos_mid_round_stops_with_nothing_after_it(tmp_path):
    from tinymodel import write_tiny_model

    write_tiny_model(tmp_path / "t.gguf", seed=0)
    with localspec.load(tmp_path / "t.gguf") as pair:
        plain = pair.generate(PROMPTS[0], max_tokens=40, method="plain").tokens
    stop_at = 12
    eos = plain[stop_at]
    assert eos not in plain[:stop_at]
    write_tiny_model(tmp_path / "e.gguf", seed=0, eos=eos)  # same weights, that token ends generation
    with localspec.load(tmp_path / "e.gguf", tmp_path / "e.gguf") as pair:
        ref = pair.generate(PROMPTS[0], max_tokens=40, method="plain")
        r = pair.generate(PROMPTS[0], max_tokens=40, method="draft", k=8)  # self-draft: EOS inside a round
    assert ref.tokens == plain[:stop_at] and ref.finish_reason == "stop"
    assert r.tokens == ref.tokens and r.finish_reason == "stop"
    assert r.text == ref.text
    for s in (ref.stats, r.stats):  # the round that found EOS counts as decode time too
        assert 0 < s.llama_seconds <= s.decode_seconds


def test_max_tokens_mid_round_emits_exactly_that_many(tiny_dir):
    with localspec.load(tiny_dir / "target.gguf", tiny_dir / "target.gguf") as pair:
        plain = pair.generate(PROMPTS[0], max_tokens=30, method="plain")
        for n in (1, 2, 5, 13):
            r = pair.generate(PROMPTS[0], max_tokens=n, method="draft", k=8)
            assert r.tokens == plain.tokens[:n] and r.finish_reason == "length"


def test_generation_stops_when_the_context_is_full(tiny_dir):
    with localspec.load(tiny_dir / "target.gguf", tiny_dir / "draft.gguf", n_ctx=256) as pair:
        prompt = pair.tokenize(PROMPTS[1] * 4)
        plain = pair.generate(prompt, max_tokens=500, method="plain")
        assert plain.finish_reason == "length" and len(plain.tokens) < 500
        assert len(prompt) + len(plain.tokens) == pair.target.n_ctx
        for method, k in CONFIGS:
            r = pair.generate(prompt, max_tokens=500, method=method, k=k)
            assert r.tokens == plain.tokens and r.finish_reason == "length"


def test_breaking_out_of_a_stream_leaves_caches_consistent(tiny_pair):
    fresh = tiny_pair.generate(PROMPTS[3], max_tokens=40, method="draft", k=4)
    for stop_after in (1, 3, 6):
        for i, _ in enumerate(tiny_pair.stream(PROMPTS[0], max_tokens=60, method="draft", k=5)):
            if i == stop_after:
                break
        again = tiny_pair.generate(PROMPTS[3], max_tokens=40, method="draft", k=4)
        assert again.tokens == fresh.tokens


def test_ctrl_c_inside_a_decode_call_leaves_caches_consistent(tiny_pair, monkeypatch):
    """KeyboardInterrupt right after llama.cpp returned, before the record was updated."""
    import llama_cpp

    fresh = tiny_pair.generate(PROMPTS[1], max_tokens=40, method="draft", k=4)
    real_decode = llama_cpp.llama_decode
    calls = {"n": 0}

    def decode_then_interrupt(ctx, batch):
        rc = real_decode(ctx, batch)
        calls["n"] += 1
        if calls["n"] == 9:
            raise KeyboardInterrupt
        return rc

    monkeypatch.setattr(llama_cpp, "llama_decode", decode_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        tiny_pair.generate(PROMPTS[0], max_tokens=60, method="draft", k=5)
    monkeypatch.setattr(llama_cpp, "llama_decode", real_decode)
    again = tiny_pair.generate(PROMPTS[1], max_tokens=40, method="draft", k=4)
    assert again.tokens == fresh.tokens


def test_unicode_split_across_byte_tokens_streams_correctly(tiny_pair):
    text = "naïve café — 東京 ✓"
    tokens = tiny_pair.tokenize(text)
    assert len(tokens) > len(text)  # multi-byte characters are several tokens
    from localspec.runtime.vocabulary import Detokenizer

    d = Detokenizer(tiny_pair.target)
    pieces = [d.feed(t) for t in tokens] + [d.flush()]
    assert "".join(pieces) == text
    assert "\ufffd" not in "".join(pieces)


def test_stats_are_consistent(tiny_pair):
    r = tiny_pair.generate(PROMPTS[0], max_tokens=50, method="draft", k=4)
    s = r.stats
    assert s.method == "draft" and s.k == 4 and s.generated_tokens == len(r.tokens)
    assert s.drafted == sum(s.proposed_at) and s.accepted == sum(s.accepted_at)
    # every round emits its kept tokens plus one, except a last round cut short by max_tokens
    assert s.rounds + s.accepted - s.k <= s.generated_tokens - 1 <= s.rounds + s.accepted
    assert s.prefill_seconds > 0 and s.decode_seconds > 0 and 0 < s.llama_seconds < s.decode_seconds + s.prefill_seconds
    # the decode time splits into the target's calls, the draft model's and the rest; rounds by kind add up
    assert s.target_seconds > 0 and s.draft_seconds > 0
    assert s.target_seconds + s.draft_seconds == pytest.approx(s.llama_seconds)
    kinds = s.round_time_by
    assert set(kinds) <= {"plain", "draft"} and "draft" in kinds
    assert sum(t["rounds"] for t in kinds.values()) == s.rounds
    # each round decided its kept draft and one token; a last round cut short by max_tokens emitted fewer
    assert s.rounds + s.accepted <= sum(t["tokens"] for t in kinds.values()) <= s.rounds + s.accepted + s.k
    assert sum(t["target"] + t["draft"] for t in kinds.values()) <= s.llama_seconds + 1e-9
    assert all(t["target"] + t["draft"] <= t["seconds"] for t in kinds.values())
    assert sum(t["seconds"] for t in kinds.values()) <= s.decode_seconds
    plain = tiny_pair.generate(PROMPTS[0], max_tokens=20, method="plain").stats
    assert plain.draft_seconds == 0 and set(plain.round_time_by) == {"plain"}
    assert plain.round_time_by["plain"]["tokens"] == plain.rounds
    d = r.to_dict()
    assert set(d) == {"text", "tokens", "finish_reason", "stats"}
    for key in ("method", "k", "rounds", "drafted", "accepted", "prefill_seconds", "decode_seconds",
                "decode_tokens_per_second", "acceptance_by_position", "tokens_per_round"):
        assert key in d["stats"]


# -- sampling: the distribution must be the target's ----------------------------------------------


@pytest.mark.parametrize("method,k,options", [
    ("draft", 3, {}),
    ("lookup", 3, {}),
    ("draft", 2, {"top_k": 20, "top_p": 0.9}),
])
def test_sampled_speculation_has_the_plain_distribution(tiny_pair, method, k, options):
    prompt = "in the end, in the end, in the end, in the"  # lookup finds matches
    n = 2500
    for position in (1, 3):  # tokens decided by speculative rounds
        plain = token_counts(tiny_pair, prompt, n, position, method="plain", **options)
        spec = token_counts(tiny_pair, prompt, n, position, method=method, k=k, **options)
        p = same_distribution(plain, spec)
        assert p > 1e-3, f"{method} position {position}: chi-square p = {p:.2e}"


def test_sampled_runs_really_speculate(tiny_pair):
    prompt = "in the end, in the end, in the end, in the"
    r = tiny_pair.generate(prompt, max_tokens=40, temperature=1.0, seed=0, method="lookup", k=3)
    assert r.stats.drafted > 0 and r.stats.accepted > 0
    r = tiny_pair.generate(prompt, max_tokens=40, temperature=1.0, seed=0, method="draft", k=3)
    assert 0 < r.stats.accepted < r.stats.drafted


def test_same_seed_same_sample(tiny_pair):
    a = tiny_pair.generate(PROMPTS[0], max_tokens=30, temperature=0.9, seed=5, method="draft", k=3)
    b = tiny_pair.generate(PROMPTS[0], max_tokens=30, temperature=0.9, seed=5, method="draft", k=3)
    assert a.tokens == b.tokens


# -- a draft vocabulary larger than the target's ---------------------------------------------------


class PaddedDrafter(Drafter):
    """Proposes one token from q: half its mass on ``token``, half on a padding id the target lacks."""

    name = "draft"
    models = ()

    def __init__(self, n_target_vocab: int, token: int, sampled: bool):
        self.q = np.zeros(n_target_vocab + 16)
        self.q[token] = 0.5
        self.pad = n_target_vocab + 3
        self.q[self.pad] = 0.5
        self.token = token
        self.sampled = sampled
        self.proposed_pad = 0

    def prefill(self, context): pass

    def propose(self, context, k, rng):
        from localspec.drafting.drafters import Draft

        if not self.sampled:  # one-hot: every other round guesses the padding id
            tok = self.pad if len(context) % 2 else self.token
            self.proposed_pad += tok == self.pad
            return Draft([tok, self.token], None, "draft")
        tok = self.pad if rng.random() < 0.5 else self.token
        self.proposed_pad += tok == self.pad
        return Draft([tok], self.q[None, :].copy(), "draft")

    def settle(self, context): pass

    def observe(self, drafted, kept): pass

    def report(self): return None


def _first_speculated_token(pair, prompt, drafter, seeds):
    from localspec.decoding.engine import Generation
    from localspec.decoding.plan import DecodingPlan
    from localspec.options import SamplingParams

    counts: dict[int, int] = {}
    for seed in seeds:
        g = Generation(pair.target, DecodingPlan(pair.tokenize(prompt), drafter=drafter, k=1 if drafter else 0,
                                                 params=SamplingParams(temperature=1.0), max_tokens=2, seed=seed))
        tokens = [ev.token for ev in g]
        if len(tokens) == 2:
            counts[tokens[1]] = counts.get(tokens[1], 0) + 1
    return counts


def test_a_padding_id_in_a_sampled_draft_is_a_rejection_with_the_residual(tiny_pair):
    # p = target, q = (.5 on token A, .5 on a padding id). Treating the padding
    # guess as a rejection and sampling norm(max(0, p - q)) keeps p; sampling p
    # there instead (the old cut) gives A about 1.5 times its probability.
    prompt = "The cat sat on the mat and the dog sat on the"
    plain = _first_speculated_token(tiny_pair, prompt, None, range(3000))
    a = max(plain, key=plain.get)  # the likeliest token: the bias would show most there
    drafter = PaddedDrafter(tiny_pair.target.n_vocab, a, sampled=True)
    spec = _first_speculated_token(tiny_pair, prompt, drafter, range(3000, 6000))
    assert drafter.proposed_pad > 1000  # the padding id really was proposed
    p = same_distribution(plain, spec)
    assert p > 1e-3, f"chi-square p = {p:.2e}: A came {spec.get(a, 0)} times against {plain[a]} plain"


def test_a_draft_model_with_a_larger_vocabulary_keeps_the_plain_distribution(tiny_dir, tmp_path, monkeypatch):
    from tinymodel import vocabulary, write_tiny_model

    from localspec.drafting.drafters import ModelDrafter

    n = len(vocabulary()[0])
    # every real token has a padding clone with the same logit: half the draft's mass is on ids the target lacks
    write_tiny_model(tmp_path / "d.gguf", seed=0, noise=0.35, pad_to=2 * n, pad_clones=True)
    padded = {"n": 0}
    real_propose = ModelDrafter.propose

    def spy(self, context, k, rng):
        d = real_propose(self, context, k, rng)
        padded["n"] += any(t >= n for t in d.tokens)
        return d

    monkeypatch.setattr(ModelDrafter, "propose", spy)
    with pytest.warns(UserWarning, match="padding"):
        pair = localspec.load(tiny_dir / "target.gguf", tmp_path / "d.gguf", n_ctx=1024)
    with pair:
        prompt = "The cat sat on the mat and the dog sat on the"
        for position in (1, 3):
            plain = token_counts(pair, prompt, 2500, position, method="plain")
            spec = token_counts(pair, prompt, 2500, position, method="draft", k=3)
            p = same_distribution(plain, spec)
            assert p > 1e-3, f"position {position}: chi-square p = {p:.2e}"
    assert padded["n"] > 1000  # padding ids really were proposed


def test_a_padding_id_in_a_greedy_draft_ends_the_draft_and_output_stays_exact(tiny_pair):
    from localspec.decoding.engine import Generation
    from localspec.decoding.plan import DecodingPlan

    prompt = tiny_pair.tokenize(PROMPTS[0])
    plain = tiny_pair.generate(prompt, max_tokens=30, method="plain")
    drafter = PaddedDrafter(tiny_pair.target.n_vocab, plain.tokens[0], sampled=False)
    g = Generation(tiny_pair.target, DecodingPlan(prompt, drafter=drafter, k=2, max_tokens=30))
    assert [ev.token for ev in g] == plain.tokens
    assert drafter.proposed_pad > 5
    # a guess starting with the padding id is cut after it: one token drafted, none kept
    assert g.stats.proposed_at[1] < g.stats.proposed_at[0] and g.stats.accepted <= g.stats.drafted


def test_interleaving_two_streams_on_one_pair_is_refused_not_wrong(tiny_pair):
    from localspec.errors import InterleavedGenerationError

    reference = tiny_pair.generate(PROMPTS[1], max_tokens=40, method="draft", k=4).tokens
    a = iter(tiny_pair.stream(PROMPTS[0], max_tokens=40, method="draft", k=4))
    b = iter(tiny_pair.stream(PROMPTS[1], max_tokens=40, method="draft", k=4))
    next(a)
    next(b)  # b re-fills the target's cache with its own prompt
    with pytest.raises(InterleavedGenerationError, match="another generation"):
        for _ in range(40):
            next(a)
    try:  # a's clean-up cut the cache back too, so b may be refused as well; it is never wrong
        assert [next(b).token for _ in range(39)] == reference[1:]
    except InterleavedGenerationError:
        pass
    assert tiny_pair.generate(PROMPTS[1], max_tokens=40, method="draft", k=4).tokens == reference


def test_accepted_counts_only_emitted_tokens_when_max_tokens_cuts_a_round(tiny_dir):
    with localspec.load(tiny_dir / "target.gguf", tiny_dir / "target.gguf") as pair:  # self-draft: all accepted
        for n in (2, 3, 6):
            r = pair.generate(PROMPTS[1], max_tokens=n, method="draft", k=8)
            from_draft = sum(1 for _ in r.tokens) - 1  # every token after the first came from the draft
            assert r.stats.accepted == from_draft == n - 1
            assert r.stats.drafted == 8  # one round drafted 8; only n - 1 were emitted


# -- stop strings ----------------------------------------------------------------------------------


def test_stop_text_holds_back_a_possible_start_and_cuts_at_the_first_stop():
    from localspec.decoding.stop_text import StopText

    st = StopText(["END", "\n\n"])
    assert st.feed("abc E") == "abc "  # "E" could start "END"
    assert st.feed("x") == "Ex"  # it did not
    assert st.feed("y\n") == "y"
    assert st.feed("\nmore") == "" and st.stopped  # "\n\n" spans two pieces
    assert st.feed("after") == "" and st.flush() == ""
    st = StopText(["END"])
    assert st.feed("tail EN") == "tail " and st.flush() == "EN"  # released when nothing more comes


@pytest.mark.parametrize("method,k", [("plain", 0), ("draft", 4), ("lookup", 8)])
def test_a_stop_string_cuts_the_text_before_it_and_stops(tiny_pair, method, k):
    ref = tiny_pair.generate(PROMPTS[2], max_tokens=60, method="plain")
    stop = ref.text[20:23]  # three characters from the middle, usually spread over tokens
    cut = ref.text.find(stop)
    r = tiny_pair.generate(PROMPTS[2], max_tokens=60, method=method, k=k, stop=[stop, "never appears"])
    assert r.text == ref.text[:cut] and r.finish_reason == "stop"
    assert r.tokens == ref.tokens[: len(r.tokens)] and len(r.tokens) < len(ref.tokens)
    events = list(tiny_pair.stream(PROMPTS[2], max_tokens=60, method=method, k=k, stop=stop))
    assert "".join(ev.text for ev in events) == ref.text[:cut]  # streamed text never shows the stop string
    # the cache is consistent after a stop in the middle of a round
    assert tiny_pair.generate(PROMPTS[2], max_tokens=60, method=method, k=k).tokens == ref.tokens


def test_stop_strings_are_validated(tiny_pair):
    from localspec.errors import ConfigError

    for bad in ([""], [3], ["x"] * 17):
        with pytest.raises(ConfigError, match="stop"):
            tiny_pair.generate("hi", stop=bad)


@settings(max_examples=200, deadline=None)
@given(forced=st.lists(st.integers(0, 40), min_size=1, max_size=5),
       guess=st.lists(st.integers(0, 20), max_size=5), sampled=st.booleans(), n=st.integers(0, 12))
def test_forced_tokens_before_a_guess_are_certain_rows_and_cut_with_it(forced, guess, sampled, n):
    from localspec.drafting.drafters import Draft
    from localspec.sampling.acceptance import accept_sampled

    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(21), size=len(guess)) if sampled and guess else None
    d = Draft(guess, probs, "draft", len(guess)).after(forced, "grammar")
    assert d.tokens == [*forced, *guess] and d.forced == len(forced)
    assert d.by == ("draft" if guess else "grammar")
    if d.probs is not None:
        assert len(d.probs) == len(d.tokens)
        for i, t in enumerate(forced):  # certain: all of the row on the forced token
            assert d.probs[i][t] == 1.0 and d.probs[i].sum() == 1.0
        assert np.array_equal(d.probs[len(forced):, :21], probs)
        # a target as sure as the grammar keeps every forced token, whatever the draft's width
        target = np.zeros((len(d.tokens) + 1, 41))
        target[np.arange(len(forced)), forced] = 1.0
        target[len(forced):] = 1.0 / 41
        assert accept_sampled(d.tokens, d.probs, target, rng)[0] >= len(forced)
    cut = d.cut(n)
    assert cut.tokens == d.tokens[:n] and cut.forced == min(n, len(forced))
    assert cut.probs is None or len(cut.probs) == len(cut.tokens)
