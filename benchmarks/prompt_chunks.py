"""What a prompt costs per token when it is read in chunks of each size, beside the curve that sizes them.

A prompt read beside decoding requests goes in chunks (``StepBatcher.stream_chunk``): smaller chunks keep the
other requests' tokens coming, larger ones read the prompt at a better rate. This loads the target once, fills
``--depth`` tokens of context, and times one decode of each chunk size appended there (cut back after each),
the sizes in a rotating order, medians of ``--reps``. Prints milliseconds per token and each size's rate
over the largest size's, and the chunk ``costs.prompt_chunk`` gives for the machine's calibrated curve.

    python benchmarks/prompt_chunks.py TARGET.gguf [--threads 2] [--depth 700] [--reps 5]
        [--sizes 1,8,16,32,64,77,128,256,512]
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
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--depth", type=int, default=700)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sizes", default="1,8,16,32,64,77,128,256,512")
    ap.add_argument("--ctx", type=int, default=4096)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    model = Model(args.target, n_ctx=args.ctx, n_threads=args.threads, n_threads_batch=args.threads)
    text = "def merge(a, b):\n    out = []\n    while a and b:\n        out.append(a.pop(0))\n"
    base = [int(t) for t in model.tokenize(text, add_special=False)]
    tokens = np.array((base * (1 + (args.depth + max(sizes)) // len(base)))[: args.depth + max(sizes)],
                      dtype=np.int32)
    model.eval(tokens[: args.depth], logits="none")
    seconds: dict[int, list[float]] = {s: [] for s in sizes}
    for rep in range(args.reps):
        order = sizes[rep % len(sizes):] + sizes[: rep % len(sizes)]  # who goes first moves on
        for size in order:
            t0 = time.perf_counter()
            model.eval(tokens[args.depth: args.depth + size], logits="last")
            seconds[size].append(time.perf_counter() - t0)
            model.truncate(args.depth)
    top = statistics.median(seconds[sizes[-1]]) / sizes[-1]
    print(f"{args.threads} threads, {args.depth} tokens of context; medians of {args.reps}")
    print(f"{'chunk':>6} {'ms':>9} {'ms/token':>9} {'rate vs ' + str(sizes[-1]):>12}")
    for size in sizes:
        med = statistics.median(seconds[size])
        print(f"{size:>6} {med * 1e3:>9.1f} {med / size * 1e3:>9.2f} {top / (med / size):>12.2f}")
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
