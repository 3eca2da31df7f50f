"""What an idle sequence's cells cost the others: single-token decodes of one sequence, with and without
another sequence holding cells in the same unified cache (llama.cpp attends over every cell up to the
highest in use), repetitions interleaved.

    python benchmarks/idle_cells.py TARGET.gguf [--ctx 32768] [--threads 2] [--own 2700] [--idle 2100]
        [--tokens 24] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from localspec.runtime.model import Model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target")
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--own", type=int, default=2700, help="tokens the decoding sequence holds")
    ap.add_argument("--idle", type=int, default=2100, help="tokens the idle sequence holds")
    ap.add_argument("--tokens", type=int, default=24, help="single-token decodes timed each time")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    with Model(args.target, n_ctx=args.ctx, n_seq=2, n_threads=args.threads, n_threads_batch=args.threads) as m:
        other = m.sequence(1)
        own = rng.integers(100, m.n_vocab // 2, args.own).tolist()
        idle = rng.integers(100, m.n_vocab // 2, args.idle).tolist()
        m.eval(own, logits="none")

        def decode() -> float:
            m.truncate(len(own))
            t0 = time.perf_counter()
            for _ in range(args.tokens):
                m.eval([500], logits="last")
            return (time.perf_counter() - t0) / args.tokens * 1000

        alone, beside = [], []
        for _ in range(args.reps):
            other.reset()
            alone.append(decode())
            other.eval(idle, logits="none")  # an idle conversation's cells, above the decoding one's
            beside.append(decode())
    a, b = statistics.median(alone), statistics.median(beside)
    print(f"{args.own} tokens of its own, {args.threads} threads, context {args.ctx}, medians of {args.reps}:")
    print(f"  alone:                        {a:.1f} ms a token ({', '.join(f'{x:.1f}' for x in alone)})")
    print(f"  beside {args.idle} idle cells: {b:.1f} ms a token ({', '.join(f'{x:.1f}' for x in beside)}); "
          f"{b / a:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
