"""What another sequence's cells cost a sequence that reads and steps beside them, flash attention off and on.

Four contexts of the target (2 sequences sharing ``--ctx`` cells): flash attention off and on, sequence 0
empty or holding ``--beside`` random tokens. Each repetition, in alternating order, sequence 1 reads
``--read`` random tokens from position 0 and then steps 6 single tokens; prints the medians and, per
setting, the read's and the step's time beside the other cells over alone (paired by repetition).

    python benchmarks/shared_cells_attention.py TARGET.gguf [--ctx 2048] [--read 256] [--beside 1500]
        [--threads 2] [--reps 7]
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
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--read", type=int, default=256)
    ap.add_argument("--beside", type=int, default=1500)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    read = rng.integers(100, 20000, size=args.read).tolist()
    other = rng.integers(100, 20000, size=args.beside).tolist()
    keys = [(fa, beside) for fa in (False, True) for beside in (False, True)]
    models = {}
    for fa, beside in keys:
        m = Model(args.target, n_ctx=args.ctx, n_seq=2, flash_attn=fa, n_threads=args.threads,
                  n_threads_batch=args.threads)
        if beside:
            m.eval(other)  # sequence 0 holds the other cells
        models[(fa, beside)] = (m, m.sequence(1))
    times: dict[tuple[bool, bool], list[tuple[float, float]]] = {k: [] for k in keys}
    for rep in range(args.reps):
        for key in keys if rep % 2 == 0 else keys[::-1]:
            seq = models[key][1]
            seq.truncate(0)
            t0 = time.perf_counter()
            seq.eval(read)
            reading = time.perf_counter() - t0
            steps = []
            for token in read[:6]:
                t0 = time.perf_counter()
                seq.eval([token])
                steps.append(time.perf_counter() - t0)
            times[key].append((reading, statistics.median(steps)))
    for fa, beside in keys:
        v = times[(fa, beside)]
        print(f"flash attention {'on ' if fa else 'off'}, {'beside' if beside else 'alone '}: read "
              f"{statistics.median(x[0] for x in v):.2f} s, step {1000 * statistics.median(x[1] for x in v):.1f} ms")
    for fa in (False, True):
        pairs = list(zip(times[(fa, False)], times[(fa, True)], strict=True))
        print(f"flash attention {'on ' if fa else 'off'}: beside / alone, read "
              f"{statistics.median(b[0] / a[0] for a, b in pairs):.3f}, step "
              f"{statistics.median(b[1] / a[1] for a, b in pairs):.3f} (medians of {args.reps})")
    for m, seq in models.values():
        seq.close()
        m.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
