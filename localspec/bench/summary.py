"""From runs to rows: speedups against both plain decodings, exactness, and the cost model's predictions."""

from __future__ import annotations

import statistics
from typing import Optional

from ..api import Pair
from ..costs import CostProfile, predicted_round_seconds, predicted_speedup
from ..methods import PLAIN
from .exactness import worst_verdict
from .peers import PEER_METHODS, PEER_PLAIN
from .records import Row, Run, tps


def summarise(pair: Pair, prompt_ids: dict[str, list[int]], runs: list[Run], profile: CostProfile,
               tie_margin: float) -> list[Row]:
    rows = []
    margins: dict[tuple[int, ...], float] = {}
    by_key: dict[tuple, list[Run]] = {}
    for run in runs:
        by_key.setdefault((run.prompt, run.method, run.k, run.temperature, run.history), []).append(run)

    def ratios(group: list[Run], reference: Optional[list[Run]]) -> list[float]:
        """Decode speed over the reference's, repetition by repetition."""
        ref = {r.rep: r for r in reference or []}
        return [tps(r) / tps(ref[r.rep]) for r in group if r.rep in ref and tps(ref[r.rep]) > 0]

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
            exactness, divergence = ("reference", None) if method == PLAIN.name else worst_verdict(
                pair.target, prompt_ids[name], plain[0].tokens, group, tie_margin, margins)
            if peer is not None:
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
        ))
    return rows


def plain_step(plain: list[Run], rep: int) -> float:
    """Seconds per round of localspec's plain run in repetition ``rep`` (one target step)."""
    run = next(r for r in plain if r.rep == rep)
    return float(run.stats["decode_seconds"]) / max(1, run.stats["rounds"])


def per_round(seconds: float, rounds: int) -> Optional[float]:
    return 1000 * seconds / rounds if rounds else None
