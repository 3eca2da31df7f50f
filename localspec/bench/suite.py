"""The bench's prompts and methods: the built-in suite and related workload, and the rows to measure."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from ..constraint import Constraint
from ..errors import ConfigError
from ..methods import AUTO, PLAIN, REGISTRY
from ..structured.tool_use import tool_use
from .peers import PEER_LOOKUP, PEER_PLAIN


@dataclass
class BenchPrompt:
    """One prompt of the suite: raw ``text``, chat ``messages``, or a ``prefix`` and ``suffix`` to fill in between.

    A structured prompt also gives OpenAI's ``response_format``, or ``tools`` (with chat messages) and a
    ``tool_choice``: every row then decodes under that constraint (see ``bench.structured``).
    """

    category: str
    text: Optional[str] = None
    messages: Optional[list[dict[str, str]]] = None
    quick: bool = False
    name: str = ""
    prefix: Optional[str] = None
    suffix: Optional[str] = None
    response_format: Optional[dict[str, Any]] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Any = None
    parallel_tool_calls: Optional[bool] = None


@dataclass(frozen=True)
class MethodSpec:
    """A method and its draft length; auto runs with an empty history store unless ``history`` is False."""

    method: str
    k: int = 0
    history: bool = True

    @property
    def label(self) -> str:
        if self.method == PEER_PLAIN:
            return "lcp plain"
        if self.method == PEER_LOOKUP:
            return f"lcp lookup k={self.k}"
        method = REGISTRY.find(self.method)
        if method is not None and method.adaptive:
            return method.name if self.history else f"{method.name} -history"
        return self.method if self.k == 0 else f"{self.method} k={self.k}"


#: The draft lengths of llama-cpp-python's prompt lookup in the bench: its documented default (10), and
#: a short one, which is what pays on a CPU.
PEER_LOOKUP_K = (2, 10)


def load_suite(path: Optional[Path] = None, categories: Sequence[str] = (), quick: bool = False,
               builtin: str = "suite.jsonl") -> list[BenchPrompt]:
    """The built-in suite, or a JSONL file of ``{"category", "prompt" | "messages" | "prefix" and "suffix"}``
    lines, each with an optional ``"response_format"``, or ``"tools"`` (with ``"tool_choice"`` and
    ``"parallel_tool_calls"``).

    Args:
        path: a JSONL file; None for the file ``builtin`` shipped with localspec.
        categories: keep only these categories (empty: all).
        quick: keep only the prompts marked ``"quick"`` (the built-in suite
            marks one per kind of text); a user suite without marks keeps its
            first prompt of each category.

    Raises:
        ConfigError: unreadable file, bad JSON, missing fields (file and line named),
            or a filter that leaves nothing.
    """
    if path is None:
        source = f"built-in {builtin}"
        lines = resources.files("localspec").joinpath(f"data/{builtin}").read_text(encoding="utf-8").splitlines()
    else:
        source = str(path)
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ConfigError(f"Cannot read the prompt suite {path}: {exc.strerror}.") from exc
    prompts: list[BenchPrompt] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as exc:
            raise ConfigError(f"{source}, line {lineno}: not valid JSON ({exc}).") from exc
        if not isinstance(rec, dict) or not isinstance(rec.get("category"), str):
            raise ConfigError(f"{source}, line {lineno}: needs a \"category\" string.")
        prompts.append(_prompt(rec, f"{source}, line {lineno}",
                               f"{rec['category']}#{sum(p.category == rec['category'] for p in prompts) + 1}"))
    if categories:
        prompts = [p for p in prompts if p.category in categories]
    if quick:
        marked = [p for p in prompts if p.quick]
        if not marked:
            seen: set[str] = set()
            marked = [p for p in prompts if not (p.category in seen or seen.add(p.category))]  # type: ignore[func-returns-value]
        prompts = marked
    if not prompts:
        raise ConfigError(f"No prompts left in the {source} after filtering by {', '.join(categories) or 'quick'}.")
    return prompts


def _prompt(rec: dict[str, Any], where: str, name: str) -> BenchPrompt:
    """One suite line as a prompt (ConfigError naming ``where`` when a field is wrong)."""
    text, messages, prefix, suffix = (rec.get(f) for f in ("prompt", "messages", "prefix", "suffix"))
    infill = prefix is not None or suffix is not None
    if sum((text is not None, messages is not None, infill)) != 1:
        raise ConfigError(f"{where}: give exactly one of \"prompt\", \"messages\", or \"prefix\" and \"suffix\".")
    if messages is not None and not (
            isinstance(messages, list) and all(isinstance(m, dict) and "role" in m and "content" in m
                                               for m in messages)):
        raise ConfigError(f"{where}: \"messages\" must be a list of {{role, content}} objects.")
    if infill and not (isinstance(prefix, str) and isinstance(suffix, str)):
        raise ConfigError(f"{where}: fill-in-the-middle needs both \"prefix\" and \"suffix\", as strings.")
    tools, response_format = rec.get("tools"), rec.get("response_format")
    if tools is None and ("tool_choice" in rec or "parallel_tool_calls" in rec):
        raise ConfigError(f"{where}: \"tool_choice\" and \"parallel_tool_calls\" need \"tools\".")
    if tools is not None and messages is None:
        raise ConfigError(f"{where}: \"tools\" go with chat \"messages\".")
    if tools is not None and response_format is not None:
        raise ConfigError(f"{where}: give \"tools\" or \"response_format\", not both.")
    if response_format is not None and infill:
        raise ConfigError(f"{where}: a fill-in-the-middle prompt takes no \"response_format\".")
    try:  # the library's own checks, with the line named
        if response_format is not None:
            Constraint.response_format(response_format)
        if tools is not None:
            tool_use(tools, rec.get("tool_choice"), rec.get("parallel_tool_calls"))
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    return BenchPrompt(rec["category"], text, messages, bool(rec.get("quick", False)), name, prefix, suffix,
                       response_format, tools, rec.get("tool_choice"), rec.get("parallel_tool_calls"))


def load_related(path: Optional[Path] = None) -> list[BenchPrompt]:
    """The related-requests workload (run in order), built in or from a JSONL file like a suite."""
    return load_suite(path, builtin="related.jsonl")


def default_methods(has_draft: bool, quick: bool, ks: Optional[Mapping[str, Sequence[int]]] = None,
                    auto: bool = True, peers: bool = True, history_check: bool = False,
                    has_head: bool = False) -> list[MethodSpec]:
    """Plain first, then the peers (llama-cpp-python plain, its lookup with 2 and 10 tokens), every
    registered method with bench rows at its draft lengths (``ks`` overrides them by method name, and the
    peer's lookup lengths under ``PEER_LOOKUP``; an empty list leaves the method out), then
    auto (with an empty history; ``history_check`` adds auto without history, to show an empty store
    costs nothing). Draft-model rows need ``has_draft``, MTP rows ``has_head``."""
    methods = [MethodSpec(PLAIN.name)]
    if peers:
        peer_ks = ks[PEER_LOOKUP] if ks and PEER_LOOKUP in ks else PEER_LOOKUP_K
        methods += [MethodSpec(PEER_PLAIN), *(MethodSpec(PEER_LOOKUP, k) for k in peer_ks)]
    for m in REGISTRY:  # every method with bench rows of its own, at its draft lengths
        if m.bench_k and (has_draft or not m.needs_draft) and (has_head or not m.needs_head):
            chosen = ks[m.name] if ks and m.name in ks else (m.bench_k_quick or m.bench_k if quick else m.bench_k)
            methods += [MethodSpec(m.name, k) for k in chosen]
    if auto and history_check:
        methods.append(MethodSpec(AUTO.name, AUTO.default_k, history=False))
    return methods + ([MethodSpec(AUTO.name, AUTO.default_k)] if auto else [])


def schedule(n_prompts: int, methods: Sequence[MethodSpec], reps: int) -> list[tuple[int, int, MethodSpec]]:
    """(prompt index, repetition, method) in run order: per prompt, repetitions of all methods in turn
    (each repetition in the order ``rotation`` gives it)."""
    return [(p, r, spec) for p in range(n_prompts) for r in range(reps) for spec in rotation(methods, r)]


def rotation(methods: Sequence[MethodSpec], rep: int) -> list[MethodSpec]:
    """The methods in the order repetition ``rep`` runs them.

    The order changes from one repetition to the next (the rows of a Williams square: over as many
    repetitions as methods, each method runs once in each place, after as many different methods as
    can be). What a run leaves behind (a hot or throttled core, the other model's pages evicted) then
    falls on every method alike, not always on the same one. The first repetition starts with the
    first method (the reference).
    """
    m = len(methods)
    base = [0] + [j for i in range(1, m // 2 + 1) for j in (i, m - i)][: m - 1]  # 0, 1, m-1, 2, m-2, ...
    row = [methods[(b + rep) % m] for b in base]
    return row[::-1] if m % 2 and (rep // m) % 2 else row  # odd m: the reversed rows complete the square
