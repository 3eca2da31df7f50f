"""Prompt processing with flash attention on and off: the agent workload's first prompt, read whole.

Loads the target once per setting and repetition (alternating on and off) and times
``eval`` of the prompt of ``localspec bench --agent``'s first request (about 2.6k tokens
on a Qwen2.5 vocabulary), logits for the last token only, as a prompt is processed.

    python benchmarks/prompt_speed.py TARGET.gguf [--threads 2] [--reps 3] [--scale 1.0] [--ctx 32768]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from localspec.bench.agent import conversations
from localspec.runtime.model import Model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1.0, help="the prompt's size, as bench --agent's --scale")
    ap.add_argument("--ctx", type=int, default=32768)
    args = ap.parse_args()
    conv = conversations(args.scale)[0]
    seconds: dict[bool, list[float]] = {False: [], True: []}
    n = 0
    for rep in range(args.reps):
        for fa in ((False, True) if rep % 2 == 0 else (True, False)):  # alternate which goes first
            model = Model(args.target, n_ctx=args.ctx, n_threads=args.threads, n_threads_batch=args.threads,
                          flash_attn=fa)
            try:
                tokens = model.tokenize(conv.system + "\n" + conv.first)
                n = len(tokens)
                t0 = time.perf_counter()
                model.eval(tokens, logits="last")
                seconds[fa].append(time.perf_counter() - t0)
            finally:
                model.close()
            print(f"rep {rep + 1}: flash attention {'on ' if fa else 'off'} {seconds[fa][-1]:6.1f} s "
                  f"({n / seconds[fa][-1]:.1f} tokens/s)", flush=True)
    off, on = statistics.median(seconds[False]), statistics.median(seconds[True])
    print(f"{n} tokens, {args.threads} threads, context {args.ctx}: off {off:.1f} s ({n / off:.1f} tokens/s), "
          f"on {on:.1f} s ({n / on:.1f} tokens/s); on/off time {on / off:.3f} (medians of {args.reps})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
