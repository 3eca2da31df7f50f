"""JSON-Schema extraction on the real pair: localspec plain, plain and auto under the schema, against
llama-cpp-python's own plain and ``response_format`` decoding at the same thread budget.

Greedy decode rates (tokens after the first over the time after the first),
repetitions interleaved in a rotating order, medians. The figures of
``benchmarks/results/2026-12-01-structured-slow-2-core.md`` and
``benchmarks/results/2026-12-02-structured-quiet.md`` come from this script, for example::

    .venv/bin/python benchmarks/structured_vs_lcp.py --threads 2 --reps 3
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from llama_cpp import Llama

import localspec
from localspec.constraint import Constraint

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from fetch_test_models import default_dest  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"}, "email": {"type": "string"}, "city": {"type": "string"},
        "items": {"type": "array", "items": {"type": "object", "required": ["product", "quantity"],
                                             "properties": {"product": {"type": "string"},
                                                            "quantity": {"type": "integer"}}}},
        "total": {"type": "number"},
    },
    "required": ["name", "email", "city", "items", "total"],
}
DOCS = [
    "Order from Maria Lopez (maria.lopez@example.com), shipping to Valencia: 2 keyboards, 1 monitor stand and "
    "3 USB cables. Total charged: 184.50 EUR.",
    "Customer: John Smith, john.smith@example.org, lives in Leeds. He bought 4 notebooks and 2 pens; the total "
    "was 23.75.",
]
ROWS = ("llama-cpp-python response_format", "llama-cpp-python plain", "localspec plain", "localspec plain + schema",
        "localspec auto + schema")


def messages(doc: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": "Extract the order as JSON with name, email, city, items (product, "
                                        "quantity) and total.\n\n" + doc}]


def peer_rate(llama: Llama, doc: str, max_tokens: int, schema: bool) -> float:
    """llama-cpp-python's decode rate (under the schema, or plain), timed from its first streamed token."""
    llama.reset()
    first, n = None, 0
    fmt = {"type": "json_object", "schema": SCHEMA} if schema else None
    for chunk in llama.create_chat_completion(messages(doc), response_format=fmt, temperature=0,
                                              max_tokens=max_tokens, stream=True):
        if chunk["choices"][0]["delta"].get("content"):  # type: ignore[index, union-attr]
            n += 1
            first = first or time.perf_counter()
    return (n - 1) / (time.perf_counter() - first) if first and n > 1 else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=160)
    args = ap.parse_args()
    d = default_dest()
    pair = localspec.load(d / "target.gguf", d / "draft.gguf", n_ctx=2048, n_threads=args.threads,
                          n_threads_batch=args.threads, history=False)
    peer = Llama(str(d / "target.gguf"), n_ctx=2048, n_threads=args.threads, n_threads_batch=args.threads,
                 flash_attn=False, verbose=False)
    schema = Constraint.json_schema(SCHEMA)
    pair.calibrate()
    rates: dict[str, list[float]] = {row: [] for row in ROWS}
    replies: dict[tuple[str, int], str] = {}
    for rep in range(args.reps):
        for i, doc in enumerate(DOCS):
            for row in ROWS[rep % len(ROWS):] + ROWS[: rep % len(ROWS)]:  # a rotating order
                if row.startswith("llama"):
                    rates[row].append(peer_rate(peer, doc, args.max_tokens, "response_format" in row))
                    continue
                pair.reset()
                r = pair.chat(messages(doc), max_tokens=args.max_tokens, method="auto" if "auto" in row else "plain",
                              grammar=schema if "schema" in row else None)
                rates[row].append(r.stats.decode_tokens_per_second)
                replies[row, i] = r.text
                if "auto" in row:
                    print(f"  rep {rep} doc {i}: {len(r.tokens)} tokens, {r.stats.accepted_by.get('grammar', 0)} "
                          f"forced, {r.stats.accepted}/{r.stats.drafted} drafted kept", flush=True)
    peer_median = float(np.median(rates[ROWS[0]]))
    for row in ROWS:
        m = float(np.median(rates[row]))
        print(f"{row:<34} {m:6.1f} tok/s  {m / peer_median:5.2f}x")
    same = all(replies["localspec plain + schema", i] == replies["localspec auto + schema", i]
               for i in range(len(DOCS)))
    print("auto under the schema gave plain constrained decoding's text:", same)
    pair.close()
    peer.close()


if __name__ == "__main__":
    main()
