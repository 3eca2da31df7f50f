"""`localspec export`: the command for a serving engine uses only the engine's documented flags and keys.

Sources of the documented sets below (read 2026-12-01):

* vLLM: ``docs/features/speculative_decoding/draft_model.md`` (``"method": "draft_model"``, ``"model"``,
  ``"num_speculative_tokens"``), ``n_gram.md`` (``"method": "ngram"``, ``"prompt_lookup_max"``),
  ``suffix.md`` (``"method": "suffix"``), and ``vllm/config/speculative.py`` (``SpeculativeConfig``:
  ``prompt_lookup_min``/``prompt_lookup_max``, ``SpeculativeMethod``); ``vllm serve`` options
  ``--host``, ``--port``, ``--max-model-len`` (``docs/cli``).
* llama.cpp: what a llama-server build accepts is read from its ``--help``
  (``localspec.export.llama_server_flags``); the pinned build's list is checked against a real build, and every
  exported command is started on one, in ``test_export_run.py``. Here: the flags come from the build's list,
  a removed flag is never written, and an older build gets its own names or one sentence saying what it lacks.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from clirun import run_cli

from localspec.errors import ConfigError
from localspec.export.commands import Served, best_method, llama_server, source_repo, vllm
from localspec.export.llama_server_flags import ServerFlags, parse_help, pinned

VLLM_SERVE_OPTIONS = {"--host", "--port", "--max-model-len", "--speculative-config"}
VLLM_SPEC_KEYS = {"method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"}
VLLM_SPEC_METHODS = {"ngram", "draft_model", "suffix"}
LLAMA_SERVER_SPEC_TYPES = {"none", "ngram-cache", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod"}

TARGET = Served(Path("/models/target.gguf"), "Qwen/Qwen2.5-Coder-1.5B-Instruct", "test")
DRAFT = Served(Path("/models/draft.gguf"), "Qwen/Qwen2.5-Coder-0.5B-Instruct", "test")


def _options(argv: list[str], start: int) -> dict[str, str]:
    """Options and their values ("" for a switch); an option is given once."""
    options: dict[str, str] = {}
    for word in argv[start:]:
        if word.startswith("-"):
            assert word not in options, argv
            options[word] = ""
        else:
            last = list(options)[-1]
            assert options[last] == "", argv  # one value per option
            options[last] = word
    return options


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
def test_llama_server_gets_the_pinned_builds_flags(method):
    plan = llama_server(TARGET, DRAFT, method, 6, (2, 4), 2048)
    assert plan.argv[0] == "llama-server"
    options = _options(plan.argv, 1)
    assert set(options) <= pinned().options
    assert not {"--draft-max", "--draft-min", "--spec-ngram-size-n", "--spec-ngram-size-m"} & set(options)
    assert options["-m"] == str(TARGET.path) and options["-c"] == "2048" and "--jinja" in options
    assert options["--cache-ram"] == "8192" and "--ctx-checkpoints" not in options  # the target has no state
    if method == "draft":
        assert options["-md"] == str(DRAFT.path) and options["--spec-type"] == "draft-simple"
        assert options["--spec-draft-n-max"] == "6" and options["--spec-draft-n-min"] == "0"
    else:
        assert "-md" not in options and options["--spec-type"] in LLAMA_SERVER_SPEC_TYPES
        assert options["--spec-type"] == {"lookup": "ngram-simple", "history": "ngram-mod"}[method]
        if method == "lookup":
            assert options["--spec-ngram-simple-size-n"] == "4" and options["--spec-ngram-simple-size-m"] == "6"
        else:  # ngram-mod drafts up to n-max; its docs advise a long match
            assert options["--spec-ngram-mod-n-match"] == "24" and options["--spec-ngram-mod-n-max"] == "6"
    assert "ggml-org/llama.cpp@0c1e57098" in plan.notes[0] and "llama-cpp-python 0.3.36" in plan.notes[0]
    assert _reparsed(plan.render()) == plan.argv


def test_lookup_never_matches_longer_than_it_drafts():
    """ngram-simple drops a draft shorter than its n-gram, so n-grams of 5 with K=3 would never draft."""
    plan = llama_server(TARGET, None, "lookup", 3, (1, 5), 2048)
    options = _options(plan.argv, 1)
    assert options["--spec-ngram-simple-size-n"] == "3" and options["--spec-ngram-simple-size-m"] == "3"
    assert any("matches 3-grams, not 5" in note for note in plan.notes)


def test_mtp_and_a_recurrent_state_and_the_api_key_are_carried_over(tmp_path: Path):
    head = Served(TARGET.path, mtp_head=True, recurrent=True)
    key = tmp_path / "key"
    options = _options(llama_server(head, None, "mtp", 2, (1, 5), 1024, host="0.0.0.0", api_key_file=key).argv, 1)
    assert options["--spec-type"] == "draft-mtp" and options["--spec-draft-n-max"] == "2" and "-md" not in options
    assert options["--ctx-checkpoints"] == "32" and options["--api-key-file"] == str(key)
    assert options["--host"] == "0.0.0.0"
    with pytest.raises(ConfigError, match=r"target\.gguf has no MTP head"):
        llama_server(TARGET, None, "mtp", 2, (1, 5), 1024)


# Two entries in llama.cpp's --help layout: flags and value hint, then the description at column 40.
NEW_HELP = """----- common params -----

-h,    --help, --usage                  print usage and exit
-m,    --model FNAME                    model path to load
-c,    --ctx-size N                     size of the prompt context (default: 4096)
--host HOST                             ip address to listen (default: 127.0.0.1)
--port PORT                             port to listen (default: 8080)
--spec-draft-model, -md, --model-draft FNAME
                                        draft model for speculative decoding (default: unused)
--spec-type none,draft-simple,ngram-simple
                                        comma-separated list of types of speculative decoding to use
--spec-draft-n-max N                    number of tokens to draft for speculative decoding (default: 3)
--spec-draft-n-min N                    minimum number of draft tokens
--draft, --draft-n, --draft-max N       the argument has been removed. use --spec-draft-n-max or
                                        --spec-ngram-mod-n-max
--draft-min, --draft-n-min N            the argument has been removed. use --spec-draft-n-min or
                                        --spec-ngram-mod-n-min
--spec-ngram-simple-size-n N            ngram size N for ngram-simple speculative decoding
--spec-ngram-simple-size-m N            ngram size M for ngram-simple speculative decoding
"""
OLD_HELP = """-m,    --model FNAME                    model path
-c,    --ctx-size N                     size of the prompt context
--host HOST                             ip address to listen
--port PORT                             port to listen
-md,   --model-draft FNAME              draft model for speculative decoding (default: unused)
--draft-max, --draft, --draft-n N       number of tokens to draft for speculative decoding (default: 16)
--draft-min, --draft-n-min N            minimum number of draft tokens to use for speculative decoding
"""


def test_the_help_text_gives_the_options_and_leaves_out_removed_ones():
    flags = parse_help(NEW_HELP, "new", "new --help")
    assert {"-m", "--model", "-md", "--spec-draft-model", "--model-draft", "--host", "--spec-draft-n-max"} <= (
        flags.options)
    assert not {"--draft", "--draft-max", "--draft-min", "-----", "common"} & flags.options
    assert flags.spec_types == {"none", "draft-simple", "ngram-simple"}
    bracketed = parse_help("--spec-type [none|ngram-cache|ngram-simple]\n    types\n", "b", "b")
    assert bracketed.spec_types == {"none", "ngram-cache", "ngram-simple"}


def test_each_build_gets_its_own_flag_names_or_one_sentence_naming_the_build_needed():
    new = _options(llama_server(TARGET, DRAFT, "draft", 5, (1, 5), 2048,
                                flags=parse_help(NEW_HELP, "new", "new --help")).argv, 1)
    assert new["--spec-draft-n-max"] == "5" and "--draft-max" not in new and "--jinja" not in new
    old_flags = parse_help(OLD_HELP, "old", "old --help")
    old = _options(llama_server(TARGET, DRAFT, "draft", 5, (1, 5), 2048, flags=old_flags).argv, 1)
    assert old["--draft-max"] == "5" and old["--draft-min"] == "0" and "--spec-type" not in old
    assert "--cache-ram" not in old  # not in that build: left out, not guessed
    for method in ("lookup", "history", "mtp"):
        with pytest.raises(ConfigError, match=r"^old --help lists no --spec-type option, which \S+ needs; use a "
                                              r"newer llama-server, such as llama\.cpp's 0\.5\.0-dev \(commit "):
            llama_server(Served(TARGET.path, mtp_head=True), DRAFT, method, 5, (1, 5), 2048, flags=old_flags)
    new_flags = parse_help(NEW_HELP, "new", "new --help")
    with pytest.raises(ConfigError, match=r"^new --help does not list ngram-mod among its --spec-type values; "):
        llama_server(TARGET, DRAFT, "history", 5, (1, 5), 2048, flags=new_flags)
    with pytest.raises(ConfigError, match=r"^new --help lists no --spec-ngram-mod-n-match option, which history "):
        llama_server(TARGET, DRAFT, "history", 5, (1, 5), 2048,
                     flags=ServerFlags(new_flags.options, frozenset({"ngram-mod"}), "new", "new --help"))


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
    assert _reparsed(r.output)[_reparsed(r.output).index("--spec-draft-n-max") + 1] == "2"
    bench.write_text("not json")
    r = run_cli(["export", "-t", t, "-d", d, "--to", "llama-server", "--from-bench", str(bench)])
    assert r.exit_code == 1 and "bench --json" in r.output and "Traceback" not in r.output


def test_export_writes_absolute_paths(tiny_dir: Path, monkeypatch):
    monkeypatch.chdir(tiny_dir)
    r = run_cli(["export", "-t", "target.gguf", "-d", "draft.gguf", "--to", "llama-server"])
    argv = _reparsed(r.output)
    assert argv[argv.index("-m") + 1] == str(tiny_dir / "target.gguf")
    assert argv[argv.index("-md") + 1] == str(tiny_dir / "draft.gguf")


def test_a_binary_that_is_not_llama_server_and_a_key_file_for_vllm_get_one_sentence(tiny_dir: Path, tmp_path: Path):
    t = str(tiny_dir / "target.gguf")
    r = run_cli(["export", "-t", t, "--to", "llama-server", "--llama-server", "/bin/true"])
    assert r.exit_code == 1 and "/bin/true --help lists no -m/--model option" in r.output
    assert "Traceback" not in r.output
    key = tmp_path / "key"
    key.write_text("k")
    r = run_cli(["export", "-t", t, "--to", "vllm", "--target-repo", "org/tiny", "--api-key-file", str(key)])
    assert r.exit_code != 0 and "VLLM_API_KEY" in r.output
