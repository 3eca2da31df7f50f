"""Fill-in-the-middle: the model's own FIM prompt, exact under every method, in the API, the CLI and the server."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
from clirun import run_cli
from serverproc import ServeProcess
from tinymodel import vocabulary, write_tiny_model

import localspec
from localspec.errors import ConfigError

N = len(vocabulary()[0])
FIM = {N: "<|fim_prefix|>", N + 1: "<|fim_suffix|>", N + 2: "<|fim_middle|>"}
PREFIX, SUFFIX = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n", "\n\ndef add(a, b):\n    return a + b\n"


@pytest.fixture(scope="module")
def fim_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fim")
    write_tiny_model(d / "coder.gguf", seed=0, pad_to=N + 3, rename=FIM)  # llama.cpp finds FIM tokens by text
    write_tiny_model(d / "coder-draft.gguf", seed=0, noise=0.35, pad_to=N + 3, rename=FIM)
    return d


@pytest.fixture(scope="module")
def coder(fim_dir: Path):
    with localspec.load(fim_dir / "coder.gguf", fim_dir / "coder-draft.gguf", n_ctx=1024) as pair:
        yield pair


def test_the_prompt_is_the_models_own_fim_tokens_around_the_texts(coder):
    r = coder.infill(PREFIX, SUFFIX, max_tokens=8, method="plain")
    t = coder.target
    assert t.fim_tokens() == (N, N + 1, N + 2)
    bos = [t.bos] if t.adds_bos else []
    assert bos == t.tokenize("", add_special=True)  # this vocabulary adds no EOS
    expected = [*bos, N, *t.tokenize(PREFIX, add_special=False), N + 1, *t.tokenize(SUFFIX, add_special=False),
                N + 2]
    assert r.prompt_tokens == expected
    literal = coder.infill("x <|fim_suffix|> y", "", max_tokens=2, method="plain")
    assert literal.prompt_tokens.count(N + 1) == 1  # the text's "<|fim_suffix|>" stays text


@pytest.mark.parametrize("method,k", [("draft", 4), ("lookup", 8), ("auto", None)])
def test_every_method_fills_in_as_plain_decoding_does(coder, method, k):
    plain = coder.infill(PREFIX, SUFFIX, max_tokens=64, method="plain")
    r = coder.infill(PREFIX, SUFFIX, max_tokens=64, method=method, k=k)
    assert r.tokens == plain.tokens and r.text == plain.text
    assert r.stats.accepted > 0 or method == "auto"


def test_a_model_without_fim_tokens_says_so(tiny_pair):
    with pytest.raises(ConfigError, match="no fill-in-the-middle tokens"):
        tiny_pair.infill("a", "b", max_tokens=2)


def test_generate_takes_a_suffix(fim_dir, coder):
    args = ["generate", "-t", str(fim_dir / "coder.gguf"), "-d", "none", "-p", PREFIX, "--suffix", SUFFIX, "-n", "16",
            "--method", "lookup", "--json"]
    r = run_cli(args)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["tokens"] == coder.infill(PREFIX, SUFFIX, max_tokens=16, method="plain").tokens
    bad = run_cli(["generate", "-t", str(fim_dir / "coder.gguf"), "--message", "hi", "--suffix", "x"])
    assert bad.exit_code == 2 and "--suffix goes with --prompt" in bad.output


def test_the_server_fills_in_with_suffix(fim_dir, coder, tmp_path):
    s = ServeProcess(["-t", str(fim_dir / "coder.gguf"), "-d", str(fim_dir / "coder-draft.gguf"), "--ctx", "1024"],
                     tmp_path)
    try:
        client = openai.OpenAI(base_url=s.url, api_key="not-needed", max_retries=0, timeout=60)
        want = coder.infill(PREFIX, SUFFIX, max_tokens=24, method="plain")
        for stream in (False, True):
            r = client.completions.create(model="coder", prompt=PREFIX, suffix=SUFFIX, max_tokens=24, temperature=0,
                                          stream=stream)
            text = "".join(c.choices[0].text for c in r) if stream else r.choices[0].text
            assert text == want.text
        start = coder.infill("", SUFFIX, max_tokens=8, method="plain")  # filling in at a file's start
        r = client.completions.create(model="coder", prompt="", suffix=SUFFIX, max_tokens=8, temperature=0)
        assert r.choices[0].text == start.text
        status, reply, _ = s.post("/v1/completions", json.dumps({"prompt": [5, 6], "suffix": "x"}).encode())
        assert status == 400 and reply["error"]["param"] == "suffix"
        status, reply, _ = s.post("/v1/chat/completions", json.dumps(
            {"messages": [{"role": "user", "content": "hi"}], "suffix": "x"}).encode())
        assert status == 400 and reply["error"]["param"] == "suffix"
    finally:
        s.close()
