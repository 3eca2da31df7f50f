"""The `vllm serve` command `localspec export` writes is accepted by vLLM itself, up to loading a model.

Runs only where vLLM is installed; elsewhere it is skipped, saying so. This file, run as a script in a child
process, does with each exported argv what ``vllm serve`` does before it loads weights: it parses the argv with
the parser ``vllm serve`` builds (``vllm serve MODEL`` and all), runs the checks ``vllm serve`` runs on the
parsed options, turns them into ``AsyncEngineArgs`` and builds vLLM's whole engine configuration from them
(``create_engine_config``), on the way constructing the ``SpeculativeConfig`` of the ``--speculative-config``
JSON with the target's and the draft's model configurations. Nothing is downloaded: a Hugging Face cache of the
test's own gives both repositories a small ``config.json`` (no weights, no tokenizer) and the child runs offline.

Without a GPU the child asks vLLM for its CPU platform. Some vLLM releases' CPU platform refuses a machine
without Triton for CPUs only after the ``SpeculativeConfig`` is made; then that config is still checked and only
the whole-configuration test is skipped, saying why. Suffix decoding needs the ``arctic-inference`` package;
where it is missing, the check stops at vLLM's own error that asks for it, after vLLM has validated the JSON's
keys, method and values.

The child keeps vLLM's import-time settings (the offline switch, the cache folder, the platform) and its logging
out of the test process.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import pytest

from localspec.export.commands import Served, vllm

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed here (it serves on a GPU machine): the exported "
                                       "vllm command is checked against vLLM only where it is")

TARGET = Served(Path("/models/target.gguf"), "Qwen/Qwen2.5-Coder-1.5B-Instruct", "test")
DRAFT = Served(Path("/models/draft.gguf"), "Qwen/Qwen2.5-Coder-0.5B-Instruct", "test")
METHODS = ("draft", "lookup", "history")
K, NGRAM, CTX, PORT = 4, (1, 5), 4096, 8123
#: A small Qwen2 model's config.json: enough for vLLM to resolve the architecture and the context length.
QWEN2_CONFIG = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 1024,
                "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
                "rope_theta": 1000000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
_COMMIT = "0" * 40


def _plan(method: str) -> Any:
    return vllm(TARGET, DRAFT, method, K, NGRAM, CTX, port=PORT)


def _cache_entry(hub: Path, repo: str) -> None:
    """A Hugging Face cache entry for ``repo`` whose one snapshot holds only ``QWEN2_CONFIG``."""
    entry = hub / f"models--{repo.replace('/', '--')}"
    (entry / "refs").mkdir(parents=True, exist_ok=True)
    (entry / "refs" / "main").write_text(_COMMIT)
    snapshot = entry / "snapshots" / _COMMIT
    snapshot.mkdir(parents=True, exist_ok=True)
    (snapshot / "config.json").write_text(json.dumps(QWEN2_CONFIG))


def _first_attr(modules: tuple[str, ...], name: str) -> Any:
    """``name`` from the first of ``modules`` that has it (vLLM moves things between releases)."""
    for module in modules:
        try:
            found = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue
        if found is not None:
            return found
    raise LookupError(f"none of {', '.join(modules)} has {name}: this vLLM release moved it")


def _in_vllm(method: str) -> dict[str, Any]:
    """What vLLM makes of the exported command for ``method``, as plain JSON values (runs in the child)."""
    import vllm as vllm_package

    parser_class = _first_attr(("vllm.utils.argparse_utils", "vllm.utils"), "FlexibleArgumentParser")
    serve = _first_attr(("vllm.entrypoints.cli.serve",), "ServeSubcommand")()
    engine_args_class = _first_attr(("vllm.engine.arg_utils",), "AsyncEngineArgs")
    plan = _plan(method)
    parser = parser_class(prog="vllm")
    serve.subparser_init(parser.add_subparsers(dest="subparser")).set_defaults(dispatch_function=serve.cmd)
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            args = parser.parse_args(plan.argv[1:])  # as `vllm` parses its command line, "serve" first
    except SystemExit:  # argparse's way to refuse an option
        raise ValueError(f"vllm serve refuses the command: {said.getvalue().strip()}") from None
    serve.validate(args)
    if getattr(args, "model_tag", None):  # `vllm serve` takes the positional model over --model
        args.model = args.model_tag
    engine_args = engine_args_class.from_cli_args(args)
    seen: dict[str, Any] = {"vllm": vllm_package.__version__, "model": args.model, "host": args.host,
                            "port": args.port, "max_model_len": engine_args.max_model_len,
                            "speculative_config": dict(engine_args.speculative_config or {})}
    made: list[Any] = []  # the SpeculativeConfig vLLM makes, kept should a later step of the build refuse
    make = engine_args.create_speculative_config

    def keep(*given: Any, **named: Any) -> Any:
        made.append(make(*given, **named))
        return made[-1]

    engine_args.create_speculative_config = keep
    try:
        engine_args.create_engine_config()
    except ImportError as exc:  # an optional package the method needs (suffix decoding's arctic-inference)
        if made:
            raise
        return {**seen, "import_error": str(exc)}
    except Exception as exc:
        if not made:
            raise
        where = traceback.extract_tb(exc.__traceback__)[-1].filename
        seen["engine_error"] = f"{type(exc).__name__}: {exc}"
        seen["platform_refused"] = f"{os.sep}platforms{os.sep}" in where  # the platform's own hook, not the command
    spec = made[0]
    target, draft = spec.target_model_config, spec.draft_model_config
    return {**seen, "target": target.model, "target_max_model_len": target.max_model_len, "method": spec.method,
            "num_speculative_tokens": spec.num_speculative_tokens,
            "draft_model": spec.model if spec.method == "draft_model" else None,
            "draft_max_model_len": draft.max_model_len if draft is not None else None,
            "prompt_lookup": [spec.prompt_lookup_min, spec.prompt_lookup_max]}


def _child(out: Path, methods: list[str]) -> None:
    """Check ``methods`` in vLLM and write what it made of each to ``out``; run before anything imports vLLM."""
    import torch

    stand_in = not torch.cuda.is_available()
    if stand_in:
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # vLLM cannot infer a device without one
    seen: dict[str, Any] = {}
    for method in methods:
        try:
            seen[method] = {**_in_vllm(method), "cpu_stand_in": stand_in}
        except Exception as exc:  # vLLM refused it: its words go to the test
            seen[method] = {"error": f"{type(exc).__name__}: {exc}"}
    out.write_text(json.dumps(seen))


@pytest.fixture(scope="module")
def in_vllm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """What vLLM makes of each method's exported command, from one child process."""
    home = tmp_path_factory.mktemp("hf_home")
    for repo in (TARGET.repo, DRAFT.repo):
        assert repo is not None
        _cache_entry(home / "hub", repo)
    out = home / "in_vllm.json"
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_CACHE": str(home / "hub"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get(
               "PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, __file__, str(out), *METHODS], env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-6000:])
    return json.loads(out.read_text())


@pytest.mark.parametrize("method", METHODS)
def test_vllm_serve_parses_the_command(in_vllm: dict[str, dict[str, Any]], method: str):
    plan, seen = _plan(method), in_vllm[method]
    assert "error" not in seen, seen["error"]
    assert plan.argv[:3] == ["vllm", "serve", TARGET.repo]
    assert (seen["model"], seen["host"], seen["port"], seen["max_model_len"]) == (TARGET.repo, "0.0.0.0", PORT, CTX)
    assert seen["speculative_config"] == json.loads(plan.argv[plan.argv.index("--speculative-config") + 1])


@pytest.mark.parametrize("method", ["draft", "lookup"])
def test_vllm_makes_the_speculative_config_of_the_command(in_vllm: dict[str, dict[str, Any]], method: str):
    seen = in_vllm[method]
    assert "error" not in seen and "import_error" not in seen, seen
    hub_name = f"models--{str(TARGET.repo).replace('/', '--')}"  # the target's config.json came from the cache
    assert hub_name in seen["target"] and seen["target_max_model_len"] == CTX
    assert seen["method"] == {"draft": "draft_model", "lookup": "ngram"}[method]
    assert seen["num_speculative_tokens"] == K
    if method == "draft":
        assert seen["draft_model"] == DRAFT.repo and seen["draft_max_model_len"] <= CTX
    else:
        assert seen["prompt_lookup"] == list(NGRAM)


@pytest.mark.parametrize("method", ["draft", "lookup"])
def test_vllm_builds_its_whole_engine_configuration_from_the_command(in_vllm: dict[str, dict[str, Any]],
                                                                     method: str):
    seen = in_vllm[method]
    assert "error" not in seen and "import_error" not in seen, seen
    if seen.get("engine_error") and seen["cpu_stand_in"] and seen["platform_refused"]:
        pytest.skip(f"vLLM {seen['vllm']}'s CPU platform, standing in for a GPU, refuses this machine after the "
                    f"speculative config is made: {seen['engine_error']}")
    assert "engine_error" not in seen, seen["engine_error"]


def test_vllm_takes_suffix_decoding_or_asks_for_the_package_the_note_names(in_vllm: dict[str, dict[str, Any]]):
    seen, plan = in_vllm["history"], _plan("history")
    assert "error" not in seen, seen["error"]
    if "import_error" in seen:  # vLLM validated the keys and values, then asked for arctic-inference
        assert "arctic-inference" in seen["import_error"] and importlib.util.find_spec("arctic_inference") is None
        assert any("pip install arctic-inference" in note for note in plan.notes), plan.notes
    else:
        assert seen["method"] == "suffix" and seen["num_speculative_tokens"] == K


if __name__ == "__main__":
    _child(Path(sys.argv[1]), sys.argv[2:])
