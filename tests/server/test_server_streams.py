"""Every streaming route, through the one relay: its first bytes come while a long prompt is still being
processed, keep-alives in a form its clients skip follow, a client that hangs up during the prompt frees the
worker, and each API's own client reads its stream through the keep-alives to the same text as the whole
reply. The real application on the tiny pair, its prompts held as long as a test says (``SlowPair``)."""

from __future__ import annotations

import socket
import threading
import time

import anthropic
import ollama
import openai
import pytest
from inprocess import SlowPair, local_server, post, serving

import localspec
from localspec.server import relay

MESSAGES = [{"role": "user", "content": "The cat sat on the mat and"}]
#: Each streaming route: its path, a streamed request, a keep-alive's bytes, and the bytes of its stream's end.
ROUTES = {
    "chat completions": ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 8, "stream": True},
                         b": keep-alive", b"data: [DONE]"),
    "completions": ("/v1/completions", {"prompt": "once upon a time", "max_tokens": 8, "stream": True},
                    b": keep-alive", b"data: [DONE]"),
    "messages": ("/v1/messages", {"model": "target", "messages": MESSAGES, "max_tokens": 8, "stream": True},
                 b"event: ping", b"event: message_stop"),
    "responses": ("/v1/responses", {"input": "The cat sat on the mat and", "max_output_tokens": 8, "stream": True},
                  b": keep-alive", b"event: response.completed"),
    "ollama chat": ("/api/chat", {"model": "target", "messages": MESSAGES, "options": {"num_predict": 8}},
                    b'"done": false', b'"done": true'),
    "ollama generate": ("/api/generate", {"model": "target", "prompt": "hello", "options": {"num_predict": 8}},
                        b'"done": false', b'"done": true'),
}


@pytest.fixture(scope="module")
def served(tiny_dir):
    with localspec.load(tiny_dir / "target.gguf", tiny_dir / "draft.gguf", n_ctx=1024, history=False) as pair:
        slow = SlowPair(pair)
        server = local_server(slow)
        with serving(server) as port:
            yield slow, server, port


def _read(sock: socket.socket, data: bytes, until: bytes) -> bytes:
    """``data`` and what comes after it, up to ``until`` (or the end of the connection)."""
    while until not in data:
        got = sock.recv(65536)
        if not got:
            break
        data += got
    return data


@pytest.mark.parametrize("route", ROUTES)
def test_a_stream_starts_and_keeps_alive_before_the_first_token_of_a_long_prompt(served, route, monkeypatch):
    monkeypatch.setattr(relay, "PING_SECONDS", 0.2)
    slow, _, port = served
    path, body, keep_alive, end = ROUTES[route]
    slow.gate.clear()  # the prompt takes until the gate opens: no token can come before
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            sent = time.monotonic()
            s.sendall(post(path, body, port))
            first = s.recv(65536)
            assert first.startswith(b"HTTP/1.1 200") and time.monotonic() - sent < 2.0, first
            assert keep_alive in _read(s, first, keep_alive) and not slow.gate.is_set()
            slow.gate.set()
            assert end in _read(s, b"", end)
    finally:
        slow.gate.set()


@pytest.mark.parametrize("route", ROUTES)
def test_a_client_hanging_up_during_a_long_prompt_frees_the_worker(served, route):
    slow, server, port = served
    path, body, _, end = ROUTES[route]
    cancelled = server.counts["cancelled"]
    slow.gate.clear()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(post(path, body, port))
            assert s.recv(65536).startswith(b"HTTP/1.1 200")  # the prompt is being processed
        deadline = time.monotonic() + 10
        while (server.jobs or server.counts["cancelled"] == cancelled) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not server.jobs and server.counts["cancelled"] == cancelled + 1  # the prompt never got further
    finally:
        slow.gate.set()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:  # the next request is served
        s.sendall(post(path, body, port))
        assert end in _read(s, b"", end)


def _openai(port: int) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=30)


def _chat(port: int, stream: bool) -> str:
    r = _openai(port).chat.completions.create(model="target", messages=MESSAGES, max_tokens=8, stream=stream)
    return "".join(c.choices[0].delta.content or "" for c in r if c.choices) if stream else r.choices[0].message.content


def _completion(port: int, stream: bool) -> str:
    r = _openai(port).completions.create(model="target", prompt="once upon a time", max_tokens=8, stream=stream)
    return "".join(c.choices[0].text for c in r) if stream else r.choices[0].text


def _response(port: int, stream: bool) -> str:
    r = _openai(port).responses.create(model="target", input="The cat sat on", max_output_tokens=8, stream=stream)
    return "".join(e.delta for e in r if e.type == "response.output_text.delta") if stream else r.output_text


def _message(port: int, stream: bool) -> str:
    client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="x", max_retries=0, timeout=30)
    r = client.messages.create(model="target", messages=MESSAGES, max_tokens=8, stream=stream)
    return "".join(e.delta.text for e in r if e.type == "content_block_delta") if stream else r.content[0].text


def _ollama_chat(port: int, stream: bool) -> str:
    r = ollama.Client(host=f"http://127.0.0.1:{port}", timeout=30).chat(
        "target", messages=MESSAGES, options={"num_predict": 8}, stream=stream)
    return "".join(c.message.content or "" for c in r) if stream else r.message.content


def _ollama_generate(port: int, stream: bool) -> str:
    r = ollama.Client(host=f"http://127.0.0.1:{port}", timeout=30).generate(
        "target", prompt="hello", options={"num_predict": 8}, stream=stream)
    return "".join(c.response for c in r) if stream else r.response


@pytest.mark.parametrize("ask", [_chat, _completion, _response, _message, _ollama_chat, _ollama_generate])
def test_each_apis_own_client_reads_its_stream_through_the_keep_alives(served, ask, monkeypatch):
    """The openai, anthropic and ollama packages skip the keep-alives: the text is the whole reply's."""
    monkeypatch.setattr(relay, "PING_SECONDS", 0.1)
    slow, _, port = served
    slow.gate.clear()
    opening = threading.Timer(1.0, slow.gate.set)  # about ten keep-alives first
    opening.start()
    try:
        streamed = ask(port, True)
    finally:
        opening.cancel()
        slow.gate.set()
    assert streamed == ask(port, False)
