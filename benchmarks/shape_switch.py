#!/usr/bin/env python3
"""Does a single-token step cost more right after a batch than right after another single step?

Auto mixes plain rounds (one token) with drafting rounds (a verification of
a few tokens) on the same model, and its plain rounds took a little more target
time than a plain generation's on the prompts where it mixed them. This
script loads the target once, fills its cache, and times single steps in two
orders, interleaved block by block: each right after a single step, and each
right after a batch of ``--k`` tokens (both cut back afterwards). Each
block's ratio of medians (after a batch / after a step) is summed up as a
geometric mean with a 95% interval over the blocks. llama.cpp reuses a
step's compute graph only when the batch keeps its shape; running with
``LLAMA_GRAPH_REUSE_DISABLE=1`` is the control (both orders then build one).

Usage:
    python benchmarks/shape_switch.py TARGET.gguf [--threads 2] [--context 400] [--k 3] [--blocks 20]
"""

from __future__ import annotations

import argparse
import statistics

from lockstep_check import filled_model, step_args, timed_eval  # a sibling script: run from anywhere

from localspec.bench.intervals import ratio_interval


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    step_args(ap, context=400, blocks=20)
    args = ap.parse_args()
    model, text, _ = filled_model(args)
    ratios, after_step, after_batch = [], [], []
    for _ in range(args.blocks):
        medians = []
        for before in (1, args.k):
            times = []
            for _ in range(args.per_block):
                timed_eval(model, text[:before], args.context)  # what the step follows
                times.append(timed_eval(model, text[:1], args.context))
            medians.append(statistics.median(times[1:]))  # the first: warm-up
        after_step.append(medians[0])
        after_batch.append(medians[1])
        ratios.append(medians[1] / medians[0])
    iv = ratio_interval(ratios)
    spread = f"{iv.low:.3f}-{iv.high:.3f}" if iv else "n/a"
    print(f"{args.threads} thread(s), {args.context} tokens of context: a single step after a {args.k}-token batch "
          f"{1000 * statistics.median(after_batch):.2f} ms, after a single step "
          f"{1000 * statistics.median(after_step):.2f} ms; ratio {iv.mean if iv else float('nan'):.3f} ({spread})")
    model.close()


if __name__ == "__main__":
    main()
