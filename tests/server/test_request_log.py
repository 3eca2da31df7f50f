"""`serve` says what each request did: one line per request through every API's own client (a 200, a 400 with
its reason, a client that hangs up, a request the guard refuses), progress while a long prompt is read, the
prompt's text only when verbose, and nothing with --quiet."""

from __future__ import annotations

import re
import socket
import threading
import time

import anthropic
import ollama
import openai
import pytest
from inprocess import SlowPair, local_server, post, serving
from serverproc import ServeProcess

import localspec
from localspec.server import request_log

MESSAGES = [{"role": "user", "content": "The cat sat on the mat and"}]


class Lines:
    """The log's lines, as the server writes them from its threads."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, line: str) -> None:
        with self.lock:
            self.lines.append(line)

    def wait(self, n: int, timeout: float = 30) -> list[str]:
        """The first ``n`` lines, once there are that many."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.lines) >= n:
                    return list(self.lines[:n])
            time.sleep(0.02)
        raise AssertionError(f"{n} lines expected, got {self.lines}")

    def clear(self) -> None:
        with self.lock:
            self.lines.clear()


@pytest.fixture(scope="module")
def logged(tiny_dir):
    with localspec.load(tiny_dir / "target.gguf", tiny_dir / "draft.gguf", n_ctx=1024, history=False) as pair:
        slow = SlowPair(pair)
        lines = Lines()
        server = local_server(slow)
        with serving(server, log=lines, verbose_log=False) as port:
            yield slow, server, port, lines


@pytest.fixture
def log(logged):
    slow, server, port, lines = logged
    lines.clear()
    slow.gate.set()
    return logged


def fields(line: str) -> list[str]:
    return line.split(" | ")


def test_a_generation_through_each_client_leaves_one_line_with_its_counts(log):
    _, _, port, lines = log
    base = f"http://127.0.0.1:{port}"
    openai.OpenAI(base_url=base + "/v1", api_key="x").chat.completions.create(
        model="target", messages=MESSAGES, max_tokens=8)
    anthropic.Anthropic(base_url=base, api_key="x").messages.create(model="target", messages=MESSAGES,
                                                                      max_tokens=8)
    openai.OpenAI(base_url=base + "/v1", api_key="x").responses.create(model="target", input="The cat sat",
                                                                        max_output_tokens=8)
    list(ollama.Client(host=base).chat(model="target", messages=MESSAGES, options={"num_predict": 8},
                                        stream=True))
    got = lines.wait(4)
    expected = [("openai", "POST /v1/chat/completions"), ("anthropic", "POST /v1/messages"),
                ("responses", "POST /v1/responses"), ("ollama", "POST /api/chat")]
    for line, (api, route) in zip(got, expected, strict=True):
        f = fields(line)
        assert re.fullmatch(r"\d\d:\d\d:\d\d", f[0]), line
        assert f[1:5] == [api, route, "target", "200"], line
        assert re.search(r"prompt \d+ \(read \d+, restored \d+(, kept \d+)?\), generated [1-8] \(drafted \d+, "
                         r"accepted \d+\), first token \d+\.\d\d s", f[5]), line
        assert re.fullmatch(r"\d+\.\d\d s", f[6]), line
        assert f[7] in ("ended: stop", "ended: length"), line
        assert "The cat" not in line  # no prompt text unless verbose
    assert len(lines.lines) == 4


def test_a_refused_request_says_the_sentence_its_client_got(log):
    _, _, port, lines = log
    base = f"http://127.0.0.1:{port}"
    with pytest.raises(openai.BadRequestError) as oa:
        openai.OpenAI(base_url=base + "/v1", api_key="x").chat.completions.create(
            model="target", messages=[], max_tokens=8)
    with pytest.raises(anthropic.BadRequestError) as an:
        anthropic.Anthropic(base_url=base, api_key="x").messages.create(
            model="target", messages=[{"role": "assistant", "content": "hi"}], max_tokens=8)
    with pytest.raises(ollama.ResponseError) as ol:
        ollama.Client(host=base).chat(model="no-such-model", messages=MESSAGES)
    got = lines.wait(3)
    said = [oa.value.body["message"], an.value.body["error"]["message"], ol.value.error]
    for line, status, sentence in zip(got, ("400", "400", "404"), said, strict=True):
        f = fields(line)
        assert f[4] == status, line
        assert f[-1] == f"refused: {sentence}", line


def test_a_request_the_guard_refuses_has_its_line(log):
    _, _, port, lines = log
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n")
        while s.recv(65536):
            pass
    (line,) = lines.wait(1)
    f = fields(line)
    assert f[1:5] == ["models", "GET /v1/models", "-", "403"], line
    assert f[-1].startswith("refused: Host 'evil.example' is not this server's loopback address"), line


def test_a_client_that_hangs_up_during_the_prompt_is_said_to_have_cancelled(log):
    slow, server, port, lines = log
    slow.gate.clear()  # the prompt takes until the gate opens
    body = {"messages": MESSAGES, "max_tokens": 8, "stream": True}
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(post("/v1/chat/completions", body, port))
        assert b"200 OK" in s.recv(65536)  # the stream has begun
    (line,) = lines.wait(1)
    slow.gate.set()
    f = fields(line)
    assert f[1:4] == ["openai", "POST /v1/chat/completions", "target"], line
    assert f[5].startswith("prompt ") and ", generated 0 (" in f[5], line  # what it had done when given up
    assert f[-1] == "cancelled by the client", line


def _chat(s: ServeProcess) -> None:
    client = openai.OpenAI(base_url=s.url, api_key="x")
    client.chat.completions.create(model="target", messages=MESSAGES, max_tokens=4)


@pytest.mark.parametrize("flags", [[], ["--verbose"], ["--quiet"]])
def test_serve_writes_a_line_per_request_unless_quiet(tiny_dir, tmp_path, flags):
    s = ServeProcess(["-t", str(tiny_dir / "target.gguf"), "--ctx", "1024", "--no-history", "-m", "plain", *flags],
                     tmp_path)
    try:
        s.get("/v1/models")
        _chat(s)
        deadline = time.monotonic() + (1 if "--quiet" in flags else 10)  # a line comes just after its answer
        while "POST /v1/chat/completions" not in s.output() and time.monotonic() < deadline:
            time.sleep(0.05)
        out = s.output()
    finally:
        s.close()
    lines = [ln for ln in out.splitlines() if "POST /v1/chat/completions" in ln]
    if "--quiet" in flags:
        assert lines == [] and "GET /v1/models" not in out
        return
    (line,) = lines
    assert ("GET /health" in out) == ("--verbose" in flags)  # monitors' polls only when verbose
    assert " | openai | POST /v1/chat/completions | target | 200 | prompt " in line
    assert ("prompt 'The cat sat on the mat and'" in line) == ("--verbose" in flags)


def test_a_long_prompt_says_how_far_it_has_read(log, monkeypatch):
    slow, server, port, lines = log
    monkeypatch.setattr(request_log, "PROGRESS_SECONDS", 0.3)
    slow.gate.clear()
    slow.read = 3  # the stream says it holds 3 of the prompt's tokens
    body = {"model": "target", "messages": MESSAGES, "max_tokens": 4}
    done = threading.Event()

    def ask() -> None:
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(post("/v1/messages", body, port))
            while s.recv(65536):
                pass
        done.set()

    threading.Thread(target=ask, daemon=True).start()
    try:
        first, second = lines.wait(2)
    finally:
        slow.read = None
        slow.gate.set()
    assert done.wait(30)
    for line in (first, second):
        f = fields(line)
        assert f[1:4] == ["anthropic", "POST /v1/messages", "target"], line
        assert re.fullmatch(r"reading the prompt: 3 of \d+ tokens", f[4]), line  # no speed: it did not move
    (end,) = lines.wait(3)[2:]
    assert fields(end)[4] == "200" and fields(end)[-1] in ("ended: stop", "ended: length"), end


def test_a_whole_answer_given_up_during_its_prompt_says_what_it_had_read(log):
    slow, server, port, lines = log
    slow.gate.clear()
    slow.read = 500  # the held prompt says the model holds 500 of its tokens, those the caches gave included
    body = {"model": "target", "messages": MESSAGES, "max_tokens": 4}  # not streamed
    try:
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(post("/v1/messages", body, port))
            deadline = time.monotonic() + 10
            while not server.jobs or next(iter(server.jobs)).stream is None:  # its prompt is being read
                assert time.monotonic() < deadline
                time.sleep(0.02)
        (line,) = lines.wait(1)
    finally:
        slow.read = None
        slow.gate.set()
    f = fields(line)
    assert f[1:5] == ["anthropic", "POST /v1/messages", "target", "499"], line
    counts = re.match(r"prompt \d+ \(read (-?\d+), restored (\d+)(?:, kept (\d+))?\), generated 0 \(", f[5])
    assert counts, line
    read, restored, kept = (int(n or 0) for n in counts.groups())
    assert read == 500 - restored - kept, line  # what it had read, not what it would have
    assert f[-1] == "cancelled by the client", line


def test_a_route_that_fails_is_logged_as_a_500_with_its_reason(log, monkeypatch):
    _, _, port, lines = log
    from localspec.server.openai import routes

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(routes, "parse_request", broken)
    with pytest.raises(openai.InternalServerError):
        openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0).chat.completions.create(
            model="target", messages=MESSAGES, max_tokens=4)
    (line,) = lines.wait(1)
    f = fields(line)
    assert f[1:5] == ["openai", "POST /v1/chat/completions", "-", "500"], line
    assert f[-1] == "failed: The request failed: RuntimeError('boom').", line
