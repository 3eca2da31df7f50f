#!/usr/bin/env python3
"""Auto against plain and a fixed prompt lookup, replayed on several machines' verification curves.

A change to auto's policy moves a generation's speed by a few percent, less than a shared VM's noise
between two runs, so it is judged here first: every recorded request (``benchmarks/replay.py record``)
is replayed through the real auto policy on each curve, the same requests ``--reps`` times in a row with
one cost correction kept across all of them, as a pair keeps it through a bench (so auto's realized-gain
bets and cost evidence count as they do for a user). Each request's auto is set against the better of
plain decoding and localspec's lookup with K = 2, which stands in for llama-cpp-python's fastest row
(its own lookup matches at most 2-grams): the bar auto is held to.

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

from localspec.drafting.costs import CostCorrection, CostProfile
from localspec.drafting.drafters import PromptLookupDrafter
from localspec.drafting.replay import Recorded, Round, auto_rounds, replay_auto_median, replay_method, replay_rounds

#: verify(n)/verify(1) and a draft step over a target step, per machine: the measured 2-core curves and GPU-like
#: ones, made up (one file, which tests/drafting/test_replay.py reads too).
CURVES_FILE = Path(__file__).resolve().parent / "traces" / "curves.json"


def load_curves() -> dict[str, tuple[list[float], float]]:
    """The curves in ``CURVES_FILE``, by name."""
    return {c["name"]: ([float(v) for v in c["verify"]], float(c["draft_step"]))
            for c in json.loads(CURVES_FILE.read_text())["curves"]}


def sweep(requests: list[Recorded], verify: list[float], draft_step: float, reps: int,
          correction: CostCorrection | None = None) -> list[tuple[str, float, float]]:
    """Per request: auto's predicted speedup over plain (the median of ``reps`` passes, the first one with
    nothing learnt yet included) and lookup K=2's; ``correction``: the one kept across the passes (a new one)."""
    profile = CostProfile.synthetic(verify, draft_step)
    auto = replay_auto_median(profile, requests, reps, correction)
    lookup = replay_method(profile, requests, "lookup", 2)
    return [(req.name, auto[i], lookup[i]) for i, req in enumerate(requests)]


def shown(rounds: list[Round]) -> str:
    """Rounds in one line: ``.`` a plain one, ``l3/4`` a lookup round that kept 3 of its 4 tokens."""
    return "".join(f" {r.by[0]}{r.kept}/{r.drafted} " if r.by else "." for r in rounds)


def show_rounds(req: Recorded, verify: list[float], draft_step: float, correction: CostCorrection) -> None:
    """Auto's rounds on one request after the sweep's passes (``correction`` as they left it), and lookup K=2's."""
    profile = CostProfile.synthetic(verify, draft_step)
    print(f"    {req.name} auto:     {shown(auto_rounds(profile, req, correction=correction))}")
    print(f"    {req.name} lookup 2: {shown(replay_rounds(req, PromptLookupDrafter(), 2))}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", type=Path, nargs="+", help="recordings from benchmarks/replay.py record")
    ap.add_argument("--verify", help="one curve instead of the built-in ones: verify(n)/verify(1), comma-separated")
    ap.add_argument("--draft-step", type=float, default=0.6, help="with --verify: a draft step / a target step")
    ap.add_argument("--reps", type=int, default=3, help="passes over the requests, one correction kept across them")
    ap.add_argument("--floor", type=float, default=0.98, help="list the requests where auto falls below this")
    ap.add_argument("-v", "--verbose", action="store_true", help="every request's figures")
    ap.add_argument("--rounds", metavar="NAME", action="append", default=[],
                    help="also print auto's rounds on this request (e.g. doc-qa#2) on each curve, after the passes")
    args = ap.parse_args()
    requests = [Recorded(**r) for path in args.traces for r in json.loads(path.read_text())["requests"]]
    if not requests:
        sys.exit("auto_sweep: the recordings hold no requests; record some with benchmarks/replay.py record.")
    curves = {"given": ([float(x) for x in args.verify.split(",")], args.draft_step)} if args.verify else load_curves()
    print(f"{len(requests)} recorded requests, {args.reps} passes each; auto / max(plain, lookup K=2), predicted")
    for name, (verify, draft_step) in curves.items():
        correction = CostCorrection()
        rows = sweep(requests, verify, draft_step, args.reps, correction)
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
        for req in (r for r in requests if r.name in args.rounds):
            show_rounds(req, verify, draft_step, correction)


if __name__ == "__main__":
    main()
