"""`localspec export`: the command for a serving engine uses only the engine's documented flags and keys.

Sources of the documented sets below (read 2026-12-01):

* vLLM: ``docs/features/speculative_decoding/draft_model.md`` (``"method": "draft_model"``, ``"model"``,
  ``"num_speculative_tokens"``), ``n_gram.md`` (``"method": "ngram"``, ``"prompt_lookup_max"``),
  ``suffix.md`` (``"method": "suffix"``), and ``vllm/config/speculative.py`` (``SpeculativeConfig``:
  ``prompt_lookup_min``/``prompt_lookup_max``, ``SpeculativeMethod``); ``vllm serve`` options
  ``--host``, ``--port``, ``--max-model-len`` (``docs/cli``).
* llama.cpp: ``docs/speculative.md`` (``--draft-max``, ``--draft-min``, ``--spec-type`` with
  ``ngram-simple``/``ngram-mod``, ``--spec-ngram-size-n``, ``--spec-ngram-size-m``) and
  ``tools/server/README.md`` (``-m``, ``-md``, ``-c``, ``--host``, ``--port``, ``-ngl``, ``-ngld``).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from clirun import run_cli

from localspec.errors import ConfigError
from localspec.export import Served, best_method, llama_server, source_repo, vllm

VLLM_SERVE_OPTIONS = {"--host", "--port", "--max-model-len", "--speculative-config"}
VLLM_SPEC_KEYS = {"method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"}
VLLM_SPEC_METHODS = {"ngram", "draft_model", "suffix"}
LLAMA_SERVER_OPTIONS = {"-m", "-md", "-c", "--host", "--port", "-ngl", "-ngld", "--draft-max", "--draft-min",
                        "--spec-type", "--spec-ngram-size-n", "--spec-ngram-size-m"}
LLAMA_SERVER_SPEC_TYPES = {"none", "ngram-cache", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod"}

TARGET = Served(Path("/models/target.gguf"), "Qwen/Qwen2.5-Coder-1.5B-Instruct", "test")
DRAFT = Served(Path("/models/draft.gguf"), "Qwen/Qwen2.5-Coder-0.5B-Instruct", "test")


def _options(argv: list[str], start: int) -> dict[str, str]:
    """Options and their values; every option here takes one value."""
    words = argv[start:]
    assert len(words) % 2 == 0, words
    return dict(zip(words[::2], words[1::2], strict=True))


def _reparsed(text: str) -> list[str]:
    """What a shell would run: the rendered text without its comment lines, split as sh does."""
    return shlex.split("\n".join(line for line in text.splitlines() if not line.startswith("#")).replace("\\\n", " "))


@pytest.mark.parametrize("method, expected", [
    ("draft", {"method": "draft_model", "model": DRAFT.repo, "num_speculative_tokens": 5}),
    ("lookup", {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 1, "prompt_lookup_max": 5}),
    ("history", {"method": "suffix", "num_speculative_tokens": 5}),
])
def test_vllm_gets_its_documented_speculative_config(method, expected):
    plan = vllm(TARGET, DRAFT, method, 5, (1, 5), 4096)
    assert plan.argv[:3] == ["vllm", "serve", TARGET.repo]
    options = _options(plan.argv, 3)
    assert set(options) <= VLLM_SERVE_OPTIONS
    config = json.loads(options["--speculative-config"])
    assert set(config) <= VLLM_SPEC_KEYS and config["method"] in VLLM_SPEC_METHODS
    assert config == expected and options["--max-model-len"] == "4096"
    assert _reparsed(plan.render()) == plan.argv  # the printed text runs as this argv


@pytest.mark.parametrize("method", ["draft", "lookup", "history"])
def test_llama_server_gets_its_documented_flags(method):
    plan = llama_server(TARGET, DRAFT, method, 6, (2, 4), 2048)
    assert plan.argv[0] == "llama-server"
    options = _options(plan.argv, 1)
    assert set(options) <= LLAMA_SERVER_OPTIONS
    assert options["-m"] == str(TARGET.path) and options["-c"] == "2048" and options["--draft-max"] == "6"
    if method == "draft":
        assert options["-md"] == str(DRAFT.path) and "--spec-type" not in options
    else:
        assert "-md" not in options and options["--spec-type"] in LLAMA_SERVER_SPEC_TYPES
        assert options["--spec-type"] == {"lookup": "ngram-simple", "history": "ngram-mod"}[method]
        if method == "lookup":
            assert options["--spec-ngram-size-n"] == "4" and options["--spec-ngram-size-m"] == "6"
        else:  # ngram-mod drafts up to --draft-max; its docs advise a long n
            assert options["--spec-ngram-size-n"] == "24" and "--spec-ngram-size-m" not in options
    assert _reparsed(plan.render()) == plan.argv


def test_the_source_repository_comes_from_the_header_else_the_catalog_else_the_parent_with_a_warning():
    assert source_repo({"general.source.repo_url": "https://huggingface.co/org/name/"}) == (
        "org/name", "the GGUF header's general.source.repo_url")
    repo, why = source_repo({}, "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF")
    assert repo == "Qwen/Qwen2.5-Coder-1.5B-Instruct" and why.startswith("a guess")
    # base_model is the parent (for an Instruct GGUF, the pretrained model): only as a last resort, said so.
    header = {"general.base_model.0.repo_url": "https://huggingface.co/Qwen/Qwen2.5-Coder-1.5B"}
    assert source_repo(header, "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF")[0] == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    repo, why = source_repo(header)
    assert repo == "Qwen/Qwen2.5-Coder-1.5B" and "parent model" in why and "--target-repo" in why
    assert source_repo({"general.base_model.0.organization": "Meta Llama",
                        "general.base_model.0.name": "Llama-3.2-1B"})[0] == "Meta-Llama/Llama-3.2-1B"
    assert source_repo({"general.source.repo_url": "https://example.com/x"}, "org/plain-repo") == (None, "")


def test_vllm_without_a_known_source_repository_says_what_to_give():
    with pytest.raises(ConfigError, match=r"target\.gguf .*--target-repo ORG/NAME"):
        vllm(Served(TARGET.path), DRAFT, "draft", 4, (1, 5), 4096)
    with pytest.raises(ConfigError, match="needs a draft model"):
        vllm(TARGET, None, "draft", 4, (1, 5), 4096)
    with pytest.raises(ConfigError, match="no counterpart of the 'plain' method"):
        llama_server(TARGET, DRAFT, "plain", 4, (1, 5), 4096)


def test_the_best_bench_row_is_exported():
    rows = [{"method": "lookup", "k": 4, "temperature": 0.0, "speedup": s} for s in (1.4, 1.5, 1.6)]
    rows += [{"method": "draft", "k": 3, "temperature": 0.0, "speedup": s} for s in (1.1, 2.0, 1.2)]
    rows += [{"method": "auto", "k": 8, "temperature": 0.0, "speedup": 3.0},
             {"method": "lookup", "k": 2, "temperature": 0.7, "speedup": 3.0}]
    assert best_method({"rows": rows}) == ("lookup", 4, 1.5)
    with pytest.raises(ConfigError, match="no greedy draft, lookup or history rows"):
        best_method({"rows": rows[-2:]})
    for bad in ([], {"rows": [{"method": "draft"}]}, {"rows": "x"}, {"rows": [None]}):
        with pytest.raises(ConfigError, match="bench"):
            best_method(bad)


def test_export_command_on_files(tiny_dir: Path, tmp_path: Path):
    t, d = str(tiny_dir / "target.gguf"), str(tiny_dir / "draft.gguf")
    r = run_cli(["export", "-t", t, "-d", d, "--to", "llama-server", "--k", "3"])
    assert r.exit_code == 0, r.output
    argv = _reparsed(r.output)
    assert argv[:3] == ["llama-server", "-m", t] and argv[argv.index("-md") + 1] == d
    # The tiny models' headers name no source repository: vLLM needs one, and the message says how.
    r = run_cli(["export", "-t", t, "-d", d, "--to", "vllm"])
    assert r.exit_code == 1 and "--target-repo ORG/NAME" in r.output and "Traceback" not in r.output
    r = run_cli(["export", "-t", t, "--to", "vllm", "--target-repo", "org/tiny", "--port", "9000"])
    assert r.exit_code == 0, r.output
    argv = _reparsed(r.output)
    assert argv[:3] == ["vllm", "serve", "org/tiny"] and json.loads(argv[argv.index("--speculative-config") + 1])[
        "method"] == "ngram" and argv[argv.index("--port") + 1] == "9000"
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"rows": [{"method": "draft", "k": 2, "temperature": 0.0, "speedup": 1.7}]}))
    r = run_cli(["export", "-t", t, "-d", d, "--to", "llama-server", "--from-bench", str(bench)])
    assert r.exit_code == 0 and "draft with K=2 did best (1.70x" in r.output
    assert _reparsed(r.output)[_reparsed(r.output).index("--draft-max") + 1] == "2"
    bench.write_text("not json")
    r = run_cli(["export", "-t", t, "-d", d, "--to", "llama-server", "--from-bench", str(bench)])
    assert r.exit_code == 1 and "bench --json" in r.output and "Traceback" not in r.output


def test_export_writes_absolute_paths(tiny_dir: Path, monkeypatch):
    monkeypatch.chdir(tiny_dir)
    r = run_cli(["export", "-t", "target.gguf", "-d", "draft.gguf", "--to", "llama-server"])
    argv = _reparsed(r.output)
    assert argv[argv.index("-m") + 1] == str(tiny_dir / "target.gguf")
    assert argv[argv.index("-md") + 1] == str(tiny_dir / "draft.gguf")
