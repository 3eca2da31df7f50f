#!/usr/bin/env python3
"""Predicted speedups on any machine's costs, from acceptance recorded once on this one.

Two steps:

``record``: decode every prompt of the bench suite (with ``--related``, the
related-requests workload, in order; with ``--prompts``, a JSONL file of the
suite's form) plainly and greedily with the real
pair, and record the draft model's guess after every prefix of each reply by
one teacher-forced pass (``localspec.bench.traces``). Greedy acceptance does
not depend on the hardware, so this runs on a CPU.

``predict``: replay the recordings round by round through the real drafters
and the real auto policy (``localspec.drafting.replay``) on a cost profile: this
machine's, one measured elsewhere (the ``calibration`` of
``benchmarks/gpu_check.py``'s JSON, or ``localspec calibrate --json``), or
ratios given with ``--verify``. It prints, per prompt, the predicted speedup
over plain decoding of each fixed method and K and of auto, and the medians.
These are predictions from measured costs and recorded acceptance, not
measurements: label them so.

The recordings of the real Qwen2.5-Coder 1.5B/0.5B pair, for the suite and
the related workload, are kept in ``benchmarks/traces/``.

Usage:
    python benchmarks/replay.py record TARGET.gguf --draft DRAFT.gguf [--related | --prompts F.jsonl] [-n 128] \
        --out traces.json
    python benchmarks/replay.py predict traces.json --profile gpu_check.json
    python benchmarks/replay.py predict traces.json --verify 1,1.54,1.94,2.03,2.59 --draft-step 0.3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from localspec.drafting.costs import CostProfile
from localspec.drafting.replay import Overhead, Recorded, replay_auto, replay_method
from localspec.methods import AUTO_KMAX

FIXED = [("lookup", 2), ("lookup", 4), ("lookup", 8), ("history", 4), ("draft", 1), ("draft", 2), ("draft", 4),
         ("draft", 8)]


def record(args: argparse.Namespace) -> None:
    import localspec
    from localspec.bench import load_related, load_suite
    from localspec.bench.traces import record as record_traces
    from localspec.bench.traces import save
    from localspec.errors import ConfigError

    try:
        prompts = load_related() if args.related else load_suite(args.prompts)
    except ConfigError as exc:  # a --prompts file that cannot be read, or a line that is not a prompt
        sys.exit(f"replay.py: {exc}")
    with localspec.load(args.target, args.draft, n_threads=args.threads, history=False) as pair:
        recorded = record_traces(pair, prompts, args.max_tokens, say=print)
    import datetime

    import llama_cpp

    meta = {"target": args.target.name, "draft": args.draft.name if args.draft else None,
            "target_bytes": args.target.stat().st_size,
            "draft_bytes": args.draft.stat().st_size if args.draft else None,
            "workload": "related" if args.related else args.prompts.name if args.prompts else "suite",
            "max_tokens": args.max_tokens,
            "llama_cpp_python": llama_cpp.__version__, "recorded": datetime.date.today().isoformat() + ", greedy"}
    save(args.out, recorded, meta)
    print(f"wrote {args.out}")


def profile_from(args: argparse.Namespace) -> CostProfile:
    """The cost profile to predict on: a JSON file's, or ratios to one step."""
    if args.verify:
        ratios = [float(x) for x in args.verify.split(",")]
        return CostProfile.synthetic(ratios, args.draft_step, name=f"given: verify {args.verify}")
    data: dict[str, Any] = json.loads(args.profile.read_text())
    data = data.get("calibration", data)  # gpu_check.json nests it; `localspec calibrate --json` does not
    return CostProfile(list(data["verify_seconds"]), float(data.get("draft_step_seconds") or 0.0),
                       float(data.get("lookup_seconds") or 2e-5), f"measured: {args.profile}")


def overhead_from(args: argparse.Namespace) -> Overhead:
    """Python time per round: given, or the GPU check's whole-generation figures (plain, and auto's rounds)."""
    if args.overhead_ms is not None:
        return Overhead(args.overhead_ms / 1000, args.overhead_ms / 1000)
    if args.profile is None:
        return Overhead()
    generation = json.loads(args.profile.read_text()).get("overheads", {}).get("generation", {})
    plain, auto = (generation.get(m, {}).get("python_ms_per_round") for m in ("plain", "auto"))
    return Overhead((plain or 0.0) / 1000, (auto or plain or 0.0) / 1000)


def predict(args: argparse.Namespace) -> None:
    from localspec.bench.traces import load

    requests = load(args.traces)
    if requests is None:
        sys.exit(f"{args.traces}: not a recording of this version; run `record` again.")
    profile, overhead = profile_from(args), overhead_from(args)
    rel = [v / profile.verify[0] for v in profile.verify]
    print(f"profile ({profile.source}): verify(n)/verify(1) = {' '.join(f'{x:.2f}' for x in rel)}"
          f"; draft step / target step = {profile.draft_step / profile.verify[0]:.2f}; Python per round: "
          f"{1000 * overhead.plain:.2f} ms plain, {1000 * overhead.drafted:.2f} ms drafted")
    has_draft = all(r.draft_next is not None for r in requests)
    cols: dict[str, list[float]] = {}
    for method, k in FIXED:
        if k <= profile.kmax and (method != "draft" or has_draft):
            cols[f"{method} {k}"] = replay_method(profile, requests, method, k, overhead)
    kmax = min(AUTO_KMAX, profile.kmax)
    cols["auto"] = replay_auto(profile, requests, shared_history=False, kmax=kmax, overhead=overhead)
    cols["auto+hist"] = replay_auto(profile, requests, shared_history=True, kmax=kmax, overhead=overhead)
    table(requests, cols)
    if args.json:
        args.json.write_text(json.dumps({
            "profile": profile.source, "verify_relative": rel, "overhead_seconds": vars(overhead),
            "requests": [r.category + " " + r.name for r in requests], "predicted": cols,
            "median": {c: statistics.median(v) for c, v in cols.items()}}, indent=1))


def table(requests: list[Recorded], cols: dict[str, list[float]]) -> None:
    print("predicted speedup over plain decoding (recorded acceptance x the profile's costs); "
          "auto+hist: with the earlier requests' history")
    print(f"{'prompt':<22} " + " ".join(f"{c:>9}" for c in cols))
    for i, req in enumerate(requests):
        print(f"{(req.category + ' ' + req.name)[:22]:<22} " + " ".join(f"{cols[c][i]:>8.2f}x" for c in cols))
    print(f"{'median':<22} " + " ".join(f"{statistics.median(cols[c]):>8.2f}x" for c in cols))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="decode the workload once and record what each drafter would get")
    rec.add_argument("target", type=Path)
    rec.add_argument("--draft", type=Path, default=None)
    which = rec.add_mutually_exclusive_group()
    which.add_argument("--related", action="store_true", help="the related-requests workload, not the suite")
    which.add_argument("--prompts", type=Path, default=None, help="a JSONL file of prompts in the suite's form")
    rec.add_argument("--threads", type=int, default=None)
    rec.add_argument("-n", "--max-tokens", type=int, default=128)
    rec.add_argument("--out", type=Path, required=True)
    pre = sub.add_parser("predict", help="predicted speedups of every method and auto on a cost profile")
    pre.add_argument("traces", type=Path)
    src = pre.add_mutually_exclusive_group(required=True)
    src.add_argument("--profile", type=Path, help="JSON with verify_seconds (and draft_step_seconds)")
    src.add_argument("--verify", help="verify(n)/verify(1) for n = 1, 2, ..., comma-separated")
    pre.add_argument("--draft-step", type=float, default=0.3, help="with --verify: a draft step / a target step")
    pre.add_argument("--overhead-ms", type=float, default=None,
                     help="Python milliseconds per round (default: the --profile file's, if it has them; else 0)")
    pre.add_argument("--json", type=Path, default=None, help="also write the predictions to this JSON file")
    args = ap.parse_args()
    if args.command == "record":
        record(args)
    else:
        predict(args)


if __name__ == "__main__":
    main()
