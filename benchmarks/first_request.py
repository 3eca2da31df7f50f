"""An agent's first request, to `localspec serve` and to llama-server: seconds to the first content delta.

An agent's first turn on a CPU is one long prompt (Claude Code's system prompt and tools are about 21k
tokens) that nothing has read yet. This sends a captured Messages body, streamed and with ``max_tokens``
cut to 8, to each server started fresh (localspec in a new empty home, so its prompt cache holds
nothing), alternating which goes first, and times the first ``content_block_delta``. Both servers get the
same model, context and threads, and their defaults otherwise (localspec's auto method with the draft
model when one is given; llama-server's automatic slots).

Capture the body once (answers every request with a 400, so the client gives up after its first turn)::

    python benchmarks/first_request.py capture --port 8100 --out bodies/
    ANTHROPIC_BASE_URL=http://127.0.0.1:8100 ANTHROPIC_AUTH_TOKEN=unused ANTHROPIC_MODEL=target claude -p "hi"

then time it::

    python benchmarks/first_request.py time TARGET.gguf bodies/01-v1_messages.json --llama-server PATH
        [--draft DRAFT.gguf] [--ctx 32768] [--threads 2] [--reps 3]
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from localspec.bench.agent import RunningServer, ServerSpec


def capture(port: int, out: Path) -> None:
    """Save each POST body under ``out`` (numbered, named by route) and answer it with a 400."""
    out.mkdir(parents=True, exist_ok=True)
    counter = itertools.count()

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            name = self.path.strip("/").split("?")[0].replace("/", "_")
            (out / f"{next(counter):02d}-{name}.json").write_bytes(body)
            reply = {"type": "error", "error": {"type": "invalid_request_error", "message": "captured"}}
            self.send_response(400)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps(reply).encode())

    print(f"saving request bodies to {out}; Ctrl-C to stop", flush=True)
    http.server.ThreadingHTTPServer(("127.0.0.1", port), Recorder).serve_forever()


def first_delta(port: int, body: dict[str, Any]) -> float:
    """Seconds from sending ``body`` to the first content delta of its streamed reply."""
    t0 = time.monotonic()
    headers = {"anthropic-version": "2023-06-01", "x-api-key": "unused"}
    with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/messages", json=body, headers=headers,
                      timeout=7200) as r:
        if r.status_code >= 400:
            raise SystemExit(f"the server answered {r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if line.startswith("event: content_block_delta"):
                return time.monotonic() - t0
    raise SystemExit("the reply ended with no content delta")


def time_both(args: argparse.Namespace) -> int:
    body = json.loads(Path(args.body).read_text())
    body.update(max_tokens=8, stream=True)
    localspec = ServerSpec("localspec serve", (
        sys.executable, "-m", "localspec", "serve", "-t", args.target, "-d", args.draft or "none", "--ctx",
        str(args.ctx), "--threads", str(args.threads), "--threads-batch", str(args.threads), "--port", "{port}",
        "--quiet"))
    llama = ServerSpec("llama-server", (args.llama_server, "-m", args.target, "-c", str(args.ctx), "-t",
                                        str(args.threads), "-tb", str(args.threads), "--port", "{port}"))
    times: dict[str, list[float]] = {"localspec serve": [], "llama-server": []}
    for rep in range(args.reps):
        for spec in ([localspec, llama] if rep % 2 == 0 else [llama, localspec]):
            with tempfile.TemporaryDirectory() as home:
                env = {**os.environ, "LOCALSPEC_HOME": home}  # nothing cached for localspec; llama-server ignores it
                with contextlib.closing(RunningServer(spec, env)) as server:
                    server.wait_ready(seconds=600)
                    times[spec.name].append(first_delta(server.port, body))
            print(f"rep {rep + 1}: {spec.name:16s} first delta {times[spec.name][-1]:7.1f} s", flush=True)
    ours, theirs = (statistics.median(times[n]) for n in times)
    print(f"context {args.ctx}, {args.threads}/{args.threads} threads, medians of {args.reps}: localspec serve "
          f"{ours:.1f} s, llama-server {theirs:.1f} s, ratio {ours / theirs:.3f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    cap = sub.add_parser("capture", help="record a client's request bodies")
    cap.add_argument("--port", type=int, default=8100)
    cap.add_argument("--out", type=Path, required=True)
    tim = sub.add_parser("time", help="time the first content delta on both servers")
    tim.add_argument("target")
    tim.add_argument("body")
    tim.add_argument("--llama-server", required=True)
    tim.add_argument("--draft")
    tim.add_argument("--ctx", type=int, default=32768)
    tim.add_argument("--threads", type=int, default=2)
    tim.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    if args.command == "capture":
        capture(args.port, args.out)
        return 0
    return time_both(args)


if __name__ == "__main__":
    sys.exit(main())
