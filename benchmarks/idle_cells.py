"""What another sequence's cells cost a sequence that decodes (or reads a prompt) beside them in one unified
cache: llama.cpp's plain attention multiplies every query by every cell up to the highest in use and masks
the other sequences' ones, where its CPU flash-attention kernels skip them. Repetitions interleaved.

    python benchmarks/idle_cells.py TARGET.gguf [--ctx 32768] [--threads 2] [--own 2700] [--idle 2100]
        [--tokens 24] [--read 0] [--reps 3] [--flash-attn auto|on|off|both]

``--read N`` also times reading N more tokens after the sequence's own (a prompt read beside the other
cells); ``--flash-attn both`` measures a context with it off and one with it on, alternating.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from localspec.cli.shared import FLASH_ATTN, FLASH_ATTN_SHOWN
from localspec.runtime.model import Model

SETTINGS = {**{name: [value] for name, value in FLASH_ATTN.items()}, "both": [False, True]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target")
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--own", type=int, default=2700, help="tokens the decoding sequence holds")
    ap.add_argument("--idle", type=int, default=2100, help="tokens the idle sequence holds")
    ap.add_argument("--tokens", type=int, default=24, help="single-token decodes timed each time")
    ap.add_argument("--read", type=int, default=0, help="tokens read after its own, timed each time (0: none)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--flash-attn", choices=sorted(SETTINGS), default="auto")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    models = [Model(args.target, n_ctx=args.ctx, n_seq=2, n_threads=args.threads, n_threads_batch=args.threads,
                    flash_attn=fa) for fa in SETTINGS[args.flash_attn]]
    own = rng.integers(100, models[0].n_vocab // 2, args.own).tolist()
    idle = rng.integers(100, models[0].n_vocab // 2, args.idle).tolist()
    read = rng.integers(100, models[0].n_vocab // 2, args.read).tolist()
    for m in models:
        m.eval(own, logits="none")
    others = [m.sequence(1) for m in models]
    # per model: (read seconds, ms a decoded token), alone and beside the idle cells, per repetition
    times: dict[tuple[int, bool], list[tuple[float, float]]] = {}
    for rep in range(args.reps):
        order = list(range(len(models))) if rep % 2 == 0 else list(reversed(range(len(models))))
        for i in order:
            for beside in (False, True):
                others[i].reset()
                if beside:
                    others[i].eval(idle, logits="none")  # an idle conversation's cells, above the decoding one's
                times.setdefault((i, beside), []).append(_timed(models[i], len(own), read, args.tokens))
    print(f"{args.own} tokens of its own, {args.idle} idle cells, {args.threads} threads, context {args.ctx}, "
          f"medians of {args.reps}:")
    for i, m in enumerate(models):
        alone, beside = times[(i, False)], times[(i, True)]
        step = statistics.median(b[1] / a[1] for a, b in zip(alone, beside, strict=True))
        line = (f"  flash attention {FLASH_ATTN_SHOWN[m.flash_attn]}: a token "
                f"{statistics.median(a[1] for a in alone):.1f} ms alone, "
                f"{statistics.median(b[1] for b in beside):.1f} beside ({step:.3f}x paired)")
        if read:
            ratio = statistics.median(b[0] / a[0] for a, b in zip(alone, beside, strict=True))
            line += (f"; {args.read} tokens read in {statistics.median(a[0] for a in alone):.2f} s alone, "
                     f"{statistics.median(b[0] for b in beside):.2f} beside ({ratio:.3f}x paired)")
        print(line)
    for other, m in zip(others, models, strict=True):
        other.close()
        m.close()
    return 0


def _timed(m: Model, own: int, read: list[int], tokens: int) -> tuple[float, float]:
    """Seconds to read ``read`` after the sequence's own ``own`` tokens (0 if none), then ms a decoded token."""
    reading = 0.0
    if read:
        m.truncate(own)
        t0 = time.perf_counter()
        m.eval(read, logits="last")
        reading = time.perf_counter() - t0
    m.truncate(own)
    t0 = time.perf_counter()
    for _ in range(tokens):
        m.eval([500], logits="last")
    return reading, (time.perf_counter() - t0) / tokens * 1000


if __name__ == "__main__":
    sys.exit(main())
