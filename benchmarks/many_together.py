"""Several requests decoded together (``Pair.generate_many``) against the same requests one after another.

Loads the pair once with ``--parallel`` sequences and, alternating which goes first in each repetition, times
the prompts generated one after another (``generate``) and together (``generate_many``), greedy, checking
that both give the same tokens. Prints the wall times and their ratio (medians).

    python benchmarks/many_together.py TARGET.gguf [--draft DRAFT.gguf] [--parallel 4] [--method plain]
        [--max-tokens 128] [--reps 3] [--threads 2] [--ctx 4096] [--prompt-cache]
        [--workload new|copy|mixed|subagents] [--flash-attn auto|on|off]

``subagents`` is four sub-agent-like requests (the bench's ``fanout`` prompts, ~700 tokens each, and a fourth);
with ``--ctx 2048`` their prompts and replies together need more cells than the context has, so requests wait
for room (or are set aside) where, one after another, each has the context to itself.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import localspec
from localspec.bench.together import COPY, MODULE, NEW
from localspec.cli.shared import FLASH_ATTN, FLASH_ATTN_SHOWN

FAN = "Read this module and answer in one sentence: {}\n\n" + MODULE * 6
ASKS = ("what does compute_total_0 return?", "which loop variable is used?", "how many functions are there?",
        "what does compute_total_3 multiply?")
WORKLOADS = {"new": list(NEW), "copy": list(COPY * 2), "mixed": [*NEW[:2], *COPY],
             "subagents": [FAN.format(a) for a in ASKS]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target")
    ap.add_argument("--draft")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--method", default="plain")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096, help="the context's cells, shared by the --parallel sequences")
    ap.add_argument("--prompt-cache", action="store_true",
                    help="keep the prompt cache on (RAM only): an idle sequence whose state it holds leaves the "
                         "shared cells when another reads its prompt")
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="new")
    ap.add_argument("--flash-attn", choices=list(FLASH_ATTN), default="auto",
                    help="flash attention (auto: the library's default for the context)")
    args = ap.parse_args()
    prompts = [[{"role": "user", "content": p}] for p in WORKLOADS[args.workload]]
    seconds: dict[str, list[float]] = {"one after another": [], "together": []}
    with localspec.load(args.target, args.draft, n_ctx=args.ctx, n_threads=args.threads, n_threads_batch=args.threads,
                        parallel=args.parallel, history=False, prompt_cache=args.prompt_cache,
                        cache_disk=0, flash_attn=FLASH_ATTN[args.flash_attn]) as pair:
        options = dict(max_tokens=args.max_tokens, method=args.method)
        for rep in range(args.reps):
            order = list(seconds) if rep % 2 == 0 else list(reversed(seconds))
            tokens = {}
            for name in order:
                pair.reset()
                if pair.cache is not None:
                    pair.cache.clear()  # no state saved by the other way's run, or an earlier repetition
                for lane in range(1, args.parallel):
                    pair.lanes.lane(lane).reset()  # nothing cached from the other way's run
                t0 = time.perf_counter()
                if name == "together":
                    results = pair.generate_many(prompts, **options)
                else:
                    results = [pair.chat(p, **options) for p in prompts]
                seconds[name].append(time.perf_counter() - t0)
                tokens[name] = [r.tokens for r in results]
                waited = f", {pair.lanes.room_waits} waits for room so far" if name == "together" else ""
                print(f"rep {rep + 1}: {name:18s} {seconds[name][-1]:6.1f} s, "
                      f"{sum(len(t) for t in tokens[name])} tokens{waited}", flush=True)
            same = tokens["together"] == tokens["one after another"]
            print(f"rep {rep + 1}: the same tokens: {same}", flush=True)
    alone, together = (statistics.median(seconds[k]) for k in ("one after another", "together"))
    print(f"{len(prompts)} {args.workload} requests, {args.method}, {args.max_tokens} tokens each, "
          f"{args.threads} threads, parallel {args.parallel}, context {args.ctx}, flash attention "
          f"{FLASH_ATTN_SHOWN[pair.target.flash_attn]}: one after another {alone:.1f} s, "
          f"together {together:.1f} s: {alone / together:.2f}x (medians of {args.reps})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
