"""Predicted outputs: the caller's guess of the output is a drafter, and the output stays plain decoding's."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import same_distribution, token_counts

from localspec.drafting.drafters import PredictionDrafter
from localspec.errors import ConfigError

PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n"


def test_the_prediction_is_followed_where_the_output_matches_it():
    d = PredictionDrafter([1, 2, 3, 4, 5, 6], max_ngram=3, min_ngram=1)
    prompt = np.array([40, 41, 42], dtype=np.int32)
    d.prefill(prompt)
    ctx = lambda *out: np.concatenate([prompt, np.array(out, dtype=np.int32)])  # noqa: E731
    assert d.propose(ctx(1), 3, None).tokens == [2, 3, 4]
    assert d.propose(ctx(1, 2, 3, 9), 3, None).tokens == []  # the reply left the prediction
    assert d.propose(ctx(1, 2, 3, 9, 5), 3, None).tokens == [6]  # and came back to it
    twice = PredictionDrafter([7, 8, 7, 8, 9], max_ngram=1, min_ngram=1)
    twice.prefill(prompt)
    assert twice.propose(ctx(7), 2, None).tokens == [8, 7]
    assert twice.propose(ctx(7, 8, 7), 2, None).tokens == [8, 9]  # the second 7, in order, not the first
    stale = PredictionDrafter([1, 9, 2, 3, 9, 4, 5, 9, 6], max_ngram=2, min_ngram=1)
    stale.prefill(prompt)
    assert stale.propose(ctx(1, 9), 2, None).tokens == [2, 3]
    # kept 2 3 9 4, then a 7 the prediction lacks, then 9: the 9 where the reply should be by now, not an old one
    assert stale.propose(ctx(1, 9, 2, 3, 9, 4, 7, 9), 2, None).tokens == [6]


def edited(text: str) -> str:
    """A prediction as a caller writes one: the expected output with a change in the middle."""
    half = len(text) // 2
    return text[:half] + " # something else\n" + text[half:]


@pytest.mark.parametrize("method", ["prediction", "auto"])
def test_drafting_from_a_prediction_gives_plain_decodings_tokens(tiny_pair, method):
    plain = tiny_pair.generate(PROMPT, max_tokens=64, method="plain")
    r = tiny_pair.generate(PROMPT, max_tokens=64, method=method, prediction=edited(plain.text))
    assert r.tokens == plain.tokens
    if method == "prediction":
        assert r.stats.accepted_by["prediction"] > 0 and r.stats.drafted_by["prediction"] > r.stats.accepted_by[
            "prediction"]  # kept where it matches, rejected where it was changed


def test_sampling_with_a_prediction_keeps_the_distribution(make_pair):
    pair = make_pair()
    guess = pair.generate(PROMPT, max_tokens=8, method="plain").text
    plain = token_counts(pair, PROMPT, 400, 3, method="plain")
    predicted = token_counts(pair, PROMPT, 400, 3, method="prediction", prediction=guess)
    assert same_distribution(plain, predicted) > 1e-3


def test_method_prediction_needs_a_prediction(tiny_pair):
    with pytest.raises(ConfigError, match="drafts from a predicted output"):
        tiny_pair.generate(PROMPT, max_tokens=4, method="prediction")


def test_the_server_takes_openais_prediction_and_counts_its_tokens(client, tiny_pair, server):
    plain = tiny_pair.generate(PROMPT, max_tokens=48, method="plain")
    r = client.completions.create(model="target", prompt=PROMPT, max_tokens=48, temperature=0,
                                  extra_body={"prediction": {"type": "content", "content": edited(plain.text)},
                                              "method": "prediction"})
    assert r.choices[0].text == plain.text
    details = r.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 0 and details.rejected_prediction_tokens > 0
    status, reply, _ = server.post("/v1/completions", json.dumps(
        {"prompt": "hi", "prediction": {"type": "content", "content": [{"type": "image_url"}]}}).encode())
    assert status == 400 and reply["error"]["param"] == "prediction"
