"""What a step of several generations costs beyond the model: localspec against llama-server's slots and
llama-cpp-python's own loop, on a tiny random model where a decode costs almost nothing.

On a GPU a small model's step takes a few milliseconds and the Python between llama.cpp calls is the speed;
a tiny GGUF (the tests' kind: 2 layers, 64 wide, a 271-token vocabulary) shows that machinery on any CPU.
S generations of ``--tokens`` tokens each (greedy, end-of-text banned) run together: localspec's
``Pair.generate_many`` on a pair of 8 sequences, llama-server with ``-np 8 --kv-unified`` and S requests sent
at once, each plain and with the model drafting itself (K = 4: every guess is accepted). For S = 1
llama-cpp-python's loop (``Llama.generate``) is a row too. Each cell is milliseconds per generated token of one
request, i.e. per step of all of them (wall time over ``--tokens``); every cell runs in a fresh process, the
engines' order rotating from one repetition to the next; medians.

    python benchmarks/step_overhead.py [--llama-server PATH] [--before CHECKOUT] [--sizes 1,2,4,8]
        [--tokens 300] [--reps 3] [--threads 2] [--json OUT]

``--before`` adds the rows of another localspec checkout (its folder holds ``localspec/``): a change's before
and after in one run.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parent.parent
PROMPT = "request {i}: the cat sat on the mat and"
#: The context each engine gets: 8 generations of up to 1000 tokens fit beside their prompts.
CONTEXT = 8192


def tiny_model(folder: Path) -> Path:
    """The tests' tiny llama GGUF, written into ``folder``."""
    sys.path.insert(0, str(REPO / "tests"))
    from tinymodel import write_tiny_model

    return write_tiny_model(folder / "tiny.gguf", seed=0, n_ctx=CONTEXT)


def run_localspec(model: str, size: int, tokens: int, draft: bool, threads: int) -> float:
    """Seconds of ``generate_many`` of ``size`` prompts (after a warm-up of the same shape)."""
    import localspec

    pair = localspec.load(model, model if draft else None, n_ctx=CONTEXT, n_threads=threads,
                          n_threads_batch=threads, parallel=8, history=False, prompt_cache=False)
    try:
        ban = {t: -100.0 for t in range(pair.target.n_vocab) if pair.target.is_eog(t)}
        opts: dict[str, Any] = dict(temperature=0.0, logit_bias=ban, method="draft" if draft else "plain")
        if draft:
            opts["k"] = 4
        prompts = [PROMPT.format(i=i) for i in range(size)]
        pair.generate_many(prompts, max_tokens=16, **opts)  # warm-up: threads, graphs, lanes opened
        for lane in range(pair.lanes.width):
            pair.lanes.lane(lane).reset()
        t0 = time.perf_counter()
        results = pair.generate_many(prompts, max_tokens=tokens, **opts)
        spent = time.perf_counter() - t0
        short = [len(r.tokens) for r in results if len(r.tokens) != tokens]
        if short:
            raise SystemExit(f"localspec gave {short} tokens where {tokens} were asked")
        return spent
    finally:
        pair.close()


def run_lcp(model: str, tokens: int, threads: int) -> float:
    """Seconds of llama-cpp-python's own greedy loop (``Llama.generate``) for ``tokens`` tokens."""
    import llama_cpp
    import numpy as np

    llm = llama_cpp.Llama(model, n_ctx=CONTEXT, n_threads=threads, n_threads_batch=threads, verbose=False)
    eog = [t for t in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(llm._model.vocab, t)]

    def ban(_: Any, scores: np.ndarray) -> np.ndarray:
        scores[eog] = -np.inf
        return scores

    prompt = llm.tokenize(PROMPT.format(i=0).encode())

    def once(n: int) -> float:
        llm.reset()
        t0 = time.perf_counter()
        for i, _ in enumerate(llm.generate(prompt, top_k=1, temp=0.0, logits_processor=[ban]), 1):
            if i == n:
                break
        return time.perf_counter() - t0

    once(16)
    return once(tokens)


def run_llama_server(program: str, model: str, size: int, tokens: int, draft: bool, threads: int) -> float:
    """Seconds for ``size`` requests sent at once to llama-server (8 slots, one unified cache) to finish."""
    sys.path.insert(0, str(REPO))
    from localspec.bench.agent import RunningServer, ServerSpec

    argv = [program, "-m", model, "-c", str(CONTEXT), "-np", "8", "--kv-unified", "-t", str(threads), "-tb",
            str(threads), "--host", "127.0.0.1", "--port", "{port}", "-ngl", "0"]
    if draft:
        argv += ["-md", model, "--spec-type", "draft-simple", "--spec-draft-n-max", "4", "--spec-draft-n-min", "0",
                 "--draft-p-min", "0", "-ngld", "0"]
    server = RunningServer(ServerSpec("llama-server", tuple(argv)))
    try:
        server.wait_ready()

        def ask(i: int, n: int, out: list[int]) -> None:
            body = json.dumps({"prompt": PROMPT.format(i=i), "n_predict": n, "ignore_eos": True, "temperature": 0,
                               "top_k": 1, "cache_prompt": False})
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
            conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
            reply = json.loads(conn.getresponse().read())
            out.append(int(reply.get("tokens_predicted", 0)))

        def together(n: int) -> float:
            counts: list[int] = []
            threads_ = [threading.Thread(target=ask, args=(i, n, counts)) for i in range(size)]
            t0 = time.perf_counter()
            for t in threads_:
                t.start()
            for t in threads_:
                t.join()
            spent = time.perf_counter() - t0
            if counts != [n] * size:
                raise SystemExit(f"llama-server gave {counts} tokens where {n} each were asked: {server.log_tail()}")
            return spent

        together(16)
        return together(tokens)
    finally:
        server.close()


def cell(engine: str, args: argparse.Namespace, model: Path, size: int, draft: bool) -> float:
    """One measurement in a fresh process; milliseconds per token of one request."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", engine, "--model", str(model), "--size",
            str(size), "--tokens", str(args.tokens), "--threads", str(args.threads)]
    if draft:
        argv.append("--draft")
    if args.llama_server:
        argv += ["--llama-server", args.llama_server]
    env = dict(os.environ)
    if engine == "before":
        env["PYTHONPATH"] = str(args.before)
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{engine} (S={size}, draft={draft}) failed: {out.stderr.strip()[-2000:]}")
    return float(out.stdout.strip().splitlines()[-1]) * 1000 / args.tokens


def worker(args: argparse.Namespace) -> int:
    if args.worker in ("after", "before"):
        spent = run_localspec(args.model, args.size, args.tokens, args.draft, args.threads)
    elif args.worker == "lcp":
        spent = run_lcp(args.model, args.tokens, args.threads)
    else:
        spent = run_llama_server(args.llama_server, args.model, args.size, args.tokens, args.draft, args.threads)
    print(spent)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-server", help="llama.cpp's llama-server (scripts/build_llama_server.sh builds one)")
    ap.add_argument("--before", type=Path, help="another checkout, for its rows beside this one's")
    ap.add_argument("--sizes", default="1,2,4,8")
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--worker", choices=["after", "before", "lcp", "llama-server"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--draft", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.before is not None and not (args.before / "localspec" / "__init__.py").is_file():
        raise SystemExit(f"--before {args.before} holds no localspec package; give a checkout's folder.")
    sizes = [int(s) for s in args.sizes.split(",")]
    engines = ["after"] + (["before"] if args.before else []) + (["llama-server"] if args.llama_server else [])
    cells: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_model(Path(tmp))
        for rep in range(args.reps):
            for size in sizes:
                for draft in (False, True):
                    order = engines[rep % len(engines):] + engines[:rep % len(engines)]
                    if size == 1 and not draft:
                        order = order + ["lcp"]
                    for engine in order:
                        ms = cell(engine, args, model, size, draft)
                        key = f"{engine}|{size}|{'draft' if draft else 'plain'}"
                        cells.setdefault(key, []).append(ms)
                        print(f"rep {rep + 1}: {key}: {ms:.3f} ms a token", flush=True)
    med = {k: statistics.median(v) for k, v in cells.items()}
    print(f"\nms per generated token of one request (a step of all of them), medians of {args.reps}, "
          f"{args.tokens} tokens, {args.threads} threads:")
    print(_table(med, sizes, engines))
    if args.json:
        Path(args.json).write_text(json.dumps({"cells": cells, "medians": med, "tokens": args.tokens,
                                               "threads": args.threads, "reps": args.reps}, indent=1))
    return 0


def _table(med: dict[str, float], sizes: list[int], engines: list[str]) -> str:
    head = ["S"]
    for kind in ("plain", "draft"):
        head += [f"{e} {kind}" for e in engines]
        if "llama-server" in engines:
            head.append(f"{kind}: after / llama-server")
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for size in sizes:
        row = [str(size)]
        for kind in ("plain", "draft"):
            row += [_fmt(med.get(f"{e}|{size}|{kind}")) for e in engines]
            if "llama-server" in engines:
                a, b = med.get(f"after|{size}|{kind}"), med.get(f"llama-server|{size}|{kind}")
                row.append(f"{a / b:.2f}" if a and b else "")
        rows.append("| " + " | ".join(row) + " |")
    if "lcp|1|plain" in med:
        rows.append(f"\nllama-cpp-python's loop, one stream: {med['lcp|1|plain']:.3f} ms a token; localspec's one "
                    f"stream plain: {med['after|1|plain'] / med['lcp|1|plain']:.2f}x of it")
    return "\n".join(rows)


def _fmt(x: Optional[float]) -> str:
    return "" if x is None else f"{x:.3f}"


if __name__ == "__main__":
    sys.exit(main())
