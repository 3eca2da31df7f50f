"""The `vllm serve` command `localspec export` writes passes vLLM's own argument parser and SpeculativeConfig.

Runs only where vLLM is installed (a GPU machine); elsewhere it is skipped, saying so. It parses the exported
options with the parser ``vllm serve`` itself builds and checks the ``--speculative-config`` keys and method
against vLLM's ``SpeculativeConfig``; it does not load a model.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import typing
from pathlib import Path
from typing import Any

import pytest

from localspec.export import Served, vllm

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed here (it serves on a GPU machine): the exported "
                                       "vllm command is checked against vLLM's parser only where it is")

TARGET = Served(Path("/models/target.gguf"), "Qwen/Qwen2.5-Coder-1.5B-Instruct", "test")
DRAFT = Served(Path("/models/draft.gguf"), "Qwen/Qwen2.5-Coder-0.5B-Instruct", "test")


def _first_attr(modules: tuple[str, ...], name: str) -> Any:
    """``name`` from the first of ``modules`` that has it (vLLM moves things between releases)."""
    for module in modules:
        try:
            found = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue
        if found is not None:
            return found
    pytest.fail(f"none of {', '.join(modules)} has {name}: this vLLM release moved it")


def _serve_parser() -> Any:
    make_arg_parser = _first_attr(("vllm.entrypoints.openai.cli_args",), "make_arg_parser")
    flexible = _first_attr(("vllm.utils.argparse_utils", "vllm.utils"), "FlexibleArgumentParser")
    return make_arg_parser(flexible())


@pytest.mark.parametrize("method", ["draft", "lookup", "history"])
def test_vllms_parser_and_speculative_config_accept_the_command(method: str):
    plan = vllm(TARGET, DRAFT, method, 4, (1, 5), 4096, port=8123)
    assert plan.argv[:2] == ["vllm", "serve"]
    args = _serve_parser().parse_args(["--model", plan.argv[2], *plan.argv[3:]])
    assert args.model == TARGET.repo and args.port == 8123 and args.max_model_len == 4096
    given = args.speculative_config
    config = json.loads(given) if isinstance(given, str) else dict(given)
    assert config == json.loads(plan.argv[plan.argv.index("--speculative-config") + 1])
    spec_class = _first_attr(("vllm.config.speculative", "vllm.config"), "SpeculativeConfig")
    fields = {f.name for f in dataclasses.fields(spec_class)}
    assert set(config) <= fields, sorted(set(config) - fields)
    methods = _first_attr(("vllm.config.speculative", "vllm.config"), "SpeculativeMethod")
    allowed = {a for arg in typing.get_args(methods) for a in (typing.get_args(arg) or (arg,))}
    assert config["method"] in allowed, sorted(map(str, allowed))
