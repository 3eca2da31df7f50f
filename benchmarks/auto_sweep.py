#!/usr/bin/env python3
"""Auto against plain and a fixed prompt lookup, replayed on several machines' verification curves.

A change to auto's policy moves a generation's speed by a few percent, less than a shared VM's noise
between two runs, so it is judged here first: every recorded request (``benchmarks/replay.py record``)
is replayed through the real auto policy on each curve, the same requests ``--reps`` times in a row with
one cost correction kept across all of them, as a pair keeps it through a bench (so auto's realized-gain
bets and cost evidence count as they do for a user). Each request's auto is set against the better of
plain decoding and localspec's lookup with K = 2, which stands in for llama-cpp-python's fastest row
(its own lookup matches at most 2-grams), as issue 29 asks.

These are predictions from recorded acceptance and measured costs, not measurements: the rounds cost what
each curve says, without the machine's noise. A policy change is worth a real run (``localspec bench``
with ``--width``) only where this shows it.

Usage:
    python benchmarks/auto_sweep.py benchmarks/traces/traces-suite-96.json benchmarks/traces/traces-related.json
    (traces-suite.json is the older eight-prompt suite at 128 tokens: the same prompts, so not with the 96)
    python benchmarks/auto_sweep.py TRACES.json --verify 1,1.6,2.2,2.9 --draft-step 0.5 --reps 3
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from localspec.costs import CostCorrection, CostProfile
from localspec.replay import Recorded, replay_auto, replay_method

#: verify(n)/verify(1) measured on the 2-core machines the README's figures come from (``localspec calibrate``,
#: or 40 interleaved passes), and a draft step over a target step; the last curve is a GPU-like one, made up.
CURVES = {
    "2-core, 2 threads, 40 passes": ([1, 1.84, 2.36, 3.05, 3.76, 4.38, 5.01, 6.84, 7.37], 0.60),
    "2-core, 2 threads (issue 29)": ([1, 1.66, 2.45, 2.92, 3.83, 4.43, 4.88, 7.23, 8.25], 0.57),
    "2-core, 1 thread": ([1, 2.01, 2.71, 3.03, 3.93, 4.55, 4.92, 7.20, 9.93], 0.60),
    "2-core, 2 threads, quiet": ([1, 1.75, 2.24, 3.04, 3.34, 3.98, 4.40, 6.24, 6.37], 0.59),
    "2-core, 2 threads, cheap": ([1, 1.55, 2.04, 2.58, 2.68, 3.00, 3.50, 5.43, 5.75], 0.60),
    "2-core, 2 threads, 12-02": ([1, 1.63, 2.17, 2.67, 3.21, 3.87, 4.36, 5.76, 6.15], 0.57),
    "2-core, 1 thread, 12-02": ([1, 1.99, 2.96, 3.69, 4.41, 5.29, 6.38, 8.29, 8.94], 0.55),
    "memory-bound GPU": ([1, 1.03, 1.05, 1.08, 1.10, 1.12, 1.15, 1.20, 1.25], 0.15),
}


def sweep(requests: list[Recorded], verify: list[float], draft_step: float,
          reps: int) -> list[tuple[str, float, float]]:
    """Per request: auto's predicted speedup over plain (the median of ``reps`` passes, the first one with
    nothing learnt yet included) and lookup K=2's."""
    profile = CostProfile.synthetic(verify, draft_step)
    correction = CostCorrection()
    passes = [replay_auto(profile, requests, False, correction=correction) for _ in range(reps)]
    lookup = replay_method(profile, requests, "lookup", 2)
    return [(req.name, statistics.median(p[i] for p in passes), lookup[i]) for i, req in enumerate(requests)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", type=Path, nargs="+", help="recordings from benchmarks/replay.py record")
    ap.add_argument("--verify", help="one curve instead of the built-in ones: verify(n)/verify(1), comma-separated")
    ap.add_argument("--draft-step", type=float, default=0.6, help="with --verify: a draft step / a target step")
    ap.add_argument("--reps", type=int, default=3, help="passes over the requests, one correction kept across them")
    ap.add_argument("--floor", type=float, default=0.98, help="list the requests where auto falls below this")
    ap.add_argument("-v", "--verbose", action="store_true", help="every request's figures")
    args = ap.parse_args()
    requests = [Recorded(**r) for path in args.traces for r in json.loads(path.read_text())["requests"]]
    if not requests:
        sys.exit("auto_sweep: the recordings hold no requests; record some with benchmarks/replay.py record.")
    curves = {"given": ([float(x) for x in args.verify.split(",")], args.draft_step)} if args.verify else CURVES
    print(f"{len(requests)} recorded requests, {args.reps} passes each; auto / max(plain, lookup K=2), predicted")
    for name, (verify, draft_step) in curves.items():
        rows = sweep(requests, verify, draft_step, args.reps)
        rel = [auto / max(1.0, lookup) for _, auto, lookup in rows]
        geo = math.exp(statistics.fmean(math.log(r) for r in rel))
        auto_geo = math.exp(statistics.fmean(math.log(a) for _, a, _ in rows))
        ranked = sorted(zip(rows, rel, strict=True), key=lambda x: x[1])
        low = [f"{n} {r:.2f}" for (n, _, _), r in ranked if r < args.floor]
        print(f"{name:30s} auto {auto_geo:.3f}x plain; against the better row {geo:.3f} (geometric mean), "
              f"below {args.floor}: {len(low)}/{len(rows)}{': ' + ', '.join(low) if low else ''}")
        if args.verbose:
            for (n, auto, lookup), r in zip(rows, rel, strict=True):
                print(f"    {n:20s} auto {auto:.3f}  lookup 2 {lookup:.3f}  auto / better {r:.3f}")


if __name__ == "__main__":
    main()
