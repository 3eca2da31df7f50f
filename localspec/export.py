"""Handing a pair to a serving engine: the command that runs the same speculation on vLLM or llama-server.

localspec's own server is for one user on one machine. Beyond that, a
serving engine batches many users on a GPU; this module writes the command
that runs the same target and drafting method there. Only documented flags
and config keys are written:

* vLLM: ``vllm serve MODEL --speculative-config JSON`` with ``method`` one of
  ``draft_model`` (a draft model), ``ngram`` (prompt lookup, with
  ``prompt_lookup_min``/``prompt_lookup_max``) or ``suffix`` (suffix decoding,
  which also matches earlier requests' outputs: the counterpart of the history
  drafter), and ``num_speculative_tokens``. vLLM serves the original
  (unquantized) Hugging Face repositories best, so the GGUF's source
  repository is named when its header or the catalog says which it is.
* llama.cpp's ``llama-server``: ``-m``/``-md`` with ``--draft-max`` for a
  draft model; ``--spec-type ngram-simple`` with ``--spec-ngram-size-n``/``-m``
  for lookup; ``--spec-type ngram-mod`` (one n-gram pool shared by every
  request) for history. It loads the same GGUF files.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .errors import ConfigError
from .methods import DRAFT, HISTORY, LOOKUP

ENGINES = ("vllm", "llama-server")
#: localspec's drafting methods that an engine can run, and what each engine calls them.
VLLM_METHODS = {DRAFT.name: "draft_model", LOOKUP.name: "ngram", HISTORY.name: "suffix"}
LLAMA_SERVER_SPEC_TYPES = {LOOKUP.name: "ngram-simple", HISTORY.name: "ngram-mod"}
NGRAM_MOD_N = 24  # llama.cpp's docs: small n are not recommended for ngram-mod

_HF_URL = re.compile(r"^https?://(?:www\.)?huggingface\.co/([\w.-]+/[\w.-]+?)/?$")
_REPO = re.compile(r"^[\w.-]+/[\w.-]+$")


@dataclass(frozen=True)
class Served:
    """One model as an engine will load it.

    Attributes:
        path: the GGUF on this machine.
        repo: the Hugging Face repository it was converted from, if known.
        repo_from: where ``repo`` was learnt (shown to the user).
    """

    path: Path
    repo: Optional[str] = None
    repo_from: str = ""


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
        for i in range(first, len(words), 2):  # then each option with its value
            parts.append(" ".join(words[i : i + 2]))
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
                     "on vLLM's V1 model runner it needs `pip install arctic-inference`")
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
                 host: str = "127.0.0.1", port: int = 8080, gpu_layers: int = 99) -> Export:
    """``llama-server`` with the same GGUF files and drafting method.

    Raises:
        ConfigError: the method has no llama-server counterpart, or it needs a draft that is missing.
    """
    argv = ["llama-server", "-m", str(target.path), "-c", str(ctx), "--host", host, "--port", str(port),
            "-ngl", str(gpu_layers)]
    notes: list[str] = []
    if method == DRAFT.name:
        if draft is None:
            raise ConfigError("The draft method needs a draft model; give --draft or export lookup.")
        argv += ["-md", str(draft.path), "-ngld", str(gpu_layers), "--draft-max", str(k), "--draft-min", "0"]
    elif method == LOOKUP.name:
        argv += ["--spec-type", LLAMA_SERVER_SPEC_TYPES[method], "--spec-ngram-size-n", str(ngram[1]),
                 "--spec-ngram-size-m", str(k), "--draft-max", str(k)]
    elif method == HISTORY.name:
        argv += ["--spec-type", LLAMA_SERVER_SPEC_TYPES[method], "--spec-ngram-size-n", str(NGRAM_MOD_N),
                 "--draft-max", str(k)]
        notes.append("ngram-mod keeps one n-gram pool for every request, so earlier replies feed later drafts, "
                     f"as localspec's history does; n = {NGRAM_MOD_N} as llama.cpp's docs suggest for it")
    else:
        raise ConfigError(f"llama-server has no counterpart of the {method!r} method; export draft, lookup or "
                          "history.")
    notes.append("flags of llama-server as llama.cpp's docs/speculative.md gives them (2026); builds from "
                 "before --spec-type know only -md")
    return Export("llama-server", method, k, argv, notes)


def best_method(bench: Any, source: str = "the bench file") -> tuple[str, int, float]:
    """The drafting method and K with the best median speedup over all prompts of a ``localspec bench --json``.

    Plain decoding, auto and llama-cpp-python's rows are left out: the engine
    runs one fixed method.

    Raises:
        ConfigError: not such a file, or it has no drafting rows.
    """
    rows = bench.get("rows") if isinstance(bench, dict) else None
    if not isinstance(rows, list):
        raise ConfigError(f"{source} is not a `localspec bench --json` file (it has no list of rows).")
    scores: dict[tuple[str, int], list[float]] = {}
    for row in rows:
        try:
            if row["method"] in (DRAFT.name, LOOKUP.name, HISTORY.name) and float(row.get("temperature", 0)) == 0:
                scores.setdefault((str(row["method"]), int(row["k"])), []).append(float(row["speedup"]))
        except (TypeError, KeyError, ValueError, AttributeError):
            raise ConfigError(f"{source} has a row that is not a bench row ({str(row)[:80]}); write it again "
                              "with `localspec bench --json`.") from None
    if not scores:
        raise ConfigError(f"{source} has no greedy draft, lookup or history rows to choose from.")
    (method, k), speedups = max(scores.items(), key=lambda kv: sorted(kv[1])[len(kv[1]) // 2])
    return method, k, sorted(speedups)[len(speedups) // 2]


def load_bench(path: Path) -> tuple[str, int, float]:
    """``best_method`` of a bench JSON file.

    Raises:
        ConfigError: the file cannot be read, is not JSON, or is not a bench file.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"Cannot read {path} as a `localspec bench --json` file ({exc}).") from None
    return best_method(data, str(path))


def served(path: Path, repo: Optional[str], hub_repo: Optional[str]) -> Served:
    """One model as an engine will load it: its absolute path, and its source repository as well as it is known.

    Args:
        path: the GGUF.
        repo: the repository the user gave (wins).
        hub_repo: the repository the catalog pulls the file from, if any.
    """
    from .gguf_header import read_local

    if repo:
        return Served(path.resolve(), repo, "the command line")
    found, why = source_repo(read_local(path).metadata, hub_repo)
    return Served(path.resolve(), found, why)


def plan(engine: str, target: Served, draft: Optional[Served], method: str, k: int, ngram: tuple[int, int],
         ctx: int, port: Optional[int] = None) -> Export:
    """The command for ``engine`` (one of ``ENGINES``).

    Raises:
        ConfigError: an unknown engine, or what ``vllm`` and ``llama_server`` raise.
    """
    if engine not in ENGINES:
        raise ConfigError(f"Unknown engine {engine!r}; export to one of {', '.join(ENGINES)}.")
    if engine == "vllm":
        return vllm(target, draft, method, k, ngram, ctx, port=port or 8000)
    return llama_server(target, draft, method, k, ngram, ctx, port=port or 8080)
