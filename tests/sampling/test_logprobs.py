"""Log-probabilities: from the processed logits each token was chosen from, the same under every method."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from localspec.constraint import Constraint
from localspec.errors import ConfigError

PROMPT = "The cat sat on the mat and the dog sat on the"


def logprobs_of(result):
    return np.array([lp for lp, _ in result.logprobs])


def test_each_token_has_its_logprob_and_the_likeliest_alternatives(tiny_pair):
    r = tiny_pair.generate(PROMPT, max_tokens=24, method="plain", logprobs=3)
    assert len(r.logprobs) == len(r.tokens)
    for token, (lp, top) in zip(r.tokens, r.logprobs, strict=True):
        assert len(top) == 3 and [v for _, v in top] == sorted((v for _, v in top), reverse=True)
        assert top[0] == (token, lp) and lp <= 0  # greedy: the chosen token is the likeliest
        assert sum(math.exp(v) for _, v in top) <= 1 + 1e-6
    assert tiny_pair.generate(PROMPT, max_tokens=4).logprobs is None  # only when asked for


@pytest.mark.parametrize("method,k", [("draft", 4), ("lookup", 8), ("auto", None)])
def test_every_method_gives_plain_decodings_logprobs(tiny_pair, method, k):
    plain = tiny_pair.generate(PROMPT, max_tokens=40, method="plain", logprobs=2)
    r = tiny_pair.generate(PROMPT, max_tokens=40, method=method, k=k, logprobs=2)
    assert r.tokens == plain.tokens and (r.stats.accepted > 0 or method == "auto")  # auto may decode plainly
    # verification rows come from batches of another shape: equal up to the kernels' rounding
    np.testing.assert_allclose(logprobs_of(r), logprobs_of(plain), atol=0.05)


def test_plain_logprobs_are_llama_cpp_pythons_own(tiny_dir, tiny_pair):
    from llama_cpp import Llama

    tokens = tiny_pair.tokenize(PROMPT)
    mine = tiny_pair.generate(tokens, max_tokens=16, method="plain", logprobs=0)
    assert mine.logprobs is not None and all(top == () for _, top in mine.logprobs)
    llama = Llama(str(tiny_dir / "target.gguf"), n_ctx=1024, flash_attn=False, verbose=False, logits_all=True,
                  n_threads=tiny_pair.target.n_threads, n_threads_batch=tiny_pair.target.n_threads_batch)
    try:
        theirs = llama.create_completion(tokens, max_tokens=16, temperature=0.0, logprobs=1)
    finally:
        llama.close()
    lp = theirs["choices"][0]["logprobs"]["token_logprobs"]
    assert len(lp) == len(mine.tokens) == theirs["usage"]["completion_tokens"]  # the same tokens, one value each
    np.testing.assert_allclose(logprobs_of(mine), lp, atol=1e-3)


def test_logprobs_follow_the_bias_and_the_grammar(tiny_pair):
    free = tiny_pair.generate(PROMPT, max_tokens=8, method="plain", logprobs=5)
    banned = free.tokens[0]
    r = tiny_pair.generate(PROMPT, max_tokens=8, method="plain", logprobs=5, logit_bias={banned: -100})
    assert banned not in [t for t, _ in r.logprobs[0][1]]
    digits = tiny_pair.generate(PROMPT, max_tokens=6, method="lookup", logprobs=20, grammar=Constraint.regex("[0-9]+"))
    for _, top in digits.logprobs:
        shown = [t for t, v in top if v > -math.inf]
        assert shown and all(tiny_pair.target.detokenize([t]).isdigit() or tiny_pair.target.is_eog(t)
                             for t in shown)  # the mask applies: only digits (or the end) have mass


def test_a_bad_logprobs_value_is_refused(tiny_pair):
    with pytest.raises(ConfigError, match="logprobs must be a whole number from 0 to 20"):
        tiny_pair.generate(PROMPT, max_tokens=2, logprobs=21)


def test_completions_give_openais_logprobs_streamed_and_not(client, tiny_pair):
    want = tiny_pair.generate(PROMPT, max_tokens=20, method="plain", logprobs=2)
    r = client.completions.create(model="target", prompt=PROMPT, max_tokens=20, temperature=0, logprobs=2,
                                  extra_body={"method": "plain"})
    lp = r.choices[0].logprobs
    assert r.choices[0].text == want.text and len(lp.tokens) == len(want.tokens)  # one entry a token
    np.testing.assert_allclose(lp.token_logprobs, logprobs_of(want), atol=1e-4)
    assert all(1 <= len(top) <= 3 for top in lp.top_logprobs)  # the chosen one too; two ids may read the same
    assert all(top[tok] == v for top, tok, v in zip(lp.top_logprobs, lp.tokens, lp.token_logprobs, strict=True))
    assert lp.text_offset == [len(PROMPT) + sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    chunks = list(client.completions.create(model="target", prompt=PROMPT, max_tokens=20, temperature=0,
                                            logprobs=2, stream=True, extra_body={"method": "plain"}))
    tokens = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    offsets = [o for c in chunks if c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
    assert tokens == lp.tokens and offsets == lp.text_offset


def test_chat_gives_openais_logprobs_streamed_and_not(client, tiny_pair):
    messages = [{"role": "user", "content": "The cat sat on the mat and"}]
    want = tiny_pair.chat(messages, max_tokens=16, method="plain", logprobs=3)
    r = client.chat.completions.create(model="target", messages=messages, max_tokens=16, temperature=0,
                                       logprobs=True, top_logprobs=3, extra_body={"method": "plain"})
    content = r.choices[0].logprobs.content
    raw = b"".join(bytes(c.bytes) for c in content)  # a character may be split over tokens: join their bytes
    assert raw.decode("utf-8", errors="replace") == r.choices[0].message.content == want.text
    assert all(bytes(c.bytes).decode("utf-8", errors="replace") == c.token for c in content)
    np.testing.assert_allclose([c.logprob for c in content], logprobs_of(want), atol=1e-4)
    assert [[t.token for t in c.top_logprobs] for c in content] == [
        [tiny_pair.target.detokenize([t]) for t, _ in top] for _, top in want.logprobs]
    chunks = list(client.chat.completions.create(model="target", messages=messages, max_tokens=16, temperature=0,
                                                 logprobs=True, top_logprobs=3, stream=True,
                                                 extra_body={"method": "plain"}))
    streamed = [c.token for ch in chunks if ch.choices and ch.choices[0].logprobs
                for c in ch.choices[0].logprobs.content]
    assert streamed == [c.token for c in content]
    plain = client.chat.completions.create(model="target", messages=messages, max_tokens=4, temperature=0)
    assert plain.choices[0].logprobs is None
    off = client.completions.create(model="target", prompt=PROMPT, max_tokens=4, logprobs=False)  # neutral
    assert off.choices[0].logprobs is None


def test_masked_alternatives_are_left_out_not_minus_infinity(client):
    r = client.chat.completions.create(model="target", messages=[{"role": "user", "content": "a JSON object"}],
                                       max_tokens=12, temperature=0, logprobs=True, top_logprobs=20,
                                       response_format={"type": "json_object"})
    content = r.choices[0].logprobs.content
    assert content and all(math.isfinite(t.logprob) for c in content for t in c.top_logprobs)
    assert any(len(c.top_logprobs) < 20 for c in content)  # few tokens can follow '{' in JSON


@pytest.mark.parametrize("path,body,param,code", [
    ("/v1/chat/completions", {"logprobs": 3}, "logprobs", "invalid_type"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs", "invalid_value"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "invalid_value"),
    ("/v1/completions", {"logprobs": 21}, "logprobs", "invalid_value"),
    ("/v1/completions", {"logprobs": True}, "logprobs", "invalid_type"),
    ("/v1/completions", {"logprobs": 2, "top_logprobs": 2}, "top_logprobs", "unknown_parameter"),
])
def test_bad_logprobs_requests_are_one_clear_error(server, path, body, param, code):
    main = {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"}
    status, reply, _ = server.post(path, json.dumps({**main, **body}).encode())
    assert status == 400 and reply["error"]["param"] == param and reply["error"]["code"] == code, reply
