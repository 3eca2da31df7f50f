"""Handing a pair to a serving engine: the command that runs the same speculation on vLLM or llama-server.

localspec's own server is for one user on one machine. Beyond that, a
serving engine batches many users on a GPU; this module writes the command
that runs the same target and drafting method there.

* llama.cpp's ``llama-server`` loads the same GGUF files. Its flags are those
  of the build the user has, read from its ``--help``
  (``localspec.export.llama_server_flags``); without one, those of the llama.cpp
  localspec runs. A draft model is ``-md`` with ``--spec-type draft-simple``
  and ``--spec-draft-n-max``; a target's MTP head is ``--spec-type
  draft-mtp``; lookup is ``--spec-type ngram-simple``; history is
  ``--spec-type ngram-mod`` (one n-gram pool shared by every request). The
  command also keeps what localspec's server does besides drafting: the
  context length, the prompt cache (``--cache-ram``, and ``--ctx-checkpoints``
  for a model with a recurrent state), chat templates with tools
  (``--jinja``), the API key (``--api-key-file``), host and port. Every
  variant is started, on the tiny test models and on the Qwen2.5-Coder pair,
  by ``tests/export/test_export_run.py`` on a CPU-only llama-server built from the
  pinned source (``scripts/build_llama_server.sh``), and answers the
  ``openai`` client with drafted and accepted tokens in its timings.
* vLLM: ``vllm serve MODEL --speculative-config JSON`` with ``method`` one of
  ``draft_model`` (a draft model), ``ngram`` (prompt lookup, with
  ``prompt_lookup_min``/``prompt_lookup_max``) or ``suffix`` (suffix decoding,
  which also matches earlier requests' outputs: the counterpart of the history
  drafter), and ``num_speculative_tokens``. vLLM serves the original
  (unquantized) Hugging Face repositories best, so the GGUF's source
  repository is named when its header or the catalog says which it is. Where
  vLLM is installed, ``tests/export/test_export_vllm.py`` has vLLM parse each command
  as ``vllm serve`` does and build its engine configuration from it, the
  ``SpeculativeConfig`` included, each repository given only a
  ``config.json`` (on vLLM's CPU platform: with vLLM 0.33 the whole engine
  configuration, with 0.34 up to the ``SpeculativeConfig``, as its CPU
  platform then asks for Triton for CPUs). No command has been served by
  vLLM, which loads the weights only then. Suffix decoding needs the
  ``arctic-inference`` package besides vLLM.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..errors import ConfigError
from ..methods import DRAFT, HISTORY, LOOKUP, MTP
from .llama_server_flags import PINNED_BUILD, ServerFlags, pinned

ENGINES = ("vllm", "llama-server")
#: localspec's drafting methods that an engine can run, and what each engine calls them.
VLLM_METHODS = {DRAFT.name: "draft_model", LOOKUP.name: "ngram", HISTORY.name: "suffix"}
LLAMA_SERVER_SPEC_TYPES = {DRAFT.name: "draft-simple", MTP.name: "draft-mtp", LOOKUP.name: "ngram-simple",
                           HISTORY.name: "ngram-mod"}
NGRAM_MOD_N = 24  # llama.cpp's docs: small n are not recommended for ngram-mod
CACHE_RAM_MIB = 8192  # llama-server's prompt cache, in MiB: the pinned build's default, written out
CTX_CHECKPOINTS = 32  # snapshots of a recurrent state per slot: the pinned build's default, written out

_HF_URL = re.compile(r"^https?://(?:www\.)?huggingface\.co/([\w.-]+/[\w.-]+?)/?$")
_REPO = re.compile(r"^[\w.-]+/[\w.-]+$")


@dataclass(frozen=True)
class Served:
    """One model as an engine will load it.

    Attributes:
        path: the GGUF on this machine.
        repo: the Hugging Face repository it was converted from, if known.
        repo_from: where ``repo`` was learnt (shown to the user).
        mtp_head: its GGUF has next-n (MTP) layers.
        recurrent: it keeps a recurrent state (a state-space or hybrid model), which engines cache by snapshots.
    """

    path: Path
    repo: Optional[str] = None
    repo_from: str = ""
    mtp_head: bool = False
    recurrent: bool = False


@dataclass
class Export:
    """A command for one engine, and what the user should know about it."""

    engine: str
    method: str
    k: int
    argv: list[str]
    notes: list[str] = field(default_factory=list)

    def render(self) -> str:
        """The command as shell text, one option per line, with the notes as comments above it."""
        lines = [f"# {note}" for note in self.notes]
        words = [shlex.quote(w) for w in self.argv]
        first = next((i for i, w in enumerate(words) if w.startswith("-")), len(words))
        parts = [" ".join(words[:first])]  # the program and its subcommand and model
        for word in words[first:]:  # then each option with its value, if it takes one
            if word.startswith("-") or len(parts) == 1:
                parts.append(word)
            else:
                parts[-1] += " " + word
        return "\n".join([*lines, " \\\n  ".join(parts)])


def _repo_of(value: Any) -> Optional[str]:
    """``org/name`` from a Hugging Face URL or a bare ``org/name``; None for anything else."""
    if not isinstance(value, str):
        return None
    value = value.strip()
    m = _HF_URL.match(value)
    if m:
        return m.group(1)
    return value if _REPO.match(value) else None


def source_repo(metadata: Mapping[str, Any], hub_repo: Optional[str] = None) -> tuple[Optional[str], str]:
    """The Hugging Face repository a GGUF was converted from, and how that is known.

    In order: the header's ``general.source.repo_url`` or
    ``general.source.huggingface.repository`` (where the converted weights came
    from); the Hub repository the catalog pulls the file from, less its
    ``-GGUF`` suffix (the convention of GGUF repositories, so labelled a
    guess); and last the header's ``general.base_model.0.*``, which by the GGUF
    specification is the *parent* model: for a fine-tune such as an Instruct
    model, the model it was tuned from, so the note says so.

    Args:
        metadata: the GGUF header's key/value pairs.
        hub_repo: the repository the catalog pulled the file from, if any.
    """
    for key in ("general.source.repo_url", "general.source.huggingface.repository"):
        repo = _repo_of(metadata.get(key))
        if repo:
            return repo, f"the GGUF header's {key}"
    if hub_repo and re.search(r"[-_]gguf$", hub_repo, re.IGNORECASE):
        return hub_repo[: -len("-GGUF")], f"a guess: {hub_repo} less its -GGUF suffix"
    parent = _repo_of(metadata.get("general.base_model.0.repo_url"))
    org, name = metadata.get("general.base_model.0.organization"), metadata.get("general.base_model.0.name")
    if not parent and isinstance(org, str) and isinstance(name, str):
        parent = _repo_of(f"{org.replace(' ', '-')}/{name.replace(' ', '-')}")
    if parent:
        return parent, ("the GGUF header's general.base_model.0, its parent model: if this GGUF is a fine-tune "
                        "of it (an Instruct model), give the fine-tune's repository with --target-repo/--draft-repo")
    return None, ""


def vllm(target: Served, draft: Optional[Served], method: str, k: int, ngram: tuple[int, int], ctx: int,
         host: str = "0.0.0.0", port: int = 8000) -> Export:
    """``vllm serve`` with the same target and drafting method.

    Raises:
        ConfigError: the method has no vLLM counterpart, or a model's source repository is unknown.
    """
    if method not in VLLM_METHODS:
        raise ConfigError(f"vLLM has no counterpart of the {method!r} method; export draft, lookup or history.")
    notes: list[str] = []
    model = _vllm_model(target, "target", notes)
    config: dict[str, Any] = {"method": VLLM_METHODS[method], "num_speculative_tokens": k}
    if method == DRAFT.name:
        if draft is None:
            raise ConfigError("The draft method needs a draft model; give --draft or export lookup.")
        config["model"] = _vllm_model(draft, "draft", notes)
    elif method == LOOKUP.name:
        config["prompt_lookup_min"], config["prompt_lookup_max"] = ngram
    else:
        notes.append("suffix decoding also matches earlier requests' outputs, as localspec's history does; "
                     "vLLM needs the arctic-inference package for it (`pip install arctic-inference`)")
    argv = ["vllm", "serve", model, "--host", host, "--port", str(port), "--max-model-len", str(ctx),
            "--speculative-config", json.dumps(config, separators=(",", ":"))]
    return Export("vllm", method, k, argv, notes)


def _vllm_model(model: Served, role: str, notes: list[str]) -> str:
    if model.repo:
        notes.append(f"{role}: {model.path.name} was made from {model.repo} (known from {model.repo_from})")
        return model.repo
    raise ConfigError(f"Cannot tell which Hugging Face repository {model.path} was converted from (its header "
                      f"names none); give it with --{role}-repo ORG/NAME, or export to llama-server, which "
                      "loads the GGUF itself.")


def llama_server(target: Served, draft: Optional[Served], method: str, k: int, ngram: tuple[int, int], ctx: int,
                 host: str = "127.0.0.1", port: int = 8080, gpu_layers: int = 99,
                 flags: Optional[ServerFlags] = None, api_key_file: Optional[Path] = None) -> Export:
    """``llama-server`` with the same GGUF files and drafting method, in the flags of one build.

    Args:
        target: the target model.
        draft: the draft model (for ``draft``).
        method: ``draft``, ``lookup``, ``history`` or ``mtp``.
        k: tokens per draft.
        ngram: lookup's (min, max) n-gram lengths; llama-server's ngram-simple takes the max.
        ctx: the context length.
        host: the address to listen on.
        port: the port.
        gpu_layers: layers of each model to put on the GPU.
        flags: what the build accepts (``llama_server_flags.find``); the pinned build's if None.
        api_key_file: a file holding the API key the server will demand, if any.

    Raises:
        ConfigError: the method has no llama-server counterpart, it needs a draft or MTP head that is
            missing, or the build is too old for it.
    """
    flags = flags or pinned()
    notes = [f"flags of llama-server {flags.build}, from {flags.source}"]
    argv = ["llama-server", *_model_flags(flags, target, ctx, host, port, gpu_layers)]
    argv += _speculation(flags, target, draft, method, k, ngram, gpu_layers, notes)
    argv += _serving(flags, target, api_key_file)
    return Export("llama-server", method, k, argv, notes)


_NEWER = f"use a newer llama-server, such as llama.cpp's {PINNED_BUILD}"


def _need(flags: ServerFlags, what: str, *names: str) -> str:
    """The first of ``names`` the build accepts, or ConfigError naming the build that is needed."""
    name = flags.first(*names)
    if name is None:
        raise ConfigError(f"{flags.source} lists no {names[0]} option, which {what} needs; {_NEWER}.")
    return name


def _spec_type(flags: ServerFlags, name: str) -> list[str]:
    """``--spec-type NAME``, or ConfigError when the build does not know that type."""
    if not flags.spec_types:
        raise ConfigError(f"{flags.source} lists no --spec-type option, which {name} needs; {_NEWER}.")
    if name not in flags.spec_types:
        raise ConfigError(f"{flags.source} does not list {name} among its --spec-type values; {_NEWER}.")
    return ["--spec-type", name]


def _model_flags(flags: ServerFlags, target: Served, ctx: int, host: str, port: int, gpu_layers: int) -> list[str]:
    argv = [_need(flags, "the target", "-m", "--model"), str(target.path),
            _need(flags, "the context length", "-c", "--ctx-size"), str(ctx),
            _need(flags, "the address", "--host"), host, _need(flags, "the port", "--port"), str(port)]
    ngl = flags.first("-ngl", "--gpu-layers", "--n-gpu-layers")
    return argv + ([ngl, str(gpu_layers)] if ngl else [])


def _speculation(flags: ServerFlags, target: Served, draft: Optional[Served], method: str, k: int,
                 ngram: tuple[int, int], gpu_layers: int, notes: list[str]) -> list[str]:
    """The flags of one drafting method, with ``k`` tokens per draft."""
    if method == DRAFT.name:
        if draft is None:
            raise ConfigError("The draft method needs a draft model; give --draft or export lookup.")
        argv = [_need(flags, "a draft model", "-md", "--spec-draft-model", "--model-draft"), str(draft.path)]
        argv += _spec_type(flags, LLAMA_SERVER_SPEC_TYPES[DRAFT.name]) if flags.spec_types else []
        ngld = flags.first("-ngld", "--spec-draft-ngl", "--gpu-layers-draft")
        return argv + ([ngld, str(gpu_layers)] if ngld else []) + _draft_lengths(flags, k)
    if method == MTP.name:
        if not target.mtp_head:
            raise ConfigError(f"{target.path.name} has no MTP head (no next-n layers in its GGUF); export draft, "
                              "lookup or history.")
        return _spec_type(flags, LLAMA_SERVER_SPEC_TYPES[MTP.name]) + _draft_lengths(flags, k)
    if method == LOOKUP.name:
        size_n = min(ngram[1], k)  # ngram-simple drafts nothing shorter than its n-gram (common/ngram-map.cpp)
        if size_n < ngram[1]:
            notes.append(f"lookup matches {size_n}-grams, not {ngram[1]}: llama-server's ngram-simple drafts no "
                         "fewer tokens than it matches")
        return _spec_type(flags, LLAMA_SERVER_SPEC_TYPES[LOOKUP.name]) + [
            _need(flags, "lookup", "--spec-ngram-simple-size-n", "--spec-ngram-size-n"), str(size_n),
            _need(flags, "lookup", "--spec-ngram-simple-size-m", "--spec-ngram-size-m"), str(k)]
    if method == HISTORY.name:
        notes.append("ngram-mod keeps one n-gram pool for every request, so earlier replies feed later drafts, "
                     f"as localspec's history does; it matches {NGRAM_MOD_N} tokens, as llama.cpp advises")
        return _spec_type(flags, LLAMA_SERVER_SPEC_TYPES[HISTORY.name]) + [
            _need(flags, "history", "--spec-ngram-mod-n-match", "--spec-ngram-size-n"), str(NGRAM_MOD_N),
            _need(flags, "history", "--spec-ngram-mod-n-max", "--draft-max"), str(k),
            _need(flags, "history", "--spec-ngram-mod-n-min", "--draft-min"), "1"]
    raise ConfigError(f"llama-server has no counterpart of the {method!r} method; export draft, lookup, history "
                      "or mtp.")


def _draft_lengths(flags: ServerFlags, k: int) -> list[str]:
    """Draft up to ``k`` tokens, and keep a draft of any length (localspec's own rule)."""
    return [_need(flags, "a draft length", "--spec-draft-n-max", "--draft-max"), str(k),
            _need(flags, "a draft length", "--spec-draft-n-min", "--draft-min"), "0"]


def _serving(flags: ServerFlags, target: Served, api_key_file: Optional[Path]) -> list[str]:
    """What localspec's own server does besides drafting: tool calls, the prompt cache, the API key."""
    argv = ["--jinja"] if "--jinja" in flags.options else []  # chat templates with tools; older builds lack it
    cache_ram = flags.first("--cache-ram", "-cram")
    argv += [cache_ram, str(CACHE_RAM_MIB)] if cache_ram else []
    checkpoints = flags.first("--ctx-checkpoints", "-ctxcp")
    if target.recurrent and checkpoints:  # a recurrent state is cached by snapshots, not cut back
        argv += [checkpoints, str(CTX_CHECKPOINTS)]
    if api_key_file is not None:
        argv += [_need(flags, "an API key file", "--api-key-file"), str(api_key_file)]
    return argv


def best_method(bench: Any, source: str = "the bench file",
                methods: tuple[str, ...] = (DRAFT.name, LOOKUP.name, HISTORY.name)) -> tuple[str, int, float]:
    """The drafting method and K with the best median speedup over all prompts of a ``localspec bench --json``.

    Plain decoding, auto and llama-cpp-python's rows are left out: the engine
    runs one fixed method.

    Args:
        bench: the parsed file.
        source: its name, for messages.
        methods: the methods the engine can run.

    Raises:
        ConfigError: not such a file, or it has no drafting rows.
    """
    rows = bench.get("rows") if isinstance(bench, dict) else None
    if not isinstance(rows, list):
        raise ConfigError(f"{source} is not a `localspec bench --json` file (it has no list of rows).")
    scores: dict[tuple[str, int], list[float]] = {}
    for row in rows:
        try:
            if row["method"] in methods and float(row.get("temperature", 0)) == 0:
                scores.setdefault((str(row["method"]), int(row["k"])), []).append(float(row["speedup"]))
        except (TypeError, KeyError, ValueError, AttributeError):
            raise ConfigError(f"{source} has a row that is not a bench row ({str(row)[:80]}); write it again "
                              "with `localspec bench --json`.") from None
    if not scores:
        names = ", ".join(methods[:-1]) + (" or " if len(methods) > 1 else "") + methods[-1]
        raise ConfigError(f"{source} has no greedy {names} rows to choose from.")
    (method, k), speedups = max(scores.items(), key=lambda kv: sorted(kv[1])[len(kv[1]) // 2])
    return method, k, sorted(speedups)[len(speedups) // 2]


def load_bench(path: Path, methods: tuple[str, ...] = (DRAFT.name, LOOKUP.name, HISTORY.name)
               ) -> tuple[str, int, float]:
    """``best_method`` of a bench JSON file, among ``methods``.

    Raises:
        ConfigError: the file cannot be read, is not JSON, or is not a bench file.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"Cannot read {path} as a `localspec bench --json` file ({exc}).") from None
    return best_method(data, str(path), methods)


def served(path: Path, repo: Optional[str], hub_repo: Optional[str]) -> Served:
    """One model as an engine will load it: its absolute path, and its source repository as well as it is known.

    Args:
        path: the GGUF.
        repo: the repository the user gave (wins).
        hub_repo: the repository the catalog pulls the file from, if any.
    """
    from ..runtime.gguf_metadata import read_local

    metadata = read_local(path).metadata
    arch = str(metadata.get("general.architecture", ""))
    mtp_head = bool(metadata.get(f"{arch}.nextn_predict_layers"))
    recurrent = any(key.startswith((f"{arch}.ssm.", f"{arch}.wkv.")) for key in metadata)
    if repo:
        return Served(path.resolve(), repo, "the command line", mtp_head, recurrent)
    found, why = source_repo(metadata, hub_repo)
    return Served(path.resolve(), found, why, mtp_head, recurrent)


def plan(engine: str, target: Served, draft: Optional[Served], method: str, k: int, ngram: tuple[int, int],
         ctx: int, port: Optional[int] = None, host: Optional[str] = None,
         flags: Optional[ServerFlags] = None, api_key_file: Optional[Path] = None) -> Export:
    """The command for ``engine`` (one of ``ENGINES``).

    Args:
        engine: ``vllm`` or ``llama-server``.
        target: the target model.
        draft: the draft model, if any.
        method: the drafting method.
        k: tokens per draft.
        ngram: lookup's (min, max) n-gram lengths.
        ctx: the context length.
        port: the port; the engine's own default if None.
        host: the address to listen on; the engine's own default if None.
        flags: the llama-server build's options (``llama_server_flags.find``); the pinned build's if None.
        api_key_file: a file holding the API key llama-server will demand.

    Raises:
        ConfigError: an unknown engine, or what ``vllm`` and ``llama_server`` raise.
    """
    if engine not in ENGINES:
        raise ConfigError(f"Unknown engine {engine!r}; export to one of {', '.join(ENGINES)}.")
    if engine == "vllm":
        return vllm(target, draft, method, k, ngram, ctx, host=host or "0.0.0.0", port=port or 8000)
    return llama_server(target, draft, method, k, ngram, ctx, host=host or "127.0.0.1", port=port or 8080,
                        flags=flags, api_key_file=api_key_file)
