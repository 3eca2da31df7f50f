"""Prompt reading against llama-server: the same tokens, the same threads and context, interleaved.

Each repetition starts llama-server fresh and sends the tokens to ``/completion`` (one token asked, no
prompt cache), then loads the target in localspec once per variant and times ``eval`` of the same
tokens, after a one-token warm-up as llama-server's, as ``serve`` reads a prompt (an abort event
attached, logits for the last token only). The variants isolate what differs from llama-server's
defaults:

* ``localspec``: as ``serve`` reads a prompt (512-token decode calls, the abort hook);
* ``no-abort``: without the abort hook;
* ``batch-2048``: 2048-token decode calls split by llama.cpp into ubatches of 512, as llama-server's.

    python benchmarks/prompt_parity.py TARGET.gguf --llama-server PATH [--tokens 4096] [--reps 3]
        [--variants localspec,no-abort,batch-2048]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any, Callable

from localspec.bench.agent import conversations
from localspec.runtime import process
from localspec.runtime.model import Model

PORT = 8931


def prompt_tokens(target: str, n: int) -> list[int]:
    """``n`` tokens of agent-like text (bench --agent's first prompt, repeated as needed)."""
    model = Model(target, n_ctx=512)
    try:
        conv = conversations(1.0)[0]
        one = [int(t) for t in model.tokenize(conv.system + "\n" + conv.first)]
    finally:
        model.close()
    return (one * (n // len(one) + 1))[:n]


def llama_server(binary: str, target: str, tokens: list[int], threads: int, ctx: int) -> float:
    """Seconds llama-server reports for reading ``tokens`` (its ``prompt_ms``), started fresh."""
    proc = subprocess.Popen([binary, "-m", target, "-c", str(ctx), "-t", str(threads), "-tb", str(threads),
                             "--port", str(PORT)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        body = json.dumps({"prompt": tokens, "n_predict": 1, "cache_prompt": False}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{PORT}/completion", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=3600) as r:
            reply: dict[str, Any] = json.load(r)
        return float(reply["timings"]["prompt_ms"]) / 1000
    finally:
        proc.terminate()
        proc.wait()


def localspec_read(target: str, tokens: list[int], threads: int, ctx: int, *, abort: bool = True,
                   n_batch: int = 512) -> float:
    """Seconds localspec's ``Model.eval`` takes to read ``tokens`` (decode calls of ``n_batch``, ubatch 512)."""
    original = process.context_params

    def ubatch_512(*args: Any, **kwargs: Any) -> Any:
        cparams = original(*args, **kwargs)
        cparams.n_ubatch = min(512, cparams.n_batch)
        return cparams

    process.context_params = ubatch_512  # type: ignore[assignment]
    try:
        model = Model(target, n_ctx=ctx, n_threads=threads, n_threads_batch=threads, n_batch=n_batch,
                      flash_attn=True)
    finally:
        process.context_params = original  # type: ignore[assignment]
    try:
        model.eval(tokens[:1], logits="none")  # as llama-server's warm-up: the weights are read once before
        model.truncate(0)
        t0 = time.perf_counter()
        model.eval(tokens, logits="last", abort=threading.Event() if abort else None)
        return time.perf_counter() - t0
    finally:
        model.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target")
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--variants", default="localspec,no-abort,batch-2048",
                    help="the localspec variants to time beside llama-server, comma-separated")
    args = ap.parse_args()
    tokens = prompt_tokens(args.target, args.tokens)
    runs: dict[str, Callable[[], float]] = {
        "llama-server": lambda: llama_server(args.llama_server, args.target, tokens, args.threads, args.ctx),
        "localspec": lambda: localspec_read(args.target, tokens, args.threads, args.ctx),
        "no-abort": lambda: localspec_read(args.target, tokens, args.threads, args.ctx, abort=False),
        "batch-2048": lambda: localspec_read(args.target, tokens, args.threads, args.ctx, n_batch=2048),
    }
    chosen = {"llama-server", *args.variants.split(",")}
    runs = {name: run for name, run in runs.items() if name in chosen}
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for rep in range(args.reps):
        order = names[rep % len(names):] + names[:rep % len(names)]  # rotate which goes first
        for name in order:
            seconds[name].append(runs[name]())
            print(f"rep {rep + 1}: {name:12s} {seconds[name][-1]:7.1f} s "
                  f"({len(tokens) / seconds[name][-1]:.1f} tokens/s)", flush=True)
    base = statistics.median(seconds["llama-server"])
    print(f"{len(tokens)} tokens, {args.threads}/{args.threads} threads, context {args.ctx}, flash attention on; "
          f"medians of {args.reps}:")
    for name in names:
        med = statistics.median(seconds[name])
        print(f"  {name:12s} {med:7.1f} s  {len(tokens) / med:6.1f} tokens/s  time/llama-server {med / base:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
