#!/usr/bin/env python3
"""What a bench run's measured acceptance would give on another machine's cost profile.

Reads the JSON written by ``localspec bench --json FILE`` and, for every
prompt, predicts each lookup/draft row's speedup over plain under a given
profile (default: GPU-like, verification flat up to 9 tokens and a draft step
at 0.1 of a target step), and the best choice auto would make there.

Usage:
    python scripts/predict_profile.py bench.json [--verify 1,1,1,1,1,1,1,1,1] [--draft 0.1]
"""

from __future__ import annotations

import argparse
import json

from localspec.bench import predicted_speedup
from localspec.costs import CostProfile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report")
    ap.add_argument("--verify", default="1,1,1,1,1,1,1,1,1", help="verify(n)/verify(1) for n = 1..9")
    ap.add_argument("--draft", type=float, default=0.1, help="draft step / target step")
    args = ap.parse_args()
    profile = CostProfile.synthetic([float(x) for x in args.verify.split(",")], args.draft, name="given")
    rows = json.load(open(args.report))["rows"]
    prompts = dict.fromkeys(r["prompt"] for r in rows)
    print(f"{'prompt':<15} {'method':<11} {'measured here':>13} {'predicted there':>15}")
    for prompt in prompts:
        best = ("plain", 1.0)
        for r in rows:
            if r["prompt"] != prompt or r["method"] not in ("lookup", "draft") or r["temperature"] != 0:
                continue
            pred = predicted_speedup(profile, r["method"], r["round_stats"]) or 1.0
            label = f"{r['method']} k={r['k']}"
            print(f"{prompt:<15} {label:<11} {r['speedup']:>12.2f}x {pred:>14.2f}x")
            if pred > best[1]:
                best = (label, pred)
        print(f"{prompt:<15} best there: {best[0]} ({best[1]:.2f}x)\n")


if __name__ == "__main__":
    main()
