"""What the history store costs when it is full: load, lookup per round, and update per generation.

Fills a scratch store up to its limit with records shaped like real use
(code-like token streams with repeated stretches), then measures:

* load: opening the store (reading the file and building the index), once per process;
* lookup: one ``HistoryDrafter.propose`` (what auto pays every round), median and p99;
* update: one ``HistoryStore.add`` of a 600-token record (lock, append, index merge).

Usage: python benchmarks/history_costs.py MODEL.gguf [--tokens 2000000]
(the model file only names the store; nothing is loaded).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from localspec.drafting.history import HistoryStore
from localspec.drafting.history.drafter import HistoryDrafter
from localspec.drafting.history.store import DEFAULT_LIMIT_TOKENS


def fake_records(n_tokens: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Records of 300-1500 tokens from a 32k vocabulary, half of each copied from a few shared stretches."""
    shared = [rng.integers(0, 32000, size=400) for _ in range(50)]
    out, total = [], 0
    while total < n_tokens:
        n = int(rng.integers(300, 1500))
        rec = rng.integers(0, 32000, size=n)
        for _ in range(3):  # paste pieces of common text, as boilerplate would be
            piece = shared[int(rng.integers(len(shared)))][: int(rng.integers(20, 200))]
            at = int(rng.integers(0, max(1, n - len(piece))))
            rec[at : at + len(piece)] = piece[: n - at]
        out.append(rec.astype(np.int32))
        total += n
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--tokens", type=int, default=DEFAULT_LIMIT_TOKENS)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        store = HistoryStore(args.model, directory=Path(tmp), limit_tokens=args.tokens + 10_000)
        records = fake_records(args.tokens, rng)
        t0 = time.perf_counter()
        for rec in records:  # written as many generations would, then timed when read back
            store.add(rec)
        fill = time.perf_counter() - t0
        t0 = time.perf_counter()
        store = HistoryStore(args.model, directory=Path(tmp), limit_tokens=args.tokens + 10_000)
        load = time.perf_counter() - t0
        drafter = HistoryDrafter(store.index)
        times, hits = [], 0
        for _ in range(2000):
            rec = records[int(rng.integers(len(records)))]
            cut = int(rng.integers(10, len(rec)))
            ctx = np.concatenate([rng.integers(0, 32000, size=50).astype(np.int32), rec[:cut]])
            t = time.perf_counter()
            hits += bool(drafter.propose(ctx, 8, rng).tokens)
            times.append(time.perf_counter() - t)
        updates = []
        for _ in range(20):
            t = time.perf_counter()
            store.add(rng.integers(0, 32000, size=600))
            updates.append(time.perf_counter() - t)
        size = store.path.stat().st_size
    print(f"store: {store.counts.records} records, {store.counts.tokens} tokens, {size / 1e6:.1f} MB on disk "
          f"(filled in {fill:.1f} s)")
    print(f"load (read + index): {load:.2f} s")
    print(f"lookup per round: median {1e6 * np.median(times):.0f} us, p99 {1e6 * np.percentile(times, 99):.0f} us "
          f"({hits} of 2000 found a match)")
    print(f"update per generation (600 tokens): median {1e3 * np.median(updates):.1f} ms, "
          f"max {1e3 * max(updates):.1f} ms")


if __name__ == "__main__":
    main()
