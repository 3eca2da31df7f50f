#!/usr/bin/env python3
"""Does the order in which models are loaded change their decode speed?

Loads the same GGUF twice in one process (optionally after another model or
a load that is closed again) and times single-token decode steps on each,
with the repetitions interleaved. On a 2-core Intel Xeon virtual machine on
2026-11-30, at one thread, the copy loaded first decoded at 0.94 of the
second's speed while llama.cpp's buffers had 4 KiB pages (`--huge-pages none`,
as llama-cpp-python's own loads have them), and at 0.99 with huge pages
(`--huge-pages both`, localspec's default, see localspec/runtime/hugepages.py;
benchmarks/results/2026-11-30-huge-pages.md). `--huge-pages first` gives only
the first copy huge pages, so first/second is their gain (with the order
effect against it).

Usage:
    python benchmarks/load_order.py MODEL.gguf [--threads 1] [--reps 4] [--before OTHER.gguf] [--closed-first]
                                 [--huge-pages both|none|first]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from localspec.runtime.model import Model


def steps_per_second(m: Model, prompt: list[int], n: int = 30) -> float:
    m.reset()
    m.eval(prompt, logits="last")
    tok = prompt[-1]
    t0 = time.perf_counter()
    for _ in range(n):
        tok = int(np.argmax(m.eval([tok], logits="all")[0]))
    return n / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--before", help="another GGUF to load first")
    p.add_argument("--closed-first", action="store_true", help="load and close the model once first")
    p.add_argument("--huge-pages", choices=["both", "none", "first"], default="both",
                   help="which copies get huge pages (none: llama.cpp's own 4 KiB pages)")
    a = p.parse_args()
    opts = dict(n_ctx=4096, n_threads=a.threads, huge_pages=a.huge_pages == "both")
    keep = [Model(a.before, **opts)] if a.before else []
    if a.closed_first:
        Model(a.model, **opts).close()
    first = Model(a.model, **{**opts, "huge_pages": a.huge_pages != "none"})
    second = Model(a.model, **opts)
    prompt = first.tokenize("def merge(a, b):\n    out = []\n" * 20)
    one, two = [], []
    for _ in range(a.reps):
        one.append(steps_per_second(first, prompt))
        two.append(steps_per_second(second, prompt))
    print(f"steps/s, loaded first: {[round(x, 2) for x in one]}; loaded second: {[round(x, 2) for x in two]}; "
          f"first/second = {statistics.median(one) / statistics.median(two):.3f}")
    for m in [first, second, *keep]:
        m.close()


if __name__ == "__main__":
    main()
