"""``localspec bench --together``'s workloads with another localspec checkout as a row: a change's before and after
in one run, beside localspec decoding plainly and llama-server (with and without the draft model), and with
``--lcp`` llama-cpp-python's server. The first row is the checkout this script is in, so a copy of it
(``git worktree``) can be measured while work goes on.
With ``--agent`` it runs ``localspec bench --agent``'s conversations instead (one request at a time, the
servers side by side, the order rotating): what a change does to a request alone and to its follow-ups.

Each server is started afresh for every workload and repetition, their order rotating, as the bench does
(``localspec.bench.together``); the other checkout's server is this Python running that folder's
``localspec`` package. Prints the bench's tables and writes its JSON.

    python benchmarks/together_ab.py TARGET.gguf --before DIR [--draft DRAFT.gguf] [--llama-server PATH]
        [--workload title --workload fanout ...] [--reps 3] [--threads 2] [--ctx 32768] [--no-plain]
        [--no-llama-draft] [--lcp] [--json OUT.json]
    python benchmarks/together_ab.py TARGET.gguf --before DIR --agent [--draft ...] [--llama-server PATH] [--reps 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from localspec.bench.agent import (
    ServerSpec,
    llama_cpp_python_specs,
    llama_cpp_server_installed,
    llama_server_spec,
    localspec_spec,
    plain_variant,
    render_agent,
    run_agent_bench,
    with_draft,
    write_agent_json,
)
from localspec.bench.machine import host_info
from localspec.bench.together import render_together, run_together_bench, workloads, write_together_json

ROOT = Path(__file__).resolve().parents[1]


def from_checkout(spec: ServerSpec, folder: Path, name: str) -> ServerSpec:
    """``spec``'s ``python -m localspec ...`` run from ``folder``'s package instead of the installed one."""
    boot = (f"import runpy, sys; sys.path.insert(0, {str(folder)!r}); "
            "runpy.run_module('localspec', run_name='__main__', alter_sys=True)")
    argv = list(spec.argv[3:])
    if "--mmproj" in argv and "--mmproj" not in (folder / "localspec" / "cli" / "shared.py").read_text():
        del argv[argv.index("--mmproj"):argv.index("--mmproj") + 2]  # a checkout from before images
    return ServerSpec(name, (spec.argv[0], "-c", boot, *argv), f"{spec.note}; the package of {folder}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target")
    ap.add_argument("--before", required=True, type=Path, help="the other checkout (its folder holds localspec/)")
    ap.add_argument("--draft")
    ap.add_argument("--llama-server")
    ap.add_argument("--workload", action="append", choices=sorted(workloads()))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--no-plain", action="store_true", help="leave out localspec decoding plainly")
    ap.add_argument("--no-llama-draft", action="store_true", help="leave out llama-server with the draft model")
    ap.add_argument("--lcp", action="store_true", help="add llama-cpp-python's server (requests queued)")
    ap.add_argument("--agent", action="store_true", help="bench --agent's conversations instead of --together's")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.agent and args.workload:
        raise SystemExit("--agent runs bench --agent's conversations; leave out --workload.")
    if not (args.before / "localspec" / "__init__.py").is_file():
        raise SystemExit(f"--before {args.before} holds no localspec package; give a checkout's folder.")
    installed = localspec_spec(args.target, args.draft, args.threads, args.threads, args.ctx, 0, None, 0)
    ours = from_checkout(installed, ROOT, installed.name)  # this checkout's, whatever is installed
    specs = [ours, from_checkout(installed, args.before.resolve(), "localspec serve, before")]
    # one request at a time (--agent): localspec decoding plainly and llama-server's draft add nothing to compare
    specs += [] if args.no_plain or args.agent else [plain_variant(ours)]
    if args.lcp:
        if not llama_cpp_server_installed():
            raise SystemExit("--lcp needs llama-cpp-python's server: pip install 'llama-cpp-python[server]'.")
        specs += llama_cpp_python_specs(args.target, args.threads, args.threads, args.ctx, 0)[:1]
    if args.llama_server:
        llama = llama_server_spec(args.llama_server, args.target, args.threads, args.threads, args.ctx, 0)
        drafted = args.draft and not (args.no_llama_draft or args.agent)
        specs += [llama] + ([with_draft(llama, args.draft)] if drafted else [])
    machine = {**host_info(), "threads": args.threads, "threads_batch": args.threads, "n_ctx": args.ctx,
               "target": args.target, "draft": args.draft, "before": str(args.before)}
    if args.agent:
        agent = run_agent_bench(specs, reps=args.reps, machine=machine, progress=lambda s: print(s, flush=True))
        print(render_agent(agent))
        if args.json:
            write_agent_json(agent, Path(args.json))
        return 0
    names = args.workload or list(workloads())
    report = run_together_bench(specs, names, args.reps, machine, progress=lambda s: print(s, flush=True))
    print(render_together(report))
    if args.json:
        write_together_json(report, Path(args.json))
    return 0


if __name__ == "__main__":
    sys.exit(main())
