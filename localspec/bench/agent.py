"""An agent's workload against servers: two conversations taking turns, each request resending its conversation.

Coding agents send a long system prompt (rules and tool definitions) and a
source file, then resend the whole conversation on every turn, and switch
between conversations (a sub-agent, a title call, a second session). What the
user waits for is the prompt, so this workload reports each request's time to
the first token as well as its total time.

``localspec serve`` and its peers run as separate processes on the same model
file, thread budget and context, all started before the first request, and
each answers one short request first, as a server that has been running has. The
requests go A1 B1 A2 B2 A3 B3; each one is sent to every server in turn, the
servers' order rotating from one request to the next, so that load from
other programs slows them alike. Each server keeps its own conversations
(its own replies in them). The follow-ups, every request but each
conversation's first, are where a prompt cache shows.

The peers are llama-cpp-python's own server (``python -m llama_cpp.server``,
plain and with its RAM cache; it needs ``pip install 'llama-cpp-python[server]'``)
and llama.cpp's ``llama-server`` where one is given or on the PATH.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from ..errors import ConfigError

#: How long a server may take to load its model and answer its first probe.
START_SECONDS = 300.0
#: A request's longest wait, prompt processing included.
REQUEST_SECONDS = 3600.0

#: The coding agent's tools, as the system prompt lists them.
TOOLS = [{"name": name, "description": what, "parameters": {"type": "object", "properties": {
    "path": {"type": "string", "description": "a file in the repository"},
    "text": {"type": "string", "description": "the text to write or find"}}, "required": ["path"]}}
    for name, what in (("read_file", "Read a file of the repository and return its text."),
                       ("write_file", "Replace a file's text with new text."),
                       ("grep", "Find the lines of a file that hold a text."),
                       ("run_tests", "Run the tests of one file and return their output."))]


@dataclass(frozen=True)
class Conversation:
    """One agent conversation: its system prompt, first user turn and follow-up questions."""

    name: str
    system: str
    first: str
    follow_ups: tuple[str, ...]
    image: Optional[bytes] = None  # sent with the first user turn, as an OpenAI image_url part


def _package_text(*names: str) -> str:
    """The source of some of localspec's own modules: a repository's text, installed with the package."""
    here = Path(__file__).resolve().parent.parent
    return "\n".join((here / name).read_text(encoding="utf-8") for name in names)


def _system_prompt(rules: str, words: int) -> str:
    """Rules for a coding agent cut to ``words`` words, then the tools as JSON."""
    return " ".join(rules.split()[:words]) + "\n\nTools:\n" + json.dumps(TOOLS, indent=1)


def conversations(scale: float = 1.0) -> list[Conversation]:
    """The two conversations; ``scale`` 1 gives system prompts of about 1.4k and 0.6k tokens (the tools'
    0.2k included) and files of 1.2k tokens on a Qwen2.5 vocabulary."""
    if scale <= 0:
        raise ConfigError(f"The agent workload's scale must be above 0, got {scale}.")
    # the rules' filler: project notes
    notes = _package_text("decoding/engine.py", "prompt_cache/cache.py", "server/worker.py")
    a_file, b_file = _package_text("drafting/costs.py"), _package_text("drafting/drafters.py")
    return [
        Conversation("A", _system_prompt("You are a coding agent working in a Python repository. Project notes:\n"
                                         + notes, max(1, int(640 * scale))),
                     "Here is localspec/drafting/costs.py:\n```python\n" + a_file[: int(4500 * scale)]
                     + "\n```\nWhat does it do?",
                     ("Which function chooses K?", "Suggest one test for it.")),
        Conversation("B", _system_prompt("You review Python code for bugs and style. Be brief. Project notes:\n"
                                         + notes[20000:], max(1, int(220 * scale))),
                     "Review this file:\n```python\n" + b_file[: int(5000 * scale)] + "\n```",
                     ("Which class is the longest?", "Name one possible bug.")),
    ]


def image_conversations(image: bytes) -> list[Conversation]:
    """The image workload: an image described, then two follow-up questions about it (the image resent with each,
    as clients resend it: where a prompt cache holds the image, the follow-ups read only the new turns)."""
    return [Conversation("A", "You are a helpful assistant that describes images precisely.",
                         "Describe this image in detail.",
                         ("What colours dominate it?", "Is there any text in it? Quote it."), image)]


@dataclass(frozen=True)
class ServerSpec:
    """How to start one server: its row name, its command (``{port}`` filled in) and what to note about it."""

    name: str
    argv: tuple[str, ...]
    note: str = ""


def localspec_spec(target: str, draft: Optional[str], threads: int, threads_batch: int, ctx: int,
                   gpu_layers: int, cache_ram: Optional[int], cache_disk: int, mmproj: Optional[str] = None
                   ) -> ServerSpec:
    """``localspec serve`` on the files, with its prompt cache (``cache_*`` in MiB; None: its default) and the
    target's vision projector where one is given (else none, found beside it or not)."""
    argv = [sys.executable, "-m", "localspec", "serve", "-t", target, "-d", draft or "none", "--ctx", str(ctx),
            "--threads", str(threads), "--threads-batch", str(threads_batch), "--port", "{port}", "--no-history",
            "--cache-disk", str(cache_disk), "--mmproj", mmproj or "none"]
    argv += ["--gpu-layers", str(gpu_layers)]
    if cache_ram is not None:
        argv += ["--cache-ram", str(cache_ram)]
    disk = "no disk tier, so every run starts cold" if cache_disk == 0 else f"{cache_disk} MiB on disk"
    return ServerSpec("localspec serve", tuple(argv), f"prompt cache on ({disk}), drafting auto, history off")


def llama_cpp_python_specs(target: str, threads: int, threads_batch: int, ctx: int,
                           gpu_layers: int) -> list[ServerSpec]:
    """llama-cpp-python's server on the target: at its defaults, and with its RAM prompt cache."""
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", target, "--n_ctx", str(ctx), "--n_threads",
            str(threads), "--n_threads_batch", str(threads_batch), "--host", "127.0.0.1", "--port", "{port}",
            "--n_gpu_layers", str(gpu_layers),
            # requests sent together wait their turn: at its default, a new request cuts the running one short
            "--interrupt_requests", "false"]
    queued = "requests queued (--interrupt_requests false)"
    return [ServerSpec("llama-cpp-python server", tuple(argv),
                       f"its defaults otherwise: no prompt cache, flash attention off; {queued}"),
            ServerSpec("llama-cpp-python server, RAM cache", (*argv, "--cache", "true", "--cache_type", "ram"),
                       f"--cache true --cache_type ram (2 GiB), flash attention off (its default); {queued}")]


def llama_server_spec(program: str, target: str, threads: int, threads_batch: int, ctx: int,
                      gpu_layers: int, mmproj: Optional[str] = None) -> ServerSpec:
    """llama.cpp's llama-server on the target, its host-RAM prompt cache at its default, no draft; with the same
    vision projector as localspec's where one is given."""
    argv = [program, "-m", target, "-c", str(ctx), "-t", str(threads), "-tb", str(threads_batch),
            "--host", "127.0.0.1", "--port", "{port}", "-ngl", str(gpu_layers)]
    argv += ["--mmproj", mmproj] if mmproj else ["--no-mmproj"]
    return ServerSpec("llama-server", tuple(argv),
                      "its defaults: host-RAM prompt cache, flash attention auto, no draft")


def plain_variant(spec: ServerSpec) -> ServerSpec:
    """``localspec serve`` as ``spec`` starts it, decoding plainly with no draft model: the row that tells what
    batching gives from what speculation adds."""
    argv = list(spec.argv)
    argv[argv.index("-d") + 1] = "none"
    return ServerSpec(f"{spec.name}, plain", (*argv, "--method", "plain"), "no draft model, no drafting")


def with_draft(spec: ServerSpec, draft: str) -> ServerSpec:
    """llama-server as ``spec`` starts it, speculating with ``draft`` at its default draft length."""
    return ServerSpec(f"{spec.name} + draft", (*spec.argv, "-md", draft, "--spec-type", "draft-simple"),
                      "the draft model at llama-server's default draft length")


def find_llama_server(given: Optional[str]) -> Optional[str]:
    """``given`` (which must run), else a ``llama-server`` on the PATH, else None."""
    if given is None:
        return shutil.which("llama-server")
    found = shutil.which(given)
    if found is None:
        raise ConfigError(f"--llama-server {given} is not a program this user can run; give the path of llama.cpp's "
                          "llama-server.")
    return found


def llama_cpp_server_installed() -> bool:
    """Whether llama-cpp-python's server can start here (its ``server`` extra is installed)."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None
               for m in ("fastapi", "uvicorn", "sse_starlette", "starlette_context", "pydantic_settings"))


@dataclass
class Request:
    """One request's measurements on one server."""

    request: str
    ttft: float
    total: float
    prompt_tokens: Optional[int] = None
    cached_tokens: Optional[int] = None
    reply_tokens: Optional[int] = None


@dataclass
class ServerRun:
    """One server's requests in one repetition."""

    server: str
    requests: list[Request] = field(default_factory=list)

    @property
    def follow_ups(self) -> list[Request]:
        """Every request but each conversation's first."""
        return [r for r in self.requests if not r.request.endswith("1")]

    @property
    def whole(self) -> float:
        return sum(r.total for r in self.requests)

    @property
    def follow_up_seconds(self) -> float:
        return sum(r.total for r in self.follow_ups)


@dataclass
class AgentReport:
    """Every server's runs, and what the servers were."""

    specs: list[ServerSpec]
    runs: list[ServerRun]
    machine: dict[str, Any]
    max_tokens: int
    scale: float
    image: bool = False  # the image workload (``image_conversations``) rather than the agent's

    def of(self, server: str) -> list[ServerRun]:
        return [r for r in self.runs if r.server == server]

    def to_dict(self) -> dict[str, Any]:
        return {"workload": {"max_tokens": self.max_tokens, "scale": self.scale, "image": self.image},
                "machine": self.machine, "servers": [asdict(s) for s in self.specs],
                "runs": [{"server": r.server, "requests": [asdict(q) for q in r.requests]} for r in self.runs]}


@dataclass(frozen=True)
class Endpoint:
    """A running server's row name, port on 127.0.0.1 and the model name it answers to."""

    name: str
    port: int
    model: str


def free_port() -> int:
    """A TCP port nothing listens on now, on the loopback address."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RunningServer:
    """A server process started from a ``ServerSpec``, its log in a temporary file, stopped on ``close``."""

    def __init__(self, spec: ServerSpec, env: Optional[dict[str, str]] = None):
        self.spec, self.port = spec, free_port()
        self._log = tempfile.TemporaryFile()
        argv = [a.replace("{port}", str(self.port)) for a in spec.argv]
        try:
            self._proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=env)
        except OSError as exc:
            self._log.close()
            raise ConfigError(f"Could not start {spec.name} ({argv[0]}): {exc.strerror}.") from None
        self.model = ""

    def wait_ready(self, seconds: float = START_SECONDS) -> None:
        """Until the server lists its models; its log's end in the error if it exits or takes too long."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise ConfigError(f"{self.spec.name} exited with status {self._proc.returncode} before it answered: "
                                  f"{self.log_tail()}")
            with contextlib.suppress(OSError, http.client.HTTPException, ValueError):
                status, body = _get(self.port, "/v1/models")
                if status == 200:
                    models = json.loads(body).get("data") or [{}]
                    self.model = str(models[0].get("id", ""))
                    return
            time.sleep(0.5)
        raise ConfigError(f"{self.spec.name} did not answer within {seconds:.0f} s: {self.log_tail()}")

    @property
    def endpoint(self) -> Endpoint:
        """Where requests go (once ``wait_ready`` has returned)."""
        return Endpoint(self.spec.name, self.port, self.model)

    def log_tail(self, lines: int = 5) -> str:
        self._log.seek(0)
        return " | ".join(self._log.read().decode(errors="replace").strip().splitlines()[-lines:]) or "(no output)"

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()


def _get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def ask(port: int, model: str, messages: Sequence[dict[str, str]], max_tokens: int) -> tuple[str, Request]:
    """One streamed, greedy chat completion: its reply and its timings (``request`` left for the caller)."""
    body = json.dumps({"model": model, "messages": list(messages), "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_SECONDS)
    t0 = time.perf_counter()
    first: Optional[float] = None
    parts: list[str] = []
    usage: dict[str, Any] = {}
    try:
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise ConfigError(f"The server answered {resp.status}: {resp.read()[:300].decode(errors='replace')}")
        for event in _sse_events(resp):
            if event.get("error"):
                raise ConfigError(f"The server failed during the reply: {json.dumps(event['error'])[:300]}")
            choices = event.get("choices") or []
            delta = (choices[0].get("delta") or {}) if choices else {}
            if delta.get("content") or delta.get("reasoning_content"):  # reasoning is output too
                first = first if first is not None else time.perf_counter() - t0
            if delta.get("content"):
                parts.append(delta["content"])  # what a client sends back in the conversation
            usage = event.get("usage") or usage
    finally:
        conn.close()
    total = time.perf_counter() - t0
    details = usage.get("prompt_tokens_details") or {}
    return "".join(parts), Request("", first if first is not None else total, total, usage.get("prompt_tokens"),
                                   details.get("cached_tokens"), usage.get("completion_tokens"))


def _sse_events(resp: http.client.HTTPResponse) -> Iterator[dict[str, Any]]:
    """The JSON events of a server-sent event stream, up to ``[DONE]``."""
    for raw in resp:
        line = raw.decode("utf-8", errors="replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        with contextlib.suppress(ValueError):
            yield json.loads(data)


def _first(conv: Conversation) -> Any:
    """A conversation's first user turn: its text, after its image where it has one."""
    if conv.image is None:
        return conv.first
    url = "data:image/png;base64," + base64.b64encode(conv.image).decode()
    return [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": conv.first}]


def _rotated(items: Sequence[Any], by: int) -> list[Any]:
    by %= len(items)
    return [*items[by:], *items[:by]]


def run_once(servers: Sequence[Endpoint], convs: Sequence[Conversation], max_tokens: int,
             progress: Callable[[str], None] = lambda _: None) -> list[ServerRun]:
    """The workload once on every server, request by request, each request on every server in turn."""
    history = {(s.name, c.name): [{"role": "system", "content": c.system}, {"role": "user", "content": _first(c)}]
               for s in servers for c in convs}
    runs = {s.name: ServerRun(s.name) for s in servers}
    turns = 1 + min(len(c.follow_ups) for c in convs)
    order = [(turn, c) for turn in range(turns) for c in convs]  # A1 B1 A2 B2 ...
    for i, (turn, conv) in enumerate(order):
        for server in _rotated(servers, i):  # who goes first moves on each request
            msgs = history[(server.name, conv.name)]
            try:
                reply, req = ask(server.port, server.model, msgs, max_tokens)
            except (OSError, http.client.HTTPException) as exc:
                raise ConfigError(f"{server.name} failed on request {conv.name}{turn + 1}: {exc}") from None
            except ConfigError as exc:
                raise ConfigError(f"{server.name} on request {conv.name}{turn + 1}: {exc}") from None
            req.request = f"{conv.name}{turn + 1}"
            runs[server.name].requests.append(req)
            progress(f"{server.name} {req.request}: first token {req.ttft:.2f} s, total {req.total:.2f} s")
            if turn < turns - 1:
                msgs += [{"role": "assistant", "content": reply}, {"role": "user", "content": conv.follow_ups[turn]}]
    return list(runs.values())


def run_agent_bench(specs: Sequence[ServerSpec], max_tokens: int = 32, scale: float = 1.0, reps: int = 1,
                    machine: Optional[dict[str, Any]] = None,
                    progress: Callable[[str], None] = lambda _: None, image: Optional[bytes] = None) -> AgentReport:
    """Start every server, run the workload ``reps`` times (the servers started afresh each time), stop them.
    With ``image``, the workload is ``image_conversations``'s instead of the agent's.

    Raises:
        ConfigError: a server did not start, or answered a request with an error (its log's end is said).
    """
    convs = conversations(scale) if image is None else image_conversations(image)
    report = AgentReport(list(specs), [], machine or {}, max_tokens, scale, image is not None)
    env = {**os.environ, "LOCALSPEC_PROMPT_CACHE": "on"}
    for rep in range(reps):
        with contextlib.ExitStack() as stack:
            servers = []
            for spec in specs:  # one at a time: a server that measures its machine at start measures it alone
                server = RunningServer(spec, env)
                stack.callback(server.close)
                server.wait_ready()
                servers.append(server)
            for server in servers:  # a short request first, as a server that has been running has answered
                try:  # two tokens: localspec's draft model reads a prompt after the first
                    ask(server.port, server.model, [{"role": "user", "content": "Hi."}], 2)
                except (OSError, http.client.HTTPException, ConfigError) as exc:
                    raise ConfigError(f"{server.spec.name} failed its warm-up request: {exc}; its log: "
                                      f"{server.log_tail()}") from None
            progress(f"repetition {rep + 1} of {reps}: {len(servers)} servers ready")
            report.runs += run_once([s.endpoint for s in servers], convs, max_tokens, progress)
    return report


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def render_agent(report: AgentReport) -> str:
    """The report as a table: per server, medians over repetitions, and the follow-ups against localspec's."""
    names = [s.name for s in report.specs]
    if not names:
        return "Agent workload: no server ran."
    ours = _median([r.follow_up_seconds for r in report.of(names[0])]) or float("nan")
    head = (f"{'server':<36} {'whole run':>9} {'follow-ups':>10} {'vs localspec':>12} {'follow-up first token':>22} "
            f"{'prompt tok/s':>12}")
    what = "Image workload: an image described (A1), then two follow-up questions (A2, A3)" if report.image else \
        "Agent workload: conversations A and B taking turns (A1 B1 A2 B2 A3 B3)"
    out = [f"{what}, each request resending its "
           f"conversation, greedy, {report.max_tokens} tokens a reply; medians of {len(report.of(names[0]))} "
           "repetition(s). 'vs localspec': that server's follow-up seconds over localspec's (above 1: localspec "
           "is faster). 'prompt tok/s': each conversation's first request, prompt tokens over time to first token "
           "(where the server counts them).", head,
           "-" * len(head)]
    for name in names:
        runs = report.of(name)
        ttfts = [q.ttft for r in runs for q in r.follow_ups]
        firsts = [q for r in runs for q in r.requests if q.request.endswith("1")]  # nothing cached yet
        rate = _median([q.prompt_tokens / q.ttft for q in firsts if q.prompt_tokens and q.ttft > 0])
        follow = _median([r.follow_up_seconds for r in runs])
        out.append(f"{name:<36} {_median([r.whole for r in runs]):>8.1f}s {follow:>9.1f}s {follow / ours:>11.2f}x "
                   f"{min(ttfts, default=0):>10.2f}-{max(ttfts, default=0):.2f} s "
                   f"{'-' if rate != rate else f'{rate:.1f}':>12}")
    out += [f"  {s.name}: {s.note}" for s in report.specs if s.note]
    return "\n".join(out)


def write_agent_json(report: AgentReport, path: Path) -> None:
    """The whole report as JSON."""
    Path(path).write_text(json.dumps(report.to_dict(), indent=1))
