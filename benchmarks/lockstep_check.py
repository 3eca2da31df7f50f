#!/usr/bin/env python3
"""Lockstep's assumption: does a step cost more right after another model's step than after its own?

`localspec bench --lockstep` runs each repetition's rows a token of each in
turn, each on a model of its own, so every step it times comes right after
another model's step, whose context (KV cache, compute buffers) has taken the
CPU caches. Run one after another, a row's steps follow its own. This script
loads the target twice (A and B, as the bench's twins are) with the same
context filled in both, and times A's evaluations of 1 token and of K tokens
(a verification) in two orders, interleaved block by block:

* alone: A's evaluations back to back, as in a run by itself;
* after the other: each of A's evaluations right after one of B's single steps,
  as in lockstep.

Each block gives the median of each order; the ratio after/alone per block is
summed up as a geometric mean with a 95% interval over the blocks. A ratio
above 1 for single steps and near 1 for batches means lockstep charges plain
steps more than verifications: it favours rows that verify batches (lookup,
auto's drafting rounds) over rows that do not, by at most that ratio.

Usage:
    python benchmarks/lockstep_check.py TARGET.gguf [--threads 2] [--context 300] [--k 3] [--blocks 16]
"""

from __future__ import annotations

import argparse
import statistics
import time

from localspec.bench.intervals import ratio_interval
from localspec.errors import LocalspecError
from localspec.runtime import memory
from localspec.runtime.model import Model

#: What fills the context: its words do not matter to a step's cost, only their number.
_FILLER = ("A step of a transformer reads every weight once and the cache of every token before it; "
           "what it costs depends on how many tokens it evaluates and how many it attends to. ")


def timed_eval(model: Model, tokens: list[int], keep: int) -> float:
    """Seconds to evaluate ``tokens`` after the first ``keep`` positions, which are kept afterwards."""
    start = time.perf_counter()
    model.eval(tokens, logits="all")
    elapsed = time.perf_counter() - start
    model.truncate(keep)
    return elapsed


def step_args(ap: argparse.ArgumentParser, context: int, blocks: int) -> None:
    """The arguments every step-order check takes (this script's, ``shape_switch.py``'s)."""
    ap.add_argument("target")
    ap.add_argument("--threads", type=int, default=2, help="threads for steps and batches alike")
    ap.add_argument("--context", type=int, default=context, help="tokens already in the cache")
    ap.add_argument("--k", type=int, default=3, help="tokens in a batch, at least 2 (a verification of K-1 guesses)")
    ap.add_argument("--blocks", type=int, default=blocks, help="interleaved blocks of each order")
    ap.add_argument("--per-block", type=int, default=6, help="evaluations per order in a block (the first not kept)")


def filled_model(args: argparse.Namespace) -> tuple[Model, list[int], list[int]]:
    """The target loaded with ``args``' threads and ``args.context`` tokens of filler in its cache; the filler's
    tokens (one repetition of the text, what batches are cut from), and the context's."""
    if args.k < 2:
        raise SystemExit(f"--k is the batch's size, at least 2; got {args.k}.")
    try:
        model = Model(args.target, n_ctx=max(1024, args.context + 64), n_threads=args.threads,
                      n_threads_batch=args.threads)
    except LocalspecError as e:  # a missing or unreadable file: its one sentence, not a traceback
        raise SystemExit(str(e)) from None
    kind = model.memory.kind
    if kind != memory.FULL:  # cutting a recurrent state back evaluates tokens again, untimed
        model.close()
        raise SystemExit(f"{args.target}: its memory ({kind}) cannot be cut back in place; "
                         "give a model with an attention cache only.")
    text = model.tokenize(_FILLER, add_special=False)
    context = (text * (args.context // len(text) + 1))[:args.context]
    model.eval(context, logits="none")
    return model, text, context


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    step_args(ap, context=300, blocks=16)
    args = ap.parse_args()
    a, text, context = filled_model(args)
    b = a.reopen()
    b.eval(context, logits="none")
    ratios: dict[int, list[float]] = {1: [], args.k: []}
    medians: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.blocks):
        for n in ratios:
            batch = text[:n]
            # the first of each order is not kept: it follows a change of batch shape, so llama.cpp builds a graph
            alone = [timed_eval(a, batch, args.context) for _ in range(args.per_block)][1:]
            after = []
            for _ in range(args.per_block):
                timed_eval(b, text[:1], args.context)  # the other model's step, as lockstep's previous row
                after.append(timed_eval(a, batch, args.context))
            after = after[1:]
            ratios[n].append(statistics.median(after) / statistics.median(alone))
            medians.setdefault(("alone", n), []).append(statistics.median(alone))
            medians.setdefault(("after", n), []).append(statistics.median(after))
    print(f"{args.threads} thread(s), {args.context} tokens of context, {args.blocks} blocks of "
          f"{args.per_block - 1} timed evaluations per order")
    for n, rs in ratios.items():
        iv = ratio_interval(rs)
        spread = f"{iv.low:.3f}-{iv.high:.3f}" if iv else "n/a"
        print(f"  {n} token(s): alone {1000 * statistics.median(medians[('alone', n)]):.2f} ms, after the other "
              f"model's step {1000 * statistics.median(medians[('after', n)]):.2f} ms; after/alone "
              f"{iv.mean if iv else float('nan'):.3f} ({spread})")
    for model in (b, a):
        model.close()


if __name__ == "__main__":
    main()
