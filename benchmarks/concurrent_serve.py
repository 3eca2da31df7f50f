"""Requests sent together to `localspec serve` and to llama-server, the same model, threads and context.

Starts each server fresh for each repetition (alternating which goes first), sends the workload's requests at
once through the ``openai`` client (greedy, streamed) and times each request's end and the last one's. The
workloads are the cases agents and chat apps make:

* ``new``: four requests writing new text, 128 tokens each;
* ``mixed``: two writing new text and two copying (fix a paragraph's spelling, rename a function);
* ``fanout``: three sub-agent-like requests of a ~700-token prompt each, 48 tokens each;
* ``title``: a ~3k-token request, then 1 s later a 16-token title request beside it (the title's time counts).

    python benchmarks/concurrent_serve.py TARGET.gguf --llama-server PATH [--draft DRAFT.gguf]
        [--workload new] [--parallel 4] [--threads 2] [--reps 3] [--method plain] [--flash-attn on|off]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Optional

import openai

from localspec.bench.together import workloads

PORT = 8941


def workload(name: str) -> list[tuple[float, list[dict[str, str]], int]]:
    """(delay in seconds, messages, max_tokens) of each request: ``localspec bench --together``'s workloads."""
    known = workloads()
    if name not in known:
        raise SystemExit(f"unknown workload {name!r}; the workloads are {', '.join(known)}")
    return [(s.delay, [{"role": "user", "content": s.content}], s.max_tokens) for s in known[name]]


def start(cmd: list[str], env: Optional[dict[str, str]] = None) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"{cmd[0]} did not start")


def send(requests: list[tuple[float, list[dict[str, str]], int]], model: str, extra: dict[str, Any]) -> list[float]:
    """Each request's seconds from the workload's start to its last token."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{PORT}/v1", api_key="x", max_retries=0, timeout=3600)
    done: list[float] = [0.0] * len(requests)
    failed: list[BaseException] = []
    t0 = time.perf_counter()

    def one(i: int) -> None:
        delay, messages, n = requests[i]
        time.sleep(delay)
        try:
            for _ in client.chat.completions.create(model=model, messages=messages, max_tokens=n,  # type: ignore
                                                    temperature=0, stream=True, extra_body=extra):
                pass
        except Exception as exc:  # raised below, once the others are done
            failed.append(exc)
        done[i] = time.perf_counter() - t0

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise SystemExit(f"a request failed: {failed[0]}")
    return done


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target")
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--workload", default="new")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--method", default="plain")
    ap.add_argument("--flash-attn", choices=["on", "off"], default="on",
                    help="flash attention on both sides (llama-server's automatic choice on a CPU is on)")
    args = ap.parse_args()
    requests = workload(args.workload)
    localspec = [sys.executable, "-m", "localspec", "serve", "-t", args.target, "-d", args.draft or "none",
                 "--ctx", str(args.ctx), "--threads", str(args.threads), "--threads-batch", str(args.threads),
                 "--parallel", str(args.parallel), "-m", args.method, "--port", str(PORT), "--quiet",
                 "--flash-attn", args.flash_attn]
    llama = [args.llama_server, "-m", args.target, "-c", str(args.ctx), "-t", str(args.threads), "-tb",
             str(args.threads), "--port", str(PORT), "-fa", args.flash_attn]
    env = {**os.environ, "LOCALSPEC_PROMPT_CACHE": "off", "LOCALSPEC_HISTORY": "off"}
    sides = {"localspec serve": (localspec, {"method": args.method}, env), "llama-server": (llama, {}, None)}
    times: dict[str, list[list[float]]] = {name: [] for name in sides}
    for rep in range(args.reps):
        for name in (list(sides) if rep % 2 == 0 else list(reversed(sides))):
            cmd, extra, environ = sides[name]
            proc = start(cmd, environ)
            try:
                times[name].append(send(requests, Path(args.target).stem, extra))
            finally:
                proc.terminate()
                proc.wait()
            print(f"rep {rep + 1}: {name:16s} " + " ".join(f"{t:6.1f}" for t in times[name][-1]) + " s", flush=True)
    print(f"{args.workload}: {len(requests)} requests, {args.threads}/{args.threads} threads, context {args.ctx}, "
          f"flash attention {args.flash_attn}, localspec --parallel {args.parallel} -m {args.method}, llama-server's "
          f"automatic slots; medians of "
          f"{args.reps}:")
    for name in sides:
        last = statistics.median(max(r) for r in times[name])
        mean = statistics.median(statistics.mean(r) for r in times[name])
        each = [statistics.median(r[i] for r in times[name]) for i in range(len(requests))]
        print(f"  {name:16s} all done {last:6.1f} s, mean {mean:6.1f} s, each " + " ".join(f"{t:.1f}" for t in each))
    return 0


if __name__ == "__main__":
    sys.exit(main())
