"""Every llama-server command `localspec export` writes starts a real llama-server and answers the openai client.

The llama-server is built from the llama.cpp localspec runs (the source vendored in the pinned
llama-cpp-python) by ``scripts/build_llama_server.sh``, which caches it under
``~/.cache/localspec/llama-server``; ``LOCALSPEC_LLAMA_SERVER`` names another binary. Without one these tests
are skipped, saying so. Each exported command is started as printed (its program replaced by the binary's
path), asked one chat completion, and for a drafting method its ``timings`` must show drafted and accepted
tokens. The tiny models answer in milliseconds; the tiny qwen35 (a hybrid with an MTP head) is a bigram
model, so its greedy reply repeats and lookup and history find matches in it.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from clirun import run_cli
from conftest import real_models_dir
from serverproc import built_binary, free_port
from tinyarch import write_tiny_qwen35

from localspec.export.llama_server_flags import pinned, read_build

START_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def binary() -> Path:
    path = built_binary()
    if path is None or not os.access(path, os.X_OK):
        pytest.skip("no llama-server built from the pinned llama.cpp: run `bash scripts/build_llama_server.sh` "
                    "(about 25 minutes on 2 cores, cached after) or set LOCALSPEC_LLAMA_SERVER to a binary")
    return path


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny qwen35 (delta net + attention) whose MTP head is its own bigram table."""
    return write_tiny_qwen35(tmp_path_factory.mktemp("qwen35") / "bigram.gguf", seed=0, trunk=0.0,
                             bigram_head=True)


def exported(binary: Path, args: list[str], port: int) -> tuple[list[str], str]:
    """The argv `localspec export ARGS --to llama-server` prints, to run on ``binary``, and the printed text."""
    r = run_cli(["export", *args, "--to", "llama-server", "--llama-server", str(binary), "--port", str(port)])
    assert r.exit_code == 0, r.output
    command = "\n".join(line for line in r.output.splitlines() if not line.startswith("#"))
    argv = shlex.split(command.replace("\\\n", " "))
    assert argv[0] == "llama-server"
    return [str(binary), *argv[1:]], r.output


@contextmanager
def running(argv: list[str], port: int, log: Path) -> Iterator[str]:
    """llama-server started with ``argv``; yields its /v1 base once /health answers."""
    with open(log, "w+") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"llama-server exited with {proc.returncode}: {log.read_text()[-3000:]}")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                        if json.loads(r.read()).get("status") == "ok":
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(f"llama-server did not answer within {START_TIMEOUT_S} s: {log.read_text()[-3000:]}")
                time.sleep(0.3)
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def ask(base: str, prompt: str, max_tokens: int) -> tuple[str, dict[str, Any]]:
    """One greedy chat completion through the openai client: its text and llama-server's timings."""
    import openai

    client = openai.OpenAI(base_url=base, api_key="not-needed", max_retries=0, timeout=300)
    reply = client.chat.completions.create(model="exported", messages=[{"role": "user", "content": prompt}],
                                           max_tokens=max_tokens, temperature=0)
    timings = (reply.model_extra or {}).get("timings")
    assert isinstance(timings, dict), reply
    return reply.choices[0].message.content or "", timings


def serve_and_ask(binary: Path, args: list[str], tmp_path: Path, prompt: str = "Write the alphabet.",
                  max_tokens: int = 64, asks: int = 1) -> tuple[list[str], str, dict[str, Any]]:
    """Export, start, ask ``asks`` times; the argv, the last reply and its timings."""
    port = free_port()
    argv, _ = exported(binary, args, port)
    with running(argv, port, tmp_path / "llama-server.log") as base:
        for _ in range(asks):
            text, timings = ask(base, prompt, max_tokens)
    assert timings["predicted_n"] > 0 and text, timings
    return argv, text, timings


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_the_pinned_list_is_what_the_built_llama_server_accepts(binary: Path):
    built, listed = read_build(str(binary)), pinned()
    assert listed.options <= built.options, sorted(listed.options - built.options)
    assert built.spec_types == listed.spec_types
    assert not {"--draft-max", "--draft-min", "--spec-ngram-size-n", "--spec-ngram-size-m"} & built.options
    assert "0c1e570" in built.build


def test_a_draft_model(binary: Path, tiny_dir: Path, tmp_path: Path):
    argv, _, timings = serve_and_ask(binary, ["-t", str(tiny_dir / "target.gguf"), "-d",
                                              str(tiny_dir / "draft.gguf"), "--ctx", "1024", "--k", "3"], tmp_path)
    assert _value(argv, "--spec-type") == "draft-simple" and _value(argv, "--spec-draft-n-max") == "3"
    assert timings["draft_n"] > 0 and timings["draft_n_accepted"] > 0, timings


@pytest.mark.parametrize("method, spec_type, asks", [
    ("lookup", "ngram-simple", 1),
    ("history", "ngram-mod", 2),  # the second request drafts from the n-grams of the first one's reply
    ("mtp", "draft-mtp", 1),
])
def test_a_drafting_method_on_the_tiny_hybrid(binary: Path, hybrid: Path, tmp_path: Path, method: str,
                                              spec_type: str, asks: int):
    argv, _, timings = serve_and_ask(binary, ["-t", str(hybrid), "--method", method, "--ctx", "1024"], tmp_path,
                                     asks=asks)
    assert _value(argv, "--spec-type") == spec_type and _value(argv, "--ctx-checkpoints") == "32"
    assert timings["draft_n"] > 0 and timings["draft_n_accepted"] > 0, timings


def test_auto_exports_the_mtp_head_of_a_target_that_has_one(binary: Path, hybrid: Path, tmp_path: Path):
    argv, _, timings = serve_and_ask(binary, ["-t", str(hybrid), "--ctx", "1024"], tmp_path)
    assert _value(argv, "--spec-type") == "draft-mtp"
    assert timings["draft_n_accepted"] > 0, timings


@pytest.mark.parametrize("method, k", [("draft", 2), ("lookup", 3), ("mtp", 2)])
def test_from_bench(binary: Path, tiny_dir: Path, hybrid: Path, tmp_path: Path, method: str, k: int):
    rows = [{"method": method, "k": k, "temperature": 0.0, "speedup": 1.8},
            {"method": "plain", "k": 0, "temperature": 0.0, "speedup": 1.0}]
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"rows": rows}))
    models = (["-t", str(tiny_dir / "target.gguf"), "-d", str(tiny_dir / "draft.gguf")] if method == "draft"
              else ["-t", str(hybrid)])
    argv, _, timings = serve_and_ask(binary, [*models, "--from-bench", str(bench), "--ctx", "1024"], tmp_path)
    length = "--spec-ngram-simple-size-m" if method == "lookup" else "--spec-draft-n-max"
    assert _value(argv, length) == str(k)
    assert timings["draft_n"] > 0 and timings["draft_n_accepted"] > 0, timings


def test_the_api_key_file_is_demanded(binary: Path, tiny_dir: Path, tmp_path: Path):
    import openai

    key = tmp_path / "key"
    key.write_text("s3cret\n")
    port = free_port()
    argv, _ = exported(binary, ["-t", str(tiny_dir / "target.gguf"), "--ctx", "1024", "--api-key-file", str(key)],
                       port)
    with running(argv, port, tmp_path / "llama-server.log") as base:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).chat.completions.create(
                model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        reply = openai.OpenAI(base_url=base, api_key="s3cret", max_retries=0).chat.completions.create(
            model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert reply.choices[0].message.content is not None


REWRITE = ("Rewrite this function with type hints, keeping the body exactly as it is:\n\n"
           "def add_all(items, start):\n    total = start\n    for item in items:\n        total = total + item\n"
           "    return total\n\n"
           "def mean(items):\n    if not items:\n        return 0\n    return add_all(items, 0) / len(items)\n")


@pytest.mark.real
@pytest.mark.parametrize("method", ["draft", "lookup"])
def test_the_real_pair(binary: Path, tmp_path: Path, method: str):
    d = real_models_dir()
    if not (d / "target.gguf").is_file() or not (d / "draft.gguf").is_file():
        pytest.fail(f"The real model pair is not in {d}; run `python scripts/fetch_test_models.py` first "
                    "(or deselect these tests with -m 'not real').")
    argv, text, timings = serve_and_ask(binary, ["-t", str(d / "target.gguf"), "-d", str(d / "draft.gguf"),
                                                 "--method", method, "--ctx", "2048"], tmp_path, prompt=REWRITE,
                                        max_tokens=96)
    assert "def add_all" in text or "def mean" in text, text
    assert timings["draft_n"] > 0 and timings["draft_n_accepted"] > 0, timings
