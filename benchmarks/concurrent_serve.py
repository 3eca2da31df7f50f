"""Requests sent together to `localspec serve` and to llama-server, the same model, threads and context.

Starts each server fresh for each repetition (alternating which goes first), sends the workload's requests at
once as ``localspec bench --together`` does (greedy, streamed chat completions) and times each request's end and
the last one's. Unlike the bench, it sets localspec's ``--parallel``, ``-m`` and both sides' flash attention. The
workloads are the bench's (``copy`` too):

* ``new``: four requests writing new text, 128 tokens each;
* ``mixed``: two writing new text and two copying (fix a paragraph's spelling, rename a function);
* ``fanout``: three sub-agent-like requests of a ~700-token prompt each, 48 tokens each;
* ``title``: a ~3k-token request, then 1 s later a 16-token title request beside it (the title's time counts).

    python benchmarks/concurrent_serve.py TARGET.gguf --llama-server PATH [--draft DRAFT.gguf]
        [--workload new] [--parallel 4] [--threads 2] [--reps 3] [--method plain] [--flash-attn on|off]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys

from localspec.bench.agent import RunningServer, ServerSpec
from localspec.bench.together import send_together, workloads


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
    known = workloads()
    if args.workload not in known:
        raise SystemExit(f"unknown workload {args.workload!r}; the workloads are {', '.join(known)}")
    requests = known[args.workload]
    localspec = ServerSpec("localspec serve", (
        sys.executable, "-m", "localspec", "serve", "-t", args.target, "-d", args.draft or "none", "--ctx",
        str(args.ctx), "--threads", str(args.threads), "--threads-batch", str(args.threads), "--parallel",
        str(args.parallel), "-m", args.method, "--port", "{port}", "--quiet", "--flash-attn", args.flash_attn))
    llama = ServerSpec("llama-server", (
        args.llama_server, "-m", args.target, "-c", str(args.ctx), "-t", str(args.threads), "-tb",
        str(args.threads), "--port", "{port}", "-fa", args.flash_attn))
    env = {**os.environ, "LOCALSPEC_PROMPT_CACHE": "off", "LOCALSPEC_HISTORY": "off"}
    sides = [localspec, llama]
    times: dict[str, list[list[float]]] = {spec.name: [] for spec in sides}
    for rep in range(args.reps):
        for spec in (sides if rep % 2 == 0 else sides[::-1]):
            with contextlib.closing(RunningServer(spec, env)) as server:
                server.wait_ready()
                times[spec.name].append(send_together(server, requests).ends)
            print(f"rep {rep + 1}: {spec.name:16s} " + " ".join(f"{t:6.1f}" for t in times[spec.name][-1]) + " s",
                  flush=True)
    print(f"{args.workload}: {len(requests)} requests, {args.threads}/{args.threads} threads, context {args.ctx}, "
          f"flash attention {args.flash_attn}, localspec --parallel {args.parallel} -m {args.method}, llama-server's "
          f"automatic slots; medians of "
          f"{args.reps}:")
    for name in times:
        last = statistics.median(max(r) for r in times[name])
        mean = statistics.median(statistics.mean(r) for r in times[name])
        each = [statistics.median(r[i] for r in times[name]) for i in range(len(requests))]
        print(f"  {name:16s} all done {last:6.1f} s, mean {mean:6.1f} s, each " + " ".join(f"{t:.1f}" for t in each))
    return 0


if __name__ == "__main__":
    sys.exit(main())
