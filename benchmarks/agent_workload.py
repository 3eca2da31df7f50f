"""The agent workload of ``localspec bench --agent`` against one server that is already running.

``localspec bench --agent`` starts its servers itself; this script sends the
same two conversations (A1 B1 A2 B2 A3 B3, each request resending its
conversation, streamed) to any OpenAI-compatible server you started, for
cases the bench does not start, such as a restart on a saved prompt cache.
It prints each request's time to first token and total time, and the
follow-ups' sum (every request but each conversation's first).

    python benchmarks/agent_workload.py --url http://127.0.0.1:8080 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from urllib.parse import urlsplit

from localspec.bench.agent import Endpoint, ServerRun, conversations, run_once


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="the server's address, such as http://127.0.0.1:8080")
    ap.add_argument("--model", default="target", help="the model name to send")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--scale", type=float, default=1.0, help="prompt sizes, as bench --agent's --scale")
    ap.add_argument("--json", type=Path, help="write the requests as JSON here")
    args = ap.parse_args()
    port = urlsplit(args.url).port or 80
    run: ServerRun = run_once([Endpoint("server", port, args.model)], conversations(args.scale), args.max_tokens,
                              progress=lambda line: print(line, flush=True))[0]
    follow = run.follow_ups
    print(f"whole run {run.whole:.1f} s; follow-ups {run.follow_up_seconds:.1f} s; follow-up first token "
          f"{min(r.ttft for r in follow):.2f}-{max(r.ttft for r in follow):.2f} s")
    if args.json:
        args.json.write_text(json.dumps([vars(r) for r in run.requests], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
