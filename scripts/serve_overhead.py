#!/usr/bin/env python3
"""What `localspec serve` costs on top of the Python API: decode tokens/s, same prompt, in one run.

Loads the pair here and starts `localspec serve` on the same files; then, with
the repetitions interleaved (API, server, API, server...), generates the same
greedy chat reply through ``Pair.chat`` and through the server with the
``openai`` client, streamed. The API's rate is its own decode tokens/s; the
server's is measured by the client, from the first streamed token to the last,
so HTTP, JSON and event-loop costs are included (and so is the client's own
CPU time, on the same machine). Both sides use one calibration, so auto
chooses from the same costs. Prints the medians and their ratio.

Usage:
    python scripts/serve_overhead.py -t TARGET.gguf -d DRAFT.gguf [--reps 3] [--max-tokens 96] [--method auto]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import openai  # noqa: E402
from serverproc import ServeProcess  # noqa: E402

import localspec  # noqa: E402

MESSAGES = [{"role": "user", "content": "Rewrite this function with a docstring and type hints, keeping its logic:\n"
             "def merge(a, b):\n    out = []\n    i = j = 0\n    while i < len(a) and j < len(b):\n"
             "        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n        else:\n"
             "            out.append(b[j]); j += 1\n    return out + a[i:] + b[j:]\n"}]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-t", "--target", required=True)
    p.add_argument("-d", "--draft")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--method", default="auto")
    p.add_argument("--ctx", type=int, default=4096)
    a = p.parse_args()
    files = ["-t", a.target] + (["-d", a.draft] if a.draft else [])
    api_rates, server_rates = [], []
    with tempfile.TemporaryDirectory() as home, localspec.load(a.target, a.draft, n_ctx=a.ctx) as pair:
        # One localspec home for both: the server calibrates at start, and the API here reuses that
        # profile, so auto makes its choices from the same costs on both sides.
        os.environ["LOCALSPEC_HOME"] = home
        server = ServeProcess(files + ["--ctx", str(a.ctx), "--method", a.method], Path(home), timeout=300)
        try:
            client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=600)
            opts = localspec.GenerationOptions(max_tokens=a.max_tokens, method=a.method)
            pair.chat(MESSAGES, opts.replace(max_tokens=8))  # warm-up (and calibration for auto)
            for rep in range(a.reps):
                r = pair.chat(MESSAGES, opts)
                api_rates.append(r.stats.decode_tokens_per_second)
                stamps: list[float] = []
                usage = timings = None
                for chunk in client.chat.completions.create(
                        model=Path(a.target).stem, messages=MESSAGES, max_tokens=a.max_tokens, temperature=0,
                        stream=True, stream_options={"include_usage": True}, extra_body={"method": a.method}):
                    if chunk.choices and chunk.choices[0].delta.content:
                        stamps.append(time.perf_counter())
                    if chunk.usage:
                        usage = chunk.usage
                    if chunk.choices and chunk.choices[0].finish_reason:
                        timings = chunk.model_extra["timings"]
                        served = chunk.model_extra["localspec"]
                assert usage is not None
                # streamed text pieces can merge tokens; rate = tokens after the first over first-to-last time
                server_rates.append((usage.completion_tokens - 1) / (stamps[-1] - stamps[0]))
                assert timings is not None
                inside = (timings["predicted_n"] - 1) / timings["predicted_ms"] * 1000
                print(f"rep {rep}: api {api_rates[-1]:.2f} tok/s ({len(r.tokens)} tokens), server "
                      f"{server_rates[-1]:.2f} tok/s at the client, {inside:.2f} inside the server "
                      f"({usage.completion_tokens} tokens)", file=sys.stderr)
                if os.environ.get("SERVE_OVERHEAD_DEBUG"):
                    print("  api rounds", r.stats.auto and r.stats.auto.rounds, r.stats.accepted, r.stats.drafted,
                          "\n  server rounds", served["rounds_per_method"], served["accepted"], served["drafted"],
                          file=sys.stderr)
        finally:
            server.close()
    api, srv = statistics.median(api_rates), statistics.median(server_rates)
    print(f"median decode tok/s: Pair.chat {api:.2f}, localspec serve (client-side) {srv:.2f}; "
          f"server/API = {srv / api:.3f} ({100 * (1 - srv / api):+.1f}% overhead)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
