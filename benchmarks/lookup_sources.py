#!/usr/bin/env python3
"""How often prompt lookup's guess is kept, by where its match's source lies, over recorded replies.

At every position of each recorded reply, lookup guesses as auto would see it (the longest n-gram of up to 5
tokens, its first match); for matches of at least ``--min-ngram`` tokens this prints, by where the match's
source lies (the supplied text, the prompt's last 32 tokens of a prompt longer than 120, the reply itself)
and by the reply's length, the per-token acceptance of a 4-token guess and how often its first token is
kept. These are the figures behind ``localspec.drafting.estimates.LOOKUP_SOURCES``.

Usage:
    python benchmarks/lookup_sources.py benchmarks/traces/traces-suite-96.json \
        benchmarks/traces/traces-related.json benchmarks/traces/traces-short-answers.json
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from localspec.drafting.drafters import PromptLookupDrafter
from localspec.drafting.estimates import lookup_source
from localspec.drafting.replay import Recorded, kept_prefix

GUESS = 4  # tokens per guess, as a plain round's unused guess is scored


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", type=Path, nargs="+", help="recordings from benchmarks/replay.py record")
    ap.add_argument("--min-ngram", type=int, default=3, help="count matches of at least this many tokens")
    ap.add_argument("--short", type=int, default=80, help="a reply of fewer tokens counts as short")
    args = ap.parse_args()
    requests = [Recorded(**r) for path in args.traces for r in json.loads(path.read_text())["requests"]]
    counts: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # kept, misses, first kept, n
    lookup, rng = PromptLookupDrafter(), np.random.default_rng(0)
    for req in requests:
        group = "short" if len(req.reply) < args.short else "long"
        for i in range(1, len(req.reply)):
            guess = lookup.propose(np.asarray(req.prompt + req.reply[:i], dtype=np.int32), GUESS, rng)
            if not guess.tokens or lookup.last_match < args.min_ngram:
                continue
            kept = kept_prefix(list(guess.tokens), req.reply[i:])
            c = counts[(group, lookup_source(lookup.last_source, len(req.prompt)))]
            c[0] += kept
            c[1] += kept < GUESS
            c[2] += kept > 0
            c[3] += 1
    print(f"{len(requests)} replies; matches of {args.min_ngram}+ tokens, {GUESS}-token guesses")
    print(f"{'replies':8s} {'source':8s} {'alpha':>6s} {'first kept':>11s} {'matches':>8s}")
    for (group, where), (kept, misses, first, n) in sorted(counts.items()):
        print(f"{group:8s} {where:8s} {kept / max(1, kept + misses):6.2f} {first / n:11.2f} {n:8d}")


if __name__ == "__main__":
    main()
