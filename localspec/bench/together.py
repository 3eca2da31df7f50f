"""Requests sent together, against servers: how soon each one is done when several arrive at once.

Agents run sub-agents side by side and chat apps send a title request beside the answer, so a server meets
requests together. The workloads are those cases:

* ``title``: a ~3k-token request, then one second later a 16-token title request beside it;
* ``fanout``: three sub-agent-like requests, ~700-token prompts, 48 tokens each;
* ``new``: four requests writing new text, 128 tokens each;
* ``mixed``: two writing new text and two copying (fix a paragraph's spelling, rename a function in a module);
* ``copy``: four copying requests;
* ``alone``: one new-text request of 128 tokens, nothing beside it: what a request costs on its own.

Each server is started afresh for every workload and repetition (no prompt of the last one cached; localspec's
prompt cache off), answers a short request first, then gets the workload's requests at once, each on its own
connection, streamed and greedy. The servers go in turn, their order rotating from one workload to the next.
What counts is each request's end, from the workload's start: the last one's (all done) and their mean.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..errors import ConfigError
from .agent import Request, RunningServer, ServerSpec, ask

NEW = ("Write a short story about a lighthouse keeper who finds a message in a bottle.",
       "Explain how a hash map works, with an example in Python.",
       "Describe the water cycle for a ten-year-old.",
       "List ten ideas for a weekend project with a Raspberry Pi, one line each.")
PARAGRAPH = ("Teh quick brown fox jumpd over the lazy dog, wich was sleeping in the sun. The dog didnt notice, "
             "becuase it was dreaming of chasing rabits across the feild behind the old farm house.")
MODULE = "\n".join(f"def compute_total_{i}(items):\n    total = 0\n    for item in items:\n        total += item.price"
                   f" * item.count\n    return total\n" for i in range(4))
COPY = (f"Fix the spelling in this paragraph and give only the fixed paragraph:\n\n{PARAGRAPH}",
        f"Rename compute_total_0 to order_total in this module and give the whole module:\n\n{MODULE}")


@dataclass(frozen=True)
class Sent:
    """One request of a workload: when it is sent (seconds after the first), its user turn and reply length."""

    delay: float
    content: str
    max_tokens: int


def workloads() -> dict[str, list[Sent]]:
    """The workloads by name."""
    fan = "Read this module and answer in one sentence: {}\n\n" + MODULE * 6
    asks = ("what does compute_total_0 return?", "which loop variable is used?", "how many functions are there?")
    return {
        "title": [Sent(0.0, "Summarise this module in detail:\n\n" + MODULE * 28, 64),
                  Sent(1.0, "Write a 3-word title for a chat about summing order totals.", 16)],
        "fanout": [Sent(0.0, fan.format(a), 48) for a in asks],
        "new": [Sent(0.0, p, 128) for p in NEW],
        "mixed": [Sent(0.0, p, 128) for p in (*NEW[:2], *COPY)],
        "copy": [Sent(0.0, p, 128) for p in COPY * 2],
        "alone": [Sent(0.0, NEW[1], 128)],
    }


@dataclass
class TogetherRun:
    """One server's answers to one workload: each request's end from the workload's start, and its timings."""

    server: str
    workload: str
    ends: list[float] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)


@dataclass
class TogetherReport:
    """Every run, and what the servers and the machine were."""

    specs: list[ServerSpec]
    names: list[str]
    runs: list[TogetherRun]
    machine: dict[str, Any]

    def of(self, server: str, workload: str) -> list[TogetherRun]:
        return [r for r in self.runs if r.server == server and r.workload == workload]

    def to_dict(self) -> dict[str, Any]:
        return {"workloads": self.names, "machine": self.machine, "servers": [asdict(s) for s in self.specs],
                "runs": [asdict(r) for r in self.runs]}


def send_together(server: RunningServer, sent: Sequence[Sent]) -> TogetherRun:
    """The workload's requests, each from its own thread at its delay; each one's end from the start."""
    run = TogetherRun(server.spec.name, "")
    run.ends, run.requests = [0.0] * len(sent), [Request("", 0.0, 0.0)] * len(sent)
    failed: list[str] = []
    t0 = time.perf_counter()

    def one(i: int) -> None:
        time.sleep(sent[i].delay)
        try:
            _, run.requests[i] = ask(server.port, server.model, [{"role": "user", "content": sent[i].content}],
                                     sent[i].max_tokens)
        except (OSError, http.client.HTTPException, ConfigError) as exc:
            failed.append(f"request {i + 1}: {exc}")
        run.ends[i] = time.perf_counter() - t0

    threads = [threading.Thread(target=one, args=(i,), name=f"bench-request-{i}") for i in range(len(sent))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise ConfigError(f"{server.spec.name} failed {failed[0]}; its log: {server.log_tail()}")
    return run


def run_together_bench(specs: Sequence[ServerSpec], names: Sequence[str], reps: int = 3,
                       machine: Optional[dict[str, Any]] = None,
                       progress: Callable[[str], None] = lambda _: None) -> TogetherReport:
    """Every workload of ``names`` ``reps`` times on every server, each started afresh for it.

    Raises:
        ConfigError: an unknown workload, a server that did not start, or a request answered with an error.
    """
    known = workloads()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"There is no workload {unknown[0]!r}; the workloads are {', '.join(known)}.")
    report = TogetherReport(list(specs), list(names), [], machine or {})
    env = {**os.environ, "LOCALSPEC_PROMPT_CACHE": "off", "LOCALSPEC_HISTORY": "off"}
    turn = 0
    for rep in range(reps):
        for name in names:
            for spec in [*specs[turn % len(specs):], *specs[:turn % len(specs)]]:  # who goes first moves on
                with contextlib.closing(RunningServer(spec, env)) as server:
                    server.wait_ready()
                    try:  # a short request first, as a server that has been running has answered
                        ask(server.port, server.model, [{"role": "user", "content": "Hi."}], 2)
                    except (OSError, http.client.HTTPException, ConfigError) as exc:
                        raise ConfigError(f"{spec.name} failed its warm-up request: {exc}; its log: "
                                          f"{server.log_tail()}") from None
                    run = send_together(server, known[name])
                run.workload = name
                report.runs.append(run)
                progress(f"repetition {rep + 1}, {name}, {spec.name}: all done {max(run.ends):.1f} s, each "
                         + " ".join(f"{t:.1f}" for t in run.ends))
            turn += 1
    return report


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def render_together(report: TogetherReport) -> str:
    """A table per workload: per server, the medians of all done, the mean and each request's end, and all
    done over localspec's."""
    out = ["Requests together: each workload's requests sent at once (the title one 1 s after the long one), "
           "streamed and greedy, each server started afresh; seconds from the workload's start, medians over "
           "repetitions. 'vs localspec': that server's all-done time over localspec's (above 1: localspec is "
           "done sooner)."]
    for name in report.names:
        sent = workloads()[name]
        out += ["", f"{name}: " + ", ".join(f"{len(s.content)} chars/{s.max_tokens} tokens" for s in sent)]
        head = f"{'server':<36} {'all done':>9} {'mean':>7} {'vs localspec':>12}  each request"
        out += [head, "-" * len(head)]
        ours = _median([max(r.ends) for r in report.of(report.specs[0].name, name)])
        for spec in report.specs:
            runs = report.of(spec.name, name)
            done = _median([max(r.ends) for r in runs])
            each = [_median([r.ends[i] for r in runs]) for i in range(len(sent))]
            out.append(f"{spec.name:<36} {done:>8.1f}s {_median([statistics.mean(r.ends) for r in runs]):>6.1f}s "
                       f"{done / ours:>11.2f}x  " + " ".join(f"{t:.1f}" for t in each))
    out += [f"  {s.name}: {s.note}" for s in report.specs if s.note]
    return "\n".join(out)


def write_together_json(report: TogetherReport, path: Path) -> None:
    """The whole report as JSON."""
    Path(path).write_text(json.dumps(report.to_dict(), indent=1))
