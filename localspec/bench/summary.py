"""From runs to rows: speedups against both plain decodings, exactness, and the cost model's predictions."""

from __future__ import annotations

import statistics
from typing import Mapping, Optional

from ..api import Pair
from ..constraint import Constraint
from ..drafting.costs import CostProfile, predicted_round_seconds, predicted_speedup
from ..events import SOURCE_GRAMMAR
from ..methods import PLAIN, REGISTRY
from ..reasoning.formats import REASONING
from .exactness import worst_verdict
from .intervals import Interval, ratio_interval
from .peers import PEER_METHODS, PEER_PLAIN
from .records import Row, Run, tps
from .suite import MethodSpec


def summarise(pair: Pair, prompt_ids: dict[str, list[int]], runs: list[Run], profile: CostProfile,
              tie_margin: float, constraints: Optional[Mapping[str, Constraint]] = None) -> list[Row]:
    """The rows of a run. On the prompts with ``constraints`` localspec's rows are judged by the margins the
    constraint leaves, and the peers' tokens are not compared (they decode under their own grammar engine's
    version of it, see ``structured``)."""
    constraints = constraints or {}
    rows = []
    margins: dict[tuple[int, ...], float] = {}
    by_key = by_row(runs)

    for (name, method, k, temperature, history), group in by_key.items():
        plain = by_key[(name, PLAIN.name, 0, temperature, True)]
        peer = by_key.get((name, PEER_PLAIN, 0, temperature, True))
        speedups, vs_peer = paired_ratios(group, plain), paired_ratios(group, peer)
        last = group[-1].stats
        drafted = sum(r.stats["drafted"] for r in group)
        accepted = sum(r.stats["accepted"] for r in group)
        merged = {key: sum(r.stats[key] for r in group)
                  for key in ("rounds", "empty_rounds", "rejected_rounds", "drafted", "accepted")}
        exactness, divergence, exactness_peer = "-", None, "-"

        foreign = name in constraints  # the peers decode under another engine's grammar: not compared
        if temperature == 0 and not (foreign and method in PEER_METHODS):
            matcher = pair.assembly.matcher(constraints[name]) if foreign and method != PLAIN.name else None
            exactness, divergence = ("reference", None) if method == PLAIN.name else worst_verdict(
                pair.target, prompt_ids[name], plain[0].tokens, group, tie_margin, margins, matcher)
        if temperature == 0 and peer is not None and not foreign:
            exactness_peer = "reference" if method == PEER_PLAIN else worst_verdict(
                pair.target, prompt_ids[name], peer[0].tokens, group, tie_margin, margins)[0]
        rows.append(Row(
            prompt=name, category=group[0].category, method=method, k=k, temperature=temperature, history=history,
            decode_tps=statistics.median(tps(r) for r in group),
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
            round_ms=per_round(sum(r.stats["decode_seconds"] for r in group), merged["rounds"]),
            round_ms_predicted=per_round(sum(predicted_round_seconds(profile, r.stats) for r in group),
                                          merged["rounds"]),
            round_ms_predicted_here=None if method in (PLAIN.name, *PEER_METHODS) else per_round(
                sum(predicted_round_seconds(profile, r.stats) * plain_step(plain, r.rep) / profile.verify[0]
                    for r in group), merged["rounds"]),
            speedup_peer=statistics.median(vs_peer) if vs_peer else None,
            speedup_peer_min=min(vs_peer) if vs_peer else None,
            speedup_peer_max=max(vs_peer) if vs_peer else None,
            exactness_peer=exactness_peer,
            round_split_ms=None if method in PEER_METHODS else round_split(group, merged["rounds"]),
            round_time_by=None if method in PEER_METHODS else round_time_by(group),
            speedup_interval=_bounds(ratio_interval(speedups)) if method != PLAIN.name else None,
            speedup_peer_interval=_bounds(ratio_interval(vs_peer)) if method != PEER_PLAIN else None,
            forced_share=forced_share(group),
            acceptance_in=acceptance_in(group),
        ))
        _against_fastest_peer(rows[-1], group, by_key)
    return rows


def forced_share(group: list[Run]) -> Optional[float]:
    """The share of the generated tokens drafted for free because a grammar forced them (None: none were)."""
    forced = sum(r.stats.get("accepted_by", {}).get(SOURCE_GRAMMAR, 0) for r in group)
    generated = sum(r.stats["generated_tokens"] for r in group)
    return forced / generated if forced and generated else None


def acceptance_in(group: list[Run]) -> Optional[dict[str, dict[str, int]]]:
    """Drafted and accepted tokens inside the reasoning and in the answer, over a row's repetitions (None where
    no round began inside a reasoning, as from a model that does not reason, or a peer's row)."""
    phases: dict[str, dict[str, int]] = {}
    for run in group:
        for key, count in (("drafted_in", "drafted"), ("accepted_in", "accepted")):
            for phase, n in run.stats.get(key, {}).items():
                phases.setdefault(phase, {"drafted": 0, "accepted": 0})[count] += n
    return phases if REASONING in phases else None


def by_row(runs: list[Run]) -> dict[tuple, list[Run]]:
    """Runs grouped by the row they belong to: (prompt, method, k, temperature, history)."""
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        groups.setdefault((run.prompt, run.method, run.k, run.temperature, run.history), []).append(run)
    return groups


def adaptive(method: str) -> bool:
    """Whether ``method`` chooses among the others each round (auto), so the fastest peer row is its mark."""
    return bool(getattr(REGISTRY.find(method), "adaptive", False))


def round_split(group: list[Run], rounds: int) -> Optional[dict[str, float]]:
    """Decode time per round over a row's repetitions, in ms: target, draft models, the rest."""
    if not rounds:
        return None
    target, draft, decode, llama = (sum(r.stats[key] for r in group) for key in
                                    ("target_seconds", "draft_seconds", "decode_seconds", "llama_seconds"))
    return {"target": 1000 * target / rounds, "draft": 1000 * draft / rounds,
            "python": 1000 * (decode - llama) / rounds}


def round_time_by(group: list[Run]) -> dict[str, dict[str, float]]:
    """Rounds of each kind over a row's repetitions, their tokens per round, and their mean time in ms: whole,
    target, draft."""
    sums: dict[str, dict[str, float]] = {}
    for run in group:
        for kind, t in run.stats.get("round_time_by", {}).items():
            acc = sums.setdefault(kind, {"rounds": 0, "tokens": 0, "seconds": 0.0, "target": 0.0, "draft": 0.0})
            for key in acc:
                acc[key] += t[key]
    return {kind: {"rounds": t["rounds"], "tokens_per_round": t["tokens"] / t["rounds"],
                   "ms": 1000 * t["seconds"] / t["rounds"], "target_ms": 1000 * t["target"] / t["rounds"],
                   "draft_ms": 1000 * t["draft"] / t["rounds"]}
            for kind, t in sums.items() if t["rounds"]}


def paired_ratios(group: list[Run], reference: Optional[list[Run]]) -> list[float]:
    """Decode speed over the reference's, repetition by repetition (the two ran side by side)."""
    ref = {r.rep: r for r in reference or []}
    return [tps(r) / tps(ref[r.rep]) for r in group if r.rep in ref and tps(ref[r.rep]) > 0]


def fastest_peer(by_key: dict[tuple, list[Run]], prompt: str, temperature: float) -> Optional[tuple[str, list[Run]]]:
    """llama-cpp-python's fastest row on a prompt (by median speed over repetitions): its key and runs."""
    peers = [(key, group) for key, group in by_key.items()
             if key[0] == prompt and key[1] in PEER_METHODS and key[3] == temperature]
    if not peers:
        return None
    key, group = max(peers, key=lambda kg: statistics.median(tps(r) for r in kg[1]))
    return MethodSpec(key[1], key[2]).label, group


def _against_fastest_peer(row: Row, group: list[Run], by_key: dict[tuple, list[Run]]) -> None:
    """For an adaptive method's row, its speed against the fastest llama-cpp-python row, repetition by repetition."""
    if not adaptive(row.method):
        return
    fastest = fastest_peer(by_key, row.prompt, row.temperature)
    if fastest is None:
        return
    ratios = paired_ratios(group, fastest[1])
    if ratios:
        row.vs_fastest_peer = statistics.median(ratios)
        row.vs_fastest_peer_interval = _bounds(ratio_interval(ratios))
        row.fastest_peer = fastest[0]


def widest_interval(runs: list[Run]) -> float:
    """The widest relative 95% interval among one prompt's ratios: every row against llama-cpp-python
    plain and localspec plain, adaptive rows against the fastest llama-cpp-python row (inf until each
    has two repetitions)."""
    by_key = by_row(runs)
    widths = []
    for (prompt, method, _k, temperature, _h), group in by_key.items():
        references = [by_key.get((prompt, PLAIN.name, 0, temperature, True)),
                      by_key.get((prompt, PEER_PLAIN, 0, temperature, True))]
        if adaptive(method):
            fastest = fastest_peer(by_key, prompt, temperature)
            references.append(fastest[1] if fastest else None)
        for reference in references:
            if reference is not None and reference is not group:
                interval = ratio_interval(paired_ratios(group, reference))
                widths.append(interval.width if interval is not None else float("inf"))
    return max(widths, default=0.0)


def _bounds(interval: Optional[Interval]) -> Optional[tuple[float, float]]:
    """An interval's bounds for the report, from three repetitions on (two give one too wide to read)."""
    return (interval.low, interval.high) if interval is not None and interval.n >= 3 else None


def plain_step(plain: list[Run], rep: int) -> float:
    """Seconds per round of localspec's plain run in repetition ``rep`` (one target step)."""
    run = next(r for r in plain if r.rep == rep)
    return float(run.stats["decode_seconds"]) / max(1, run.stats["rounds"])


def per_round(seconds: float, rounds: int) -> Optional[float]:
    return 1000 * seconds / rounds if rounds else None
