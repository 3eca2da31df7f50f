"""Logit bias and penalties: llama.cpp's definitions, and exact under every method."""

from __future__ import annotations

import json

import numpy as np
import pytest
from clirun import run_cli
from helpers import lcp_greedy, same_distribution, token_counts
from hypothesis import given, settings
from hypothesis import strategies as st

from localspec import GenerationOptions
from localspec.errors import SamplingError, TokenIdError
from localspec.sampling.processors import Processing

PROMPTS = ["The cat sat on the mat and the dog sat on the", "in the end, in the end, in the"]
PENALTIES = {"repeat_penalty": 1.3, "frequency_penalty": 0.4, "presence_penalty": 0.3, "repeat_last_n": 16}


def llama_cpp_penalties(logits: np.ndarray, recent: list[int], repeat: float, freq: float,
                        present: float) -> np.ndarray:
    """llama.cpp's llama_sampler_penalties_apply, transcribed token by token."""
    out = logits.astype(np.float32).copy()
    counts: dict[int, int] = {}
    for t in recent:
        counts[t] = counts.get(t, 0) + 1
    for token, count in counts.items():
        x = out[token]
        x = x * repeat if x <= 0 else x / repeat
        out[token] = np.float32(x - (np.float32(count) * np.float32(freq) + np.float32(present)))  # count > 0 here
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-30, 30, width=32), min_size=12, max_size=12),
       st.lists(st.integers(0, 11), max_size=40), st.integers(0, 20),
       st.floats(0.5, 2.0), st.floats(-2, 2), st.floats(-2, 2),
       st.dictionaries(st.integers(0, 11), st.floats(-100, 100), max_size=4))
def test_a_row_is_processed_as_llama_cpp_does(logits, generated, last_n, repeat, freq, present, bias):
    row = np.asarray(logits, dtype=np.float32)
    p = Processing(tuple(sorted(bias.items())), repeat, freq, present, last_n)
    expected = row.copy()
    for token, value in bias.items():  # llama-cpp-python's logit_bias processor runs before the penalties
        expected[token] += np.float32(value)
    if last_n and generated:
        expected = llama_cpp_penalties(expected, generated[-last_n:], repeat, freq, present)
    np.testing.assert_allclose(p.row(row, generated), expected, rtol=1e-6, atol=1e-4)


def test_verification_rows_see_the_drafted_tokens_before_them():
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(4, 10)).astype(np.float32)
    p = Processing(((3, 2.0),), 1.5, 0.5, 0.25, 8)
    out = p.rows(rows, [1, 2, 2], [5, 6, 7])
    for i, history in enumerate([[1, 2, 2], [1, 2, 2, 5], [1, 2, 2, 5, 6], [1, 2, 2, 5, 6, 7]]):
        np.testing.assert_array_equal(out[i], p.row(rows[i], history))


def test_options_take_the_bias_as_a_mapping_pairs_or_id_equals_bias():
    a = GenerationOptions(logit_bias={"7": -100, 3: 2.5})
    b = GenerationOptions().replace(logit_bias=["3=2.5", "7=-100"])
    assert a.logit_bias == b.logit_bias == ((3, 2.5), (7, -100.0))
    for bad, words in (({"x": 1}, "whole numbers"), ({1: 101}, "-100 to 100"), (["3:1"], "ID=BIAS"), (5, "map"),
                       ({"\u00b2": 1}, "whole numbers"), ({"9" * 5000: 1}, "whole numbers")):
        with pytest.raises(SamplingError, match=words):
            GenerationOptions(logit_bias=bad)
    for field, value in (("repeat_penalty", 0), ("frequency_penalty", 2.5), ("presence_penalty", float("nan")),
                         ("repeat_last_n", -1)):
        with pytest.raises(SamplingError, match=field):
            GenerationOptions(**{field: value})


@pytest.mark.parametrize("prompt", PROMPTS)
def test_every_method_gives_plain_decodings_tokens_under_bias_and_penalties(tiny_pair, prompt):
    banned = tiny_pair.generate(prompt, max_tokens=8, method="plain").tokens[1]
    opts = GenerationOptions(max_tokens=64, logit_bias={banned: -100, 5: 3.0}, **PENALTIES)
    plain = tiny_pair.generate(prompt, opts, method="plain")
    free = tiny_pair.generate(prompt, max_tokens=64, method="plain")
    assert plain.tokens != free.tokens and banned not in plain.tokens  # the processing changes the output
    for method, k in (("draft", 4), ("lookup", 8), ("auto", None)):
        r = tiny_pair.generate(prompt, opts, method=method, k=k)
        assert r.tokens == plain.tokens, f"{method} diverged from plain decoding under the same processing"
        assert r.stats.accepted > 0 or method == "auto"  # rows after drafted tokens were processed and used


def test_plain_decoding_is_llama_cpp_pythons_own_under_the_same_penalties(tiny_dir, tiny_pair):
    import llama_cpp

    prompt = PROMPTS[1]
    tokens = tiny_pair.tokenize(prompt)
    bias = {9: 4.0, 11: -100.0}
    n = 96  # past llama-cpp-python's 64-token penalty window (and ours)
    mine = tiny_pair.generate(tokens, max_tokens=n, method="plain", logit_bias=bias, repeat_penalty=1.3,
                              frequency_penalty=0.4, presence_penalty=0.3).tokens

    def biased(_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        out = scores.copy()
        for token, value in bias.items():
            out[token] += value
        return out

    sampling = {"repeat_penalty": 1.3, "frequency_penalty": 0.4, "presence_penalty": 0.3,
                "logits_processor": llama_cpp.LogitsProcessorList([biased])}
    theirs = lcp_greedy(tiny_dir / "target.gguf", tokens, n, sampling=sampling, n_threads=tiny_pair.target.n_threads,
                        n_threads_batch=tiny_pair.target.n_threads_batch)
    assert mine[: len(theirs)] == theirs and len(theirs) == min(n, len(mine))


def test_sampled_speculation_keeps_the_processed_distribution(make_pair):
    pair = make_pair()
    prompt, extra = PROMPTS[0], {"logit_bias": {5: 2.0}, **PENALTIES}
    plain = token_counts(pair, prompt, 400, 3, method="plain", **extra)
    drafted = token_counts(pair, prompt, 400, 3, method="draft", k=4, **extra)
    assert same_distribution(plain, drafted) > 1e-3


def test_a_biased_token_outside_the_vocabulary_is_refused_before_any_work(tiny_pair):
    n = tiny_pair.target.n_vocab
    with pytest.raises(TokenIdError, match=f"logit_bias names token id {n}"):
        tiny_pair.generate("hello", max_tokens=4, logit_bias={n: 1.0})


def test_the_command_line_takes_the_bias_and_penalties(tiny_dir, tiny_pair):
    t = str(tiny_dir / "target.gguf")
    base = ["generate", "-t", t, "-p", PROMPTS[1], "-n", "24", "--method", "lookup", "--json"]
    r = run_cli([*base, "--logit-bias", "5=3", "--logit-bias", "9=-100", "--repeat-penalty", "1.3",
                 "--frequency-penalty", "0.4", "--presence-penalty", "0.3", "--repeat-last-n", "16"])
    assert r.exit_code == 0, r.output
    expected = tiny_pair.generate(PROMPTS[1], max_tokens=24, method="plain", logit_bias={5: 3, 9: -100},
                                  **PENALTIES).tokens
    assert json.loads(r.stdout)["tokens"] == expected
    bad = run_cli([*base, "--logit-bias", "5:3"])
    assert bad.exit_code != 0 and "ID=BIAS" in bad.output and "Traceback" not in bad.output
    odd = run_cli([*base, "--logit-bias", "\u00b2=1"])  # a digit to str.isdigit, not a token id
    assert odd.exit_code != 0 and "ID=BIAS" in odd.output and "Traceback" not in odd.output
