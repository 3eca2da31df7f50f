"""``localspec bench``: speculative methods against plain decoding and the peers, in one run.

For every prompt of a suite and every method (plain; llama-cpp-python's own
``Llama``, plain and with its prompt-lookup draft, the "peers"; lookup and
draft at several K; auto), generations are repeated with the repetitions
interleaved across methods (plain, A, B, ..., plain, A, B, ...) so that drift
in machine speed hits all methods alike. Each run starts from empty caches,
so prefill is timed the same way for all, and decode is timed separately.
A method's speedup is a reference's decode time over the method's, per token,
taken from the same repetition: the headline reference is llama-cpp-python's
plain decoding (what a user would otherwise run), the second one localspec's
own plain path. The table shows medians and the spread.

Greedy runs are also checked for exactness against both plain decodings:
identical tokens, a divergence where plain's own top-two logits were a
numeric tie, or a real mismatch (a bug; it makes the command fail).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import numpy as np

from .api import Pair
from .auto import history_estimates
from .backend import gpu_offload_supported
from .costs import CostProfile, predicted_round_seconds, predicted_speedup
from .engine import GenerationStats
from .errors import ConfigError
from .history import HistoryDrafter, HistoryStore
from .hugepages import thp_mode
from .methods import AUTO, HISTORY, PLAIN, REGISTRY
from .options import GenerationOptions
from .peers import PEER_LOOKUP, PEER_METHODS, PEER_PLAIN, PeerRunner

#: A divergence counts as a numeric tie below this top-two logit margin of plain decoding,
#: or below twice the measured batch-shape noise of this build if that is larger.
TIE_MARGIN = 0.05


@dataclass
class BenchPrompt:
    """One prompt of the suite: raw ``text`` or chat ``messages``."""

    category: str
    text: Optional[str] = None
    messages: Optional[list[dict[str, str]]] = None
    quick: bool = False
    name: str = ""


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


def load_suite(path: Optional[Path] = None, categories: Sequence[str] = (), quick: bool = False,
               builtin: str = "suite.jsonl") -> list[BenchPrompt]:
    """The built-in suite, or a JSONL file of ``{"category", "prompt" | "messages"}`` lines.

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
        text, messages = rec.get("prompt"), rec.get("messages")
        if (text is None) == (messages is None):
            raise ConfigError(f"{source}, line {lineno}: give exactly one of \"prompt\" or \"messages\".")
        if messages is not None and not (
                isinstance(messages, list) and all(isinstance(m, dict) and "role" in m and "content" in m
                                                   for m in messages)):
            raise ConfigError(f"{source}, line {lineno}: \"messages\" must be a list of {{role, content}} objects.")
        prompts.append(BenchPrompt(rec["category"], text, messages, bool(rec.get("quick", False)),
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


def default_methods(has_draft: bool, quick: bool, ks: Optional[Mapping[str, Sequence[int]]] = None,
                    auto: bool = True, peers: bool = True, history_check: bool = False) -> list[MethodSpec]:
    """Plain first, then the peers (llama-cpp-python plain, its lookup with 2 and 10 tokens), every
    registered method with bench rows at its draft lengths (``ks`` overrides them by method name), then
    auto (with an empty history; ``history_check`` adds auto without history, to show an empty store
    costs nothing)."""
    methods = [MethodSpec(PLAIN.name)]
    if peers:
        methods += [MethodSpec(PEER_PLAIN), MethodSpec(PEER_LOOKUP, 2), MethodSpec(PEER_LOOKUP, 10)]
    for m in REGISTRY:  # every method with bench rows of its own, at its draft lengths
        if m.bench_k and (has_draft or not m.needs_draft):
            chosen = (ks or {}).get(m.name) or (m.bench_k_quick if quick else m.bench_k)
            methods += [MethodSpec(m.name, k) for k in chosen]
    if auto and history_check:
        methods.append(MethodSpec(AUTO.name, AUTO.default_k, history=False))
    return methods + ([MethodSpec(AUTO.name, AUTO.default_k)] if auto else [])


def schedule(n_prompts: int, methods: Sequence[MethodSpec], reps: int) -> list[tuple[int, int, MethodSpec]]:
    """(prompt index, repetition, method) in run order: per prompt, repetitions of all methods in turn."""
    return [(p, r, m) for p in range(n_prompts) for r in range(reps) for m in methods]


@dataclass
class Run:
    """One measured generation."""

    prompt: str
    category: str
    method: str
    k: int
    rep: int
    temperature: float
    tokens: list[int]
    stats: dict[str, Any]
    history: bool = True


@dataclass
class Row:
    """One prompt x method x temperature, summarised over repetitions."""

    prompt: str
    category: str
    method: str
    k: int
    temperature: float
    decode_tps: float
    prefill_seconds: float
    speedup: float
    speedup_min: float
    speedup_max: float
    acceptance: float
    tokens_per_round: float
    acceptance_by_position: list[float]
    predicted_speedup: Optional[float]
    exactness: str  # identical / tie / MISMATCH / "reference" for plain / "-" when sampled
    #: Against llama-cpp-python's plain decoding (the headline), when the peers ran.
    speedup_peer: Optional[float] = None
    speedup_peer_min: Optional[float] = None
    speedup_peer_max: Optional[float] = None
    exactness_peer: str = "-"
    #: Decode time outside llama.cpp per round (Python and numpy), median over repetitions.
    overhead_ms_per_round: float = 0.0
    #: Round statistics summed over repetitions (what predictions are made from).
    round_stats: Optional[dict[str, int]] = None
    divergence: Optional[dict[str, float]] = None
    auto_rounds: Optional[dict[str, int]] = None
    #: Mean decode time per round, measured and as the cost profile predicts it from the rounds' draft
    #: lengths (how well calibration describes real rounds); None for the peers.
    round_ms: Optional[float] = None
    round_ms_predicted: Optional[float] = None
    #: The same prediction with one target step taken from this run's plain rounds on the same prompt
    #: instead of the calibration: what is left is the error in the relative costs auto decides by, not
    #: how much busier the shared machine is now than when it was calibrated. None for plain and the peers.
    round_ms_predicted_here: Optional[float] = None
    #: False for the "auto -history" row (auto without a history store).
    history: bool = True

    @property
    def label(self) -> str:
        return MethodSpec(self.method, self.k, self.history).label


@dataclass
class BenchReport:
    """Everything a bench run measured."""

    rows: list[Row] = field(default_factory=list)
    profile: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    mismatches: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def margin_at(pair: Pair, prompt: list[int], plain_tokens: list[int], i: int) -> float:
    """Plain decoding's own top-two logit margin before token i (prefill, then one token at a time)."""
    target = pair.target
    target.reset()
    logits = target.sync(prompt)
    for t in plain_tokens[:i]:
        logits = target.eval([t], logits="last")[0]
    top2 = np.partition(logits, -2)[-2:]
    target.reset()
    return float(top2[1] - top2[0])


def batch_noise(pair: Pair, tokens: list[int], n: int = 8) -> float:
    """Largest logit difference between evaluating n tokens one at a time and as one batch.

    llama.cpp's CPU kernels round differently for different batch shapes (even
    plain decoding's prompt prefill is a batch), so a greedy choice whose top
    two logits are closer than this can go either way.
    """
    target = pair.target
    head, tail = tokens[:-n], tokens[-n:]
    target.reset()
    target.sync(head)
    single = np.stack([target.eval([t], logits="last")[0].copy() for t in tail])
    target.truncate(len(head))
    batch = target.eval(tail, logits="all").copy()
    target.reset()
    return float(np.abs(single - batch).max())


def classify(plain: list[int], tokens: list[int], margin: Callable[[int], float],
             tie_margin: float = TIE_MARGIN) -> tuple[str, Optional[dict[str, float]]]:
    """Exactness verdict of greedy ``tokens`` against plain decoding's.

    Returns:
        ("identical", None), ("tie", info) when they part where plain's top two
        logits were within ``tie_margin``, or ("MISMATCH", info).
    """
    n = min(len(plain), len(tokens))
    i = next((j for j in range(n) if plain[j] != tokens[j]), None)
    if i is None:
        if len(plain) == len(tokens):
            return "identical", None
        i = n  # one stopped earlier than the other
    m = margin(i)
    info = {"token": float(i), "margin": m}
    return ("tie" if m < tie_margin else "MISMATCH"), info


def machine_info(pair: Pair, checksums: bool = True) -> dict[str, Any]:
    """CPU, offload, threads, library version, model files and checksums."""
    import llama_cpp

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    models = {}
    for role, model in (("target", pair.target), ("draft", pair.draft)):
        if model is None:
            continue
        info: dict[str, Any] = {"path": str(model.path), "bytes": model.path.stat().st_size}
        if checksums:
            h = hashlib.sha256()
            with open(model.path, "rb") as f:
                while block := f.read(1 << 22):
                    h.update(block)
            info["sha256"] = h.hexdigest()
        models[role] = info
    return {
        "cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
        "llama_cpp_python": llama_cpp.__version__, "gpu_offload_build": gpu_offload_supported(),
        "gpu_layers": pair.target.n_gpu_layers, "threads": pair.target.n_threads,
        "flash_attn": pair.target.flash_attn, "n_ctx": pair.target.n_ctx, "models": models,
        "transparent_huge_pages": thp_mode(), "huge_page_bytes": pair.target.huge_page_bytes,
    }


def run_bench(
    pair: Pair,
    prompts: Sequence[BenchPrompt],
    methods: Sequence[MethodSpec],
    *,
    reps: int = 3,
    max_tokens: int = 128,
    temperatures: Sequence[float] = (0.0,),
    top_p: float = 1.0,
    progress: Optional[Callable[[str], None]] = None,
    checksums: bool = True,
) -> BenchReport:
    """Measure every method on every prompt; see the module docstring.

    Args:
        pair: loaded models (loaded once for the whole run).
        prompts: the suite.
        methods: must start with plain (the reference).
        reps: repetitions per method, interleaved.
        max_tokens: tokens per generation.
        temperatures: 0 for greedy (checked for exactness); others sample with seed = repetition.
        top_p: nucleus mass for the sampled runs (localspec's and the peers').
        progress: called once per generation with a short description.
        checksums: hash the model files for the report.
    """
    if not methods or methods[0].method != PLAIN.name:
        raise ConfigError("The first bench method must be plain: it is the reference for speedups.")
    if pair.draft is None and any(getattr(REGISTRY.find(m.method), "needs_draft", False) for m in methods):
        raise ConfigError("Draft-model methods need a draft model (--draft).")
    profile = pair.calibrate()
    prompt_ids = {bp.name: _prompt_tokens(pair, bp) for bp in prompts}  # template and tokenizer once
    noise = batch_noise(pair, prompt_ids[prompts[0].name])
    report = BenchReport(profile={"source": profile.source, **profile.relative(),
                                  "step_seconds": profile.verify[0], "batch_noise": noise,
                                  "tie_margin": max(TIE_MARGIN, 2 * noise)},
                         settings={"reps": reps, "max_tokens": max_tokens, "temperatures": list(temperatures),
                                   "top_p": top_p, "methods": [m.label for m in methods]})
    runs: list[Run] = []
    peers = PeerRunner(pair.target) if any(m.method in PEER_METHODS for m in methods) else None
    if peers is not None:
        report.settings["peer"] = {"library": "llama-cpp-python Llama.generate", **peers.settings}
    # Auto runs with an empty history store of its own, emptied before each run: no repetition learns
    # from another.
    try:
        with _scratch_stores(pair, "empty") as (empty,):
            for temperature in temperatures:
                for pi, rep, spec in schedule(len(prompts), methods, reps):
                    bp = prompts[pi]
                    tokens = prompt_ids[bp.name]
                    if rep == 0 and (spec == methods[0] or pi == 0):  # warm-up: plain per prompt, the rest once
                        _generate(pair, peers, tokens, spec, temperature, 0, min(16, max_tokens), top_p)
                    empty.clear()
                    out, stats = _generate(pair, peers, tokens, spec, temperature, rep, max_tokens, top_p)
                    runs.append(Run(bp.name, bp.category, spec.method, spec.k, rep, temperature, out,
                                    stats.to_dict(), spec.history))
                    if progress:
                        progress(f"{bp.name} {spec.label}")
    finally:
        if peers is not None:
            peers.close()
    report.rows = _summarise(pair, prompt_ids, runs, profile, max(TIE_MARGIN, 2 * noise))
    report.mismatches = sum(row.exactness == "MISMATCH" or row.exactness_peer == "MISMATCH" for row in report.rows)
    report.machine = machine_info(pair, checksums)
    return report


def _prompt_tokens(pair: Pair, bp: BenchPrompt) -> list[int]:
    return pair.chat_tokens(bp.messages) if bp.messages is not None else pair.tokenize(bp.text or "")


def _generate(pair: Pair, peers: Optional[PeerRunner], tokens: list[int], spec: MethodSpec, temperature: float,
              seed: int, max_tokens: int, top_p: float) -> tuple[list[int], GenerationStats]:
    top_p = top_p if temperature > 0 else 1.0
    if spec.method in PEER_METHODS:
        assert peers is not None
        return peers.generate(spec.method, spec.k, tokens, temperature, seed, max_tokens, top_p)
    method = REGISTRY.get(spec.method)
    return _fresh_generate(pair, tokens, GenerationOptions(
        max_tokens=max_tokens, method=spec.method, k=spec.k, temperature=temperature, top_p=top_p, seed=seed,
        history=spec.history and (method.adaptive or method is HISTORY)))


def _fresh_generate(pair: Pair, tokens: list[int], opts: GenerationOptions) -> tuple[list[int], GenerationStats]:
    """Generate from empty caches: every run prefills the whole prompt, so no run inherits another's work."""
    pair.target.reset()
    if pair.draft is not None:
        pair.draft.reset()
    r = pair.generate(tokens, opts)
    return r.tokens, r.stats


@contextlib.contextmanager
def _scratch_stores(pair: Pair, *names: str) -> Iterator[list[HistoryStore]]:
    """Empty history stores in a temporary directory, one per name; the pair's own setting comes back after.

    The user's store is neither used nor changed by a bench.
    """
    with tempfile.TemporaryDirectory(prefix="localspec-bench-") as scratch:
        stores = [HistoryStore(pair.target.path, directory=Path(scratch) / name) for name in names]
        saved = pair.set_history(stores[0])
        try:
            yield stores
        finally:
            pair.set_history(saved)


def _summarise(pair: Pair, prompt_ids: dict[str, list[int]], runs: list[Run], profile: CostProfile,
               tie_margin: float) -> list[Row]:
    rows = []
    margins: dict[tuple[int, ...], float] = {}
    by_key: dict[tuple, list[Run]] = {}
    for run in runs:
        by_key.setdefault((run.prompt, run.method, run.k, run.temperature, run.history), []).append(run)

    def ratios(group: list[Run], reference: Optional[list[Run]]) -> list[float]:
        """Decode speed over the reference's, repetition by repetition."""
        ref = {r.rep: r for r in reference or []}
        return [_tps(r) / _tps(ref[r.rep]) for r in group if r.rep in ref and _tps(ref[r.rep]) > 0]

    for (name, method, k, temperature, history), group in by_key.items():
        plain = by_key[(name, PLAIN.name, 0, temperature, True)]
        peer = by_key.get((name, PEER_PLAIN, 0, temperature, True))
        speedups, vs_peer = ratios(group, plain), ratios(group, peer)
        last = group[-1].stats
        drafted = sum(r.stats["drafted"] for r in group)
        accepted = sum(r.stats["accepted"] for r in group)
        merged = {key: sum(r.stats[key] for r in group)
                  for key in ("rounds", "empty_rounds", "rejected_rounds", "drafted", "accepted")}
        exactness, divergence, exactness_peer = "-", None, "-"

        if temperature == 0:
            exactness, divergence = ("reference", None) if method == PLAIN.name else _exactness(
                pair, prompt_ids[name], plain[0].tokens, group, tie_margin, margins)
            if peer is not None:
                exactness_peer = "reference" if method == PEER_PLAIN else _exactness(
                    pair, prompt_ids[name], peer[0].tokens, group, tie_margin, margins)[0]
        rows.append(Row(
            prompt=name, category=group[0].category, method=method, k=k, temperature=temperature, history=history,
            decode_tps=statistics.median(_tps(r) for r in group),
            prefill_seconds=statistics.median(r.stats["prefill_seconds"] for r in group),
            speedup=statistics.median(speedups) if speedups else 0.0,
            speedup_min=min(speedups, default=0.0), speedup_max=max(speedups, default=0.0),
            acceptance=accepted / drafted if drafted else 0.0,
            tokens_per_round=statistics.median(r.stats["tokens_per_round"] for r in group),
            acceptance_by_position=[round(a, 3) for a in last["acceptance_by_position"]],
            predicted_speedup=predicted_speedup(profile, method, merged),
            exactness=exactness, divergence=divergence,
            overhead_ms_per_round=statistics.median(r.stats["overhead_ms_per_round"] for r in group),
            round_stats=merged,
            auto_rounds=last["auto"]["rounds"] if last.get("auto") else None,
            round_ms=_per_round(sum(r.stats["decode_seconds"] for r in group), merged["rounds"]),
            round_ms_predicted=_per_round(sum(predicted_round_seconds(profile, r.stats) for r in group),
                                          merged["rounds"]),
            round_ms_predicted_here=None if method in (PLAIN.name, *PEER_METHODS) else _per_round(
                sum(predicted_round_seconds(profile, r.stats) * _plain_step(plain, r.rep) / profile.verify[0]
                    for r in group), merged["rounds"]),
            speedup_peer=statistics.median(vs_peer) if vs_peer else None,
            speedup_peer_min=min(vs_peer) if vs_peer else None,
            speedup_peer_max=max(vs_peer) if vs_peer else None,
            exactness_peer=exactness_peer,
        ))
    return rows


def _plain_step(plain: list[Run], rep: int) -> float:
    """Seconds per round of localspec's plain run in repetition ``rep`` (one target step)."""
    run = next(r for r in plain if r.rep == rep)
    return float(run.stats["decode_seconds"]) / max(1, run.stats["rounds"])


def _per_round(seconds: float, rounds: int) -> Optional[float]:
    return 1000 * seconds / rounds if rounds else None


def _exactness(pair: Pair, prompt_tokens: list[int], ref: list[int], group: list[Run], tie_margin: float,
               margins: dict[tuple[int, ...], float]) -> tuple[str, Optional[dict]]:
    """The worst verdict over a method's repetitions against a plain run's tokens.

    ``margins`` remembers plain decoding's margin by prompt and reference prefix: it costs one
    decode step per token, and repetitions, methods and the two references (localspec's and
    llama-cpp-python's plain tokens, usually equal) mostly diverge at the same place.
    """

    def margin(i: int) -> float:
        key = (*prompt_tokens, -1, *ref[:i])
        if key not in margins:
            margins[key] = margin_at(pair, prompt_tokens, ref, i)
        return margins[key]

    worst: tuple[str, Optional[dict]] = ("identical", None)
    for run in group:
        verdict = classify(ref, run.tokens, margin, tie_margin)
        if verdict[0] == "MISMATCH" or (verdict[0] == "tie" and worst[0] == "identical"):
            worst = verdict
    return worst


def _tps(run: Run) -> float:
    return float(run.stats["decode_tokens_per_second"])


def render_table(report: BenchReport) -> str:
    """The report as a terminal table, with the cost profile on top."""
    p = report.profile
    verify = "  ".join(f"{n + 1}:{v:.2f}" for n, v in enumerate(p.get("verify", [])))
    out = [f"cost profile ({p.get('source')}): target step {1000 * p.get('step_seconds', 0):.1f} ms; "
           f"draft step / target step: {p.get('draft_step', 0):.2f}",
           f"verify n tokens / 1: {verify}",
           f"batch-shape logit noise of this build: {p.get('batch_noise', 0):.3f} "
           f"(divergences below a {p.get('tie_margin', TIE_MARGIN):.3f} top-two margin count as ties)", ""]
    peers = any(r.speedup_peer is not None for r in report.rows)
    out.append("round ms: mean decode time per round, measured/predicted by the cost profile from the rounds' "
               "draft lengths (in brackets: predicted with this run's plain step in place of the calibrated one).")
    if peers:
        out.append("lcp = llama-cpp-python's own Llama (plain, and its prompt-lookup draft), same file and threads; "
                   "'vs lcp' is the headline speedup, 'vs plain' is against localspec's plain path.")
    header = (f"{'prompt':<15} {'temp':>4} {'method':<15} {'tok/s':>6} {'vs lcp':>6} {'(min-max)':>11} "
              f"{'vs plain':>8} {'pred':>5} {'accept':>6} {'tok/rnd':>7} {'round ms':>15}  "
              "exactness (vs plain / vs lcp)")
    out += [header, "-" * len(header)]
    last_prompt = None
    for row in report.rows:
        name = row.prompt if row.prompt != last_prompt else ""
        last_prompt = row.prompt
        vs_peer = f"{row.speedup_peer:.2f}x" if row.speedup_peer is not None else "-"
        spread = (f"({row.speedup_peer_min:.2f}-{row.speedup_peer_max:.2f})"
                  if row.speedup_peer_min is not None and row.method != PEER_PLAIN else "")
        pred = f"{row.predicted_speedup:.2f}" if row.predicted_speedup is not None else "-"
        acc = f"{100 * row.acceptance:.0f}%" if getattr(REGISTRY.find(row.method), "build", None) else "-"
        tpr = f"{row.tokens_per_round:.2f}" if row.method not in PEER_METHODS else "-"
        verdict = row.exactness + (f" / {row.exactness_peer}" if peers else "")
        rms = (f"{row.round_ms:.0f}/{row.round_ms_predicted:.0f}"
               if row.round_ms is not None and row.round_ms_predicted is not None else "-")
        if row.round_ms_predicted_here is not None:
            rms += f" ({row.round_ms_predicted_here:.0f})"
        if row.divergence:
            verdict += f" @{int(row.divergence['token'])} (margin {row.divergence['margin']:.3f})"
        if row.auto_rounds:
            verdict += "  [" + " ".join(f"{m}:{n}" for m, n in row.auto_rounds.items() if n) + "]"
        out.append(f"{name:<15} {row.temperature:>4.1f} {row.label:<15} "
                   f"{row.decode_tps:>6.1f} {vs_peer:>6} {spread:>11} {row.speedup:>7.2f}x {pred:>5} {acc:>6} "
                   f"{tpr:>7} {rms:>15}  {verdict}")
    for title, attr in ((("median speedup over llama-cpp-python plain across prompts:", "speedup_peer"),) if peers
                        else ()) + (("median speedup over localspec plain across prompts:", "speedup"),):
        out += ["", title]
        for label in report.settings.get("methods", [])[1:]:
            values = [getattr(r, attr) for r in report.rows
                      if r.label == label and getattr(r, attr) is not None]
            if values:
                out.append(f"  {label:<15} {statistics.median(values):.2f}x  (worst {min(values):.2f}x, "
                           f"best {max(values):.2f}x)")
    if report.mismatches:
        out.append(f"\n{report.mismatches} MISMATCH(ES) against plain decoding: this is a bug, please report it.")
    return "\n".join(out)


def write_plot(report: BenchReport, path: Path) -> None:
    """Speedup against K per category for draft and lookup, with plain at 1.0 (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ConfigError("--plot needs matplotlib: pip install 'localspec[plot]'.") from exc
    methods = [m.name for m in REGISTRY if m.bench_k and any(r.method == m.name for r in report.rows)]
    vs_peer = any(r.speedup_peer is not None for r in report.rows)
    reference = "llama-cpp-python plain" if vs_peer else "localspec plain"

    def value(r: Row) -> float:
        return float(r.speedup_peer if vs_peer and r.speedup_peer is not None else r.speedup)

    fig, axes = plt.subplots(1, max(1, len(methods)), figsize=(6 * max(1, len(methods)), 4.5), squeeze=False)
    for ax, method in zip(axes[0], methods, strict=False):
        for category in sorted({r.category for r in report.rows}):
            pts = sorted((r.k, value(r)) for r in report.rows
                         if r.method == method and r.category == category and r.temperature == 0)
            if pts:
                ax.plot([k for k, _ in pts], [s for _, s in pts], marker="o", label=category)
        ax.set_xticks(sorted({r.k for r in report.rows if r.method == method}))
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label=reference)
        for label, style in ((PLAIN.name, ":"), (AUTO.name, "-.")):
            ours = [value(r) for r in report.rows if r.method == label and r.temperature == 0]
            if ours and vs_peer:
                ax.axhline(statistics.median(ours), color="grey", linestyle=style, linewidth=1,
                           label=f"localspec {label} (median)")
        ax.set_title(f"{method}: speedup over {reference}")
        ax.set_xlabel("K (tokens drafted per round)")
        ax.set_ylabel("decode speedup (x)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_json(report: BenchReport, path: Path) -> None:
    """The whole report as JSON."""
    Path(path).write_text(json.dumps(report.to_dict(), indent=1))


# -- related requests: what the history drafter is for ---------------------------------------------


def load_related(path: Optional[Path] = None) -> list[BenchPrompt]:
    """The related-requests workload (run in order), built in or from a JSONL file like a suite."""
    return load_suite(path, builtin="related.jsonl")


@dataclass
class RelatedRow:
    """One request of the workload: speed with an empty history and with the earlier requests' history."""

    prompt: str
    category: str
    lcp_tps: float
    empty_tps: float
    earlier_tps: float
    #: Against llama-cpp-python plain, medians over repetitions (and the spread of the second).
    speedup_empty: float
    speedup_earlier: float
    speedup_earlier_min: float
    speedup_earlier_max: float
    #: Tokens drafted from history and accepted, with the earlier requests' history (summed over repetitions).
    history_drafted: int
    history_accepted: int
    rounds: dict[str, int]
    exactness: str  # worst over both localspec rows against llama-cpp-python's plain tokens


@dataclass
class RelatedReport:
    """What ``run_related`` measured."""

    rows: list[RelatedRow] = field(default_factory=list)
    costs: dict[str, float] = field(default_factory=dict)
    store: dict[str, int] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    mismatches: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_related(pair: Pair, prompts: Sequence[BenchPrompt], *, reps: int = 3, max_tokens: int = 128,
                progress: Optional[Callable[[str], None]] = None, checksums: bool = True) -> RelatedReport:
    """Run related requests in order: llama-cpp-python plain, auto with an empty history, auto with
    the history of the requests before it (recorded as a user's would be), greedy.

    Each repetition starts the "earlier" store empty and auto's history estimates afresh, so request i
    always sees exactly requests 0..i-1 of the same repetition. The user's own store is not touched.
    """
    pair.calibrate()
    ids = {bp.name: _prompt_tokens(pair, bp) for bp in prompts}
    noise = batch_noise(pair, ids[prompts[0].name])
    tie_margin = max(TIE_MARGIN, 2 * noise)
    peers = PeerRunner(pair.target)
    report = RelatedReport(settings={"reps": reps, "max_tokens": max_tokens, "tie_margin": tie_margin,
                                     "requests": [bp.name for bp in prompts],
                                     "peer": {"library": "llama-cpp-python Llama.generate", **peers.settings}})
    runs: dict[tuple[str, str], list[Run]] = {}
    updates: list[float] = []
    opts = GenerationOptions(max_tokens=max_tokens, method=AUTO.name)

    def ours(store: HistoryStore, estimates: dict, tokens: list[int]) -> tuple[list[int], GenerationStats]:
        pair.set_history(store)
        pair.history_alpha = estimates  # auto updates them in place: a repetition's requests share them
        return _fresh_generate(pair, tokens, opts)

    try:
        with _scratch_stores(pair, "empty", "earlier") as (empty, earlier):
            first = ids[prompts[0].name]
            peers.generate(PEER_PLAIN, 0, first, 0.0, 0, 16)  # warm-up of both sides
            ours(empty, history_estimates(), first)
            for rep in range(reps):
                earlier.clear()
                estimates = history_estimates()  # as a freshly loaded pair has them
                for bp in prompts:
                    tokens = ids[bp.name]
                    for row in ("lcp", "empty", "earlier"):
                        if row == "lcp":
                            out, stats = peers.generate(PEER_PLAIN, 0, tokens, 0.0, rep, max_tokens)
                        elif row == "empty":
                            empty.clear()
                            out, stats = ours(empty, history_estimates(), tokens)
                        else:
                            out, stats = ours(earlier, estimates, tokens)
                            updates.append(earlier.last_add_seconds)
                        runs.setdefault((bp.name, row), []).append(
                            Run(bp.name, bp.category, row, 0, rep, 0.0, out, stats.to_dict()))
                        if progress:
                            progress(f"{bp.name} {row}")
            report.costs = _history_costs(earlier, [ids[bp.name] + runs[(bp.name, "earlier")][-1].tokens
                                                    for bp in prompts], updates)
            c = earlier.counts
            report.store = {"records": c.records, "tokens": c.tokens, "bytes": c.bytes}
    finally:
        peers.close()
    margins: dict[tuple[int, ...], float] = {}
    for bp in prompts:
        lcp, empty_runs, earlier_runs = (runs[(bp.name, row)] for row in ("lcp", "empty", "earlier"))
        vs_empty = [_tps(r) / _tps(p) for r, p in zip(empty_runs, lcp, strict=True)]
        vs_earlier = [_tps(r) / _tps(p) for r, p in zip(earlier_runs, lcp, strict=True)]
        verdict, _ = _exactness(pair, ids[bp.name], lcp[0].tokens, empty_runs + earlier_runs, tie_margin, margins)
        rounds: dict[str, int] = {}
        for r in earlier_runs:
            for m, n in (r.stats["auto"] or {}).get("rounds", {}).items():
                rounds[m] = rounds.get(m, 0) + n
        report.rows.append(RelatedRow(
            prompt=bp.name, category=bp.category, lcp_tps=statistics.median(_tps(r) for r in lcp),
            empty_tps=statistics.median(_tps(r) for r in empty_runs),
            earlier_tps=statistics.median(_tps(r) for r in earlier_runs),
            speedup_empty=statistics.median(vs_empty), speedup_earlier=statistics.median(vs_earlier),
            speedup_earlier_min=min(vs_earlier), speedup_earlier_max=max(vs_earlier),
            history_drafted=sum(r.stats["drafted_by"].get(HISTORY.name, 0) for r in earlier_runs),
            history_accepted=sum(r.stats["accepted_by"].get(HISTORY.name, 0) for r in earlier_runs),
            rounds={m: n for m, n in rounds.items() if n}, exactness=verdict))
    report.mismatches = sum(row.exactness == "MISMATCH" for row in report.rows)
    report.machine = machine_info(pair, checksums)
    return report


def _history_costs(store: HistoryStore, contexts: list[list[int]], updates: list[float]) -> dict[str, float]:
    """Lookup time per round (every position of each request's prompt and reply) and update time per request."""
    drafter = HistoryDrafter(store.index)
    rng = np.random.default_rng(0)
    times = []
    for ctx in contexts:
        arr = np.asarray(ctx, dtype=np.int32)
        for n in range(2, len(arr) + 1):
            t0 = time.perf_counter()
            drafter.propose(arr[:n], 8, rng)
            times.append(time.perf_counter() - t0)
    return {"lookup_us_median": 1e6 * float(np.median(times)), "lookup_us_p99": 1e6 * float(np.percentile(times, 99)),
            "update_ms_median": 1e3 * float(np.median(updates)), "update_ms_max": 1e3 * float(max(updates))}


def render_related(report: RelatedReport) -> str:
    """The related-requests report as a terminal table."""
    out = ["Related requests, run in order. 'empty': auto with an empty history; 'earlier': auto with the history "
           "of the requests before it. Speedups are against llama-cpp-python plain (same file and threads), "
           "medians over repetitions.",
           f"{'request':<14} {'lcp tok/s':>9} {'empty':>6} {'earlier':>7} {'(min-max)':>11} "
           f"{'history accepted':>17}  exactness  rounds (earlier)"]
    out.append("-" * len(out[-1]))
    for row in report.rows:
        hist = f"{row.history_accepted}/{row.history_drafted}" if row.history_drafted else "-"
        out.append(f"{row.prompt:<14} {row.lcp_tps:>9.1f} {row.speedup_empty:>5.2f}x {row.speedup_earlier:>6.2f}x "
                   f"{f'({row.speedup_earlier_min:.2f}-{row.speedup_earlier_max:.2f})':>11} {hist:>17}  "
                   f"{row.exactness:<9}  " + " ".join(f"{m}:{n}" for m, n in row.rounds.items()))
    if report.rows:
        later = [r.speedup_earlier for r in report.rows]
        out += ["", f"with the earlier requests' history: median {statistics.median(later):.2f}x, worst "
                    f"{min(later):.2f}x; with an empty history: median "
                    f"{statistics.median(r.speedup_empty for r in report.rows):.2f}x"]
    c, st = report.costs, report.store
    if c:
        out.append(f"history lookup: median {c['lookup_us_median']:.0f} us, p99 {c['lookup_us_p99']:.0f} us per round; "
                   f"update: median {c['update_ms_median']:.1f} ms, max {c['update_ms_max']:.1f} ms per request; "
                   f"store after the workload: {st.get('records', 0)} records, {st.get('tokens', 0)} tokens, "
                   f"{st.get('bytes', 0) / 1e3:.1f} kB")
    if report.mismatches:
        out.append(f"\n{report.mismatches} MISMATCH(ES) against plain decoding: this is a bug, please report it.")
    return "\n".join(out)
