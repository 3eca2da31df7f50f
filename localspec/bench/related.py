"""The related-requests workload: what the history drafter is for, run in order against llama-cpp-python plain."""

from __future__ import annotations

import statistics
import time
from typing import Callable, Optional, Sequence

import numpy as np

from ..api import Pair
from ..drafting.estimates import history_estimates
from ..drafting.history import HistoryStore
from ..drafting.history.drafter import HistoryDrafter
from ..events import GenerationStats
from ..methods import AUTO, HISTORY
from ..options import GenerationOptions
from .exactness import TIE_MARGIN, batch_noise, worst_verdict
from .machine import machine_info
from .peers import PEER_PLAIN, PeerRunner
from .records import RelatedReport, RelatedRow, Run, tps
from .runner import fresh_generate, prompt_tokens, scratch_stores
from .suite import BenchPrompt


def run_related(pair: Pair, prompts: Sequence[BenchPrompt], *, reps: int = 3, max_tokens: int = 128,
                progress: Optional[Callable[[str], None]] = None, checksums: bool = True) -> RelatedReport:
    """Run related requests in order: llama-cpp-python plain, auto with an empty history, auto with
    the history of the requests before it (recorded as a user's would be), greedy.

    Each repetition starts the "earlier" store empty and auto's history estimates afresh, so request i
    always sees exactly requests 0..i-1 of the same repetition. The user's own store is not touched.
    """
    pair.calibrate()
    ids = {bp.name: prompt_tokens(pair, bp) for bp in prompts}
    noise = batch_noise(pair.target, ids[prompts[0].name])
    tie_margin = max(TIE_MARGIN, 2 * noise)
    peers = PeerRunner(pair.target)
    report = RelatedReport(settings={"reps": reps, "max_tokens": max_tokens, "tie_margin": tie_margin,
                                     "requests": [bp.name for bp in prompts],
                                     "peer": {"library": "llama-cpp-python Llama.generate", **peers.settings}})
    runs: dict[tuple[str, str], list[Run]] = {}
    updates: list[float] = []
    opts = GenerationOptions(max_tokens=max_tokens, method=AUTO.name)

    def ours(store: HistoryStore, estimates: dict, tokens: list[int]) -> tuple[list[int], GenerationStats]:
        pair.set_history(store, estimates)  # auto updates them in place: a repetition's requests share them
        return fresh_generate(pair, tokens, opts)

    try:
        with scratch_stores(pair, "empty", "earlier") as (empty, earlier):
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
            report.costs = history_costs(earlier, [ids[bp.name] + runs[(bp.name, "earlier")][-1].tokens
                                                    for bp in prompts], updates)
            c = earlier.counts
            report.store = {"records": c.records, "tokens": c.tokens, "bytes": c.bytes}
    finally:
        peers.close()
    margins: dict[tuple[int, ...], float] = {}
    report.rows = [related_row(pair, bp, ids[bp.name], [runs[(bp.name, row)] for row in ("lcp", "empty", "earlier")],
                               tie_margin, margins) for bp in prompts]
    report.mismatches = sum(row.exactness == "MISMATCH" for row in report.rows)
    report.machine = machine_info(pair, checksums)
    return report


def related_row(pair: Pair, bp: BenchPrompt, tokens: list[int], runs: list[list[Run]], tie_margin: float,
                margins: dict[tuple[int, ...], float]) -> RelatedRow:
    """One request's row from its llama-cpp-python, empty-history and earlier-history runs."""
    lcp, empty_runs, earlier_runs = runs
    vs_empty = [tps(r) / tps(p) for r, p in zip(empty_runs, lcp, strict=True)]
    vs_earlier = [tps(r) / tps(p) for r, p in zip(earlier_runs, lcp, strict=True)]
    verdict, _ = worst_verdict(pair.target, tokens, lcp[0].tokens, empty_runs + earlier_runs, tie_margin, margins)
    rounds: dict[str, int] = {}
    for r in earlier_runs:
        for m, n in (r.stats["auto"] or {}).get("rounds", {}).items():
            rounds[m] = rounds.get(m, 0) + n
    return RelatedRow(
        prompt=bp.name, category=bp.category, lcp_tps=statistics.median(tps(r) for r in lcp),
        empty_tps=statistics.median(tps(r) for r in empty_runs),
        earlier_tps=statistics.median(tps(r) for r in earlier_runs),
        speedup_empty=statistics.median(vs_empty), speedup_earlier=statistics.median(vs_earlier),
        speedup_earlier_min=min(vs_earlier), speedup_earlier_max=max(vs_earlier),
        history_drafted=sum(r.stats["drafted_by"].get(HISTORY.name, 0) for r in earlier_runs),
        history_accepted=sum(r.stats["accepted_by"].get(HISTORY.name, 0) for r in earlier_runs),
        rounds={m: n for m, n in rounds.items() if n}, exactness=verdict)


def history_costs(store: HistoryStore, contexts: list[list[int]], updates: list[float]) -> dict[str, float]:
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
