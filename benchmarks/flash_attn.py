#!/usr/bin/env python3
"""Flash attention on or off: decode speed and how often greedy output flips at a tie.

Loads the target twice in one process, once with flash attention and once
without, then decodes the bench's quick suite greedily (plain decoding, and
auto) on both, with repetitions interleaved and the load order alternated
out of the timing by running on/off and off/on in turn. Reports per prompt:

* the decode speed ratio on/off (median over repetitions, plain decoding);
* whether plain decoding's tokens differ between on and off, and if so
  plain-off's own top-two logit margin where they part (a tie flip: both
  branches are valid outputs of the model, rounded differently);
* whether auto's tokens differ from plain decoding with the same setting
  (what `localspec bench` checks), to show speculation stays exact either way.

Usage:
    python benchmarks/flash_attn.py TARGET.gguf [--threads 2] [--reps 3] [--max-tokens 96]
"""

from __future__ import annotations

import argparse
import statistics
from typing import Optional

from localspec.api import Pair
from localspec.bench import batch_noise, classify, load_suite, margin_at
from localspec.runtime.model import Model


def compare(pair: Pair, prompt: list[int], ref: list[int], tokens: list[int], tie: float) -> tuple[str, Optional[dict]]:
    """Exactness of ``tokens`` against ``ref`` (plain decoding on ``pair``), as the bench classifies it."""
    return classify(ref, tokens, lambda i: margin_at(pair.target, prompt, ref, i), tie)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--ctx", type=int, default=4096)
    args = ap.parse_args()
    pairs = {fa: Pair(Model(args.target, n_ctx=args.ctx, n_threads=args.threads, flash_attn=fa))
             for fa in (False, True)}
    prompts = load_suite(quick=True)
    ids = {p.name: pairs[False].chat_tokens(p.messages) if p.messages else pairs[False].tokenize(p.text or "")
           for p in prompts}
    noise = batch_noise(pairs[False].target, ids[prompts[0].name])
    tie = max(0.05, 2 * noise)
    print(f"threads {args.threads}, {args.max_tokens} tokens, {args.reps} reps; batch-shape noise {noise:.3f}, "
          f"tie margin {tie:.3f}")
    print(f"{'prompt':<15} {'off tok/s':>9} {'on tok/s':>8} {'on/off':>7}  plain on vs off              "
          "auto vs plain (off / on)")
    ratios_all = []
    flips = 0
    for p in prompts:
        toks = ids[p.name]
        speed: dict[bool, list[float]] = {False: [], True: []}
        out: dict[tuple[bool, str], list[int]] = {}
        for rep in range(args.reps):
            for fa in ((False, True) if rep % 2 == 0 else (True, False)):
                pair = pairs[fa]
                pair.target.reset()
                r = pair.generate(toks, max_tokens=args.max_tokens, method="plain", history=False)
                speed[fa].append(r.stats.decode_tokens_per_second)
                out[(fa, "plain")] = r.tokens
        for fa in (False, True):
            pairs[fa].target.reset()
            out[(fa, "auto")] = pairs[fa].generate(toks, max_tokens=args.max_tokens, method="auto",
                                                   history=False).tokens
        ratios = [on / off for on, off in zip(speed[True], speed[False], strict=True)]
        ratios_all.append(statistics.median(ratios))
        verdict, info = compare(pairs[False], toks, out[(False, "plain")], out[(True, "plain")], tie)
        flips += verdict != "identical"
        where = f"{verdict} @{int(info['token'])} (margin {info['margin']:.3f})" if info else verdict
        autos = " / ".join(compare(pairs[fa], toks, out[(fa, "plain")], out[(fa, "auto")], tie)[0]
                           for fa in (False, True))
        print(f"{p.name:<15} {statistics.median(speed[False]):>9.1f} {statistics.median(speed[True]):>8.1f} "
              f"{statistics.median(ratios):>6.3f}x  {where:<28} {autos}")
    print(f"median on/off: {statistics.median(ratios_all):.3f}x; plain output changed by flash attention on "
          f"{flips} of {len(prompts)} prompts")
    for pair in pairs.values():
        pair.close()


if __name__ == "__main__":
    main()
