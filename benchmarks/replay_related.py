#!/usr/bin/env python3
"""What the history drafter could give on the related-requests workload, on this machine's costs and others'.

``localspec bench --related`` measures speed; this script explains it. It
decodes each request of the workload plainly once (greedy, cached in
``--outputs``), then replays the rounds offline with the real drafters and
the real auto policy: each round's draft is compared with the plain output,
and the round is charged what the cost profile says verifying it costs.
For every request it prints the predicted speedup over localspec plain:

* auto with an empty history and with the history of the requests before it
  (what the bench measures, up to the machine's noise);
* the **bound**: the fastest schedule of the same lookup and history drafts
  by a policy that knows in advance how much of each draft the target keeps,
  so no policy built on these drafters can beat it.

Both are computed for this machine's calibrated profile and for a flat one
(``--verify``, default verify(n) = 1 + 0.04 (n - 1) steps: what a GPU or Apple
silicon gives up to 9 tokens), which shows whether a shortfall is the policy's
or the machine's.

Usage:
    python benchmarks/replay_related.py TARGET.gguf [--threads N] [-n 128] [--outputs related.json]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import localspec
from localspec.bench import load_related
from localspec.drafting.costs import CostProfile
from localspec.drafting.replay import Recorded, bound, replay_auto


def plain_outputs(target: Path, threads: int | None, n: int, cache: Path) -> tuple[list[Recorded], CostProfile]:
    """Each request's prompt (text and tokens) and greedy reply (recorded once, ``bench.traces``), and this
    machine's cost profile."""
    from localspec.bench.traces import load, record, save

    pair = localspec.load(target, n_threads=threads, history=False)
    try:
        profile = pair.calibrate()
        meta = {"target": target.name, "target_bytes": target.stat().st_size, "workload": "related",
                "max_tokens": n}
        requests = load(cache, meta)
        if requests is None:
            requests = record(pair, load_related(), n, say=print)
            save(cache, requests, meta)
        return requests, profile
    finally:
        pair.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", type=Path)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("-n", "--max-tokens", type=int, default=128)
    ap.add_argument("--outputs", type=Path, default=Path("related-plain.json"),
                    help="cache of the plain replies (reused when it matches)")
    ap.add_argument("--verify", default=",".join(f"{1 + 0.04 * i:.2f}" for i in range(9)),
                    help="the other profile: verify(n)/verify(1) for n = 1..9")
    args = ap.parse_args()
    requests, here = plain_outputs(args.target, args.threads, args.max_tokens, args.outputs)
    flat = CostProfile.synthetic([float(x) for x in args.verify.split(",")], 0.1, name="given")
    rel = [v / here.verify[0] for v in here.verify]
    print(f"this machine: verify(n)/verify(1) = {' '.join(f'{x:.2f}' for x in rel)}")
    print(f"other profile: {args.verify}\n")
    cols = {}
    for name, profile in (("here", here), ("flat", flat)):
        cols[f"{name} empty"] = replay_auto(profile, requests, shared_history=False)
        cols[f"{name} earlier"] = replay_auto(profile, requests, shared_history=True)
        cols[f"{name} bound"] = bound(profile, requests)
    print("predicted speedup over localspec plain; 'earlier': auto with the earlier requests' history; "
          "'bound': the best schedule of the same drafts")
    print(f"{'request':<14} " + " ".join(f"{c:>13}" for c in cols))
    for i, req in enumerate(requests):
        print(f"{req.name:<14} " + " ".join(f"{cols[c][i]:>12.2f}x" for c in cols))
    print(f"{'median':<14} " + " ".join(f"{statistics.median(cols[c]):>12.2f}x" for c in cols))
    print(f"{'worst':<14} " + " ".join(f"{min(cols[c]):>12.2f}x" for c in cols))


if __name__ == "__main__":
    main()
