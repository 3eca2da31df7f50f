"""`localspec serve` on the real pair: a streamed chat answer end to end, a full queue, a client leaving."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time

import openai
import pytest
from conftest import real_models_dir
from serverproc import ServeProcess

pytestmark = pytest.mark.real
QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = real_models_dir()
    s = ServeProcess(["-t", str(d / "target.gguf"), "-d", str(d / "draft.gguf"), "--ctx", "2048",
                      "--max-queue", "1", "--parallel", "1"], tmp_path_factory.mktemp("serve-real"), timeout=300)
    yield s
    s.close()


def test_a_streamed_chat_answer_with_speculation_stats(server):
    client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=120)
    chunks = list(client.chat.completions.create(model="target", messages=QUESTION, max_tokens=16, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
    final = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    assert final.choices[0].finish_reason == "stop"
    timings = final.model_extra["timings"]
    assert "draft_n_accepted" in timings and timings["predicted_n"] == chunks[-1].usage.completion_tokens
    assert timings["predicted_per_second"] > 0 and final.model_extra["localspec"]["method"] == "auto"


def test_a_full_queue_answers_503_and_a_leaving_client_cancels_its_generation(server):
    client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=120)
    before = server.get("/health")["generations"]
    answer = client.chat.completions.create(model="target", messages=QUESTION, max_tokens=16,
                                            temperature=0).choices[0].message.content
    long = client.chat.completions.create(model="target", stream=True, max_tokens=400, temperature=0, messages=[
        {"role": "user", "content": "Write a very long story about a lighthouse keeper."}])
    next(iter(long))  # it is generating now
    queued: dict[str, str] = {}
    waiting = threading.Thread(target=lambda: queued.setdefault("text", client.chat.completions.create(
        model="target", messages=QUESTION, max_tokens=16, temperature=0).choices[0].message.content))
    waiting.start()
    deadline = time.monotonic() + 30
    while server.get("/health")["queued"] < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    status, reply, headers = server.post("/v1/completions", b'{"prompt": "hi", "max_tokens": 2}')
    assert status == 503 and reply["error"]["code"] == "server_busy" and int(headers["Retry-After"]) > 0
    started = time.monotonic()
    long.close()  # the client goes away mid-stream
    waiting.join(timeout=60)
    assert time.monotonic() - started < 20  # far less than the 400 tokens the story asked for
    after = server.get("/health")["generations"]
    assert after["cancelled"] == before["cancelled"] + 1 and after["failed"] == 0
    assert queued["text"] == answer  # the queued request ran next, on consistent caches


def _open_request(server, body: dict) -> socket.socket:
    """A raw client that sends a request and then neither reads nor closes until told."""
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
              f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


def _wait_for(server, ready, limit: float = 30) -> float:
    started = time.monotonic()
    while not ready(server.get("/health")):
        assert time.monotonic() - started < limit
        time.sleep(0.05)
    return time.monotonic() - started


LONG_PROMPT = "Summarise this log.\n" + "".join(f"line {i}: request {i * 7919 % 1000} served in {i % 13} ms\n"
                                               for i in range(100))
LONG = {"messages": [{"role": "user", "content": "Write a very long story about a lighthouse keeper."}],
        "max_tokens": 1500, "temperature": 0}


def test_a_client_that_hangs_up_on_a_whole_answer_frees_the_worker_within_a_second(server):
    client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=120)
    want = client.chat.completions.create(model="target", messages=QUESTION, max_tokens=16, temperature=0)
    before = server.get("/health")["generations"]["cancelled"]
    s = _open_request(server, LONG)
    _wait_for(server, lambda h: h["running"] == 1)
    time.sleep(2)  # well into the reply
    s.close()
    took = _wait_for(server, lambda h: h["running"] == 0 and h["generations"]["cancelled"] == before + 1, 10)
    assert took < 1.5, took  # the disconnect is seen within a quarter second, the next token stops it
    again = client.chat.completions.create(model="target", messages=QUESTION, max_tokens=16, temperature=0)
    assert again.choices[0].message.content == want.choices[0].message.content  # the caches stayed consistent


@pytest.mark.parametrize("stream", [False, True])
def test_a_queued_client_that_leaves_is_dropped_from_the_queue(server, stream):
    client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=120)
    long = client.chat.completions.create(model="target", stream=True, **LONG)
    next(iter(long))  # it is generating now
    before = server.get("/health")["generations"]["cancelled"]
    s = _open_request(server, {**LONG, "max_tokens": 16, "stream": stream})
    _wait_for(server, lambda h: h["queued"] == 1)
    s.close()
    took = _wait_for(server, lambda h: h["queued"] == 0 and h["generations"]["cancelled"] == before + 1, 10)
    assert took < 1.5 and server.get("/health")["running"] == 1, took  # the running one was not disturbed
    time.sleep(0.5)
    assert server.get("/health")["generations"]["cancelled"] == before + 1  # counted once
    long.close()


def test_a_client_that_leaves_during_a_long_prompt_frees_the_worker_at_once(server):
    client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=120)
    want = client.chat.completions.create(model="target", messages=QUESTION, max_tokens=16, temperature=0)
    before = server.get("/health")["generations"]["cancelled"]
    s = _open_request(server, {"messages": [{"role": "user", "content": LONG_PROMPT}], "max_tokens": 8})
    _wait_for(server, lambda h: h["running"] == 1)
    time.sleep(1)  # well inside the prompt's processing, which takes several seconds here
    s.close()
    took = _wait_for(server, lambda h: h["running"] == 0 and h["generations"]["cancelled"] == before + 1, 10)
    assert took < 1.5, took
    again = client.chat.completions.create(model="target", messages=QUESTION, max_tokens=16, temperature=0)
    assert again.choices[0].message.content == want.choices[0].message.content


@pytest.mark.parametrize("sig,during,parallel", [(signal.SIGTERM, "decoding", 1), (signal.SIGINT, "decoding", 3),
                                                 (signal.SIGTERM, "prompt", 1), (signal.SIGTERM, "prompt", 3)])
def test_a_signal_mid_generation_ends_the_server_within_seconds(tmp_path, sig, during, parallel):
    d = real_models_dir()
    s = ServeProcess(["-t", str(d / "target.gguf"), "--ctx", "2048", "--threads", "2", "-m", "plain",
                      "--parallel", str(parallel)], tmp_path, timeout=300)
    try:
        client = openai.OpenAI(base_url=s.url, api_key="x", max_retries=0, timeout=120)
        if during == "decoding":
            stream = client.chat.completions.create(model="target", stream=True, **LONG)
            next(iter(stream))
        else:  # a long prompt runs, two more wait (or, three at once, run beside it)
            running = _open_request(s, {"messages": [{"role": "user", "content": LONG_PROMPT}], "max_tokens": 8})
            _wait_for(s, lambda h: h["running"] == 1)
            waiting = [_open_request(s, {**LONG, "max_tokens": 4}) for _ in range(2)]
            _wait_for(s, lambda h: h["queued"] == 2 if parallel == 1 else h["running"] == 3)
            time.sleep(0.5)
        started = time.monotonic()
        s.proc.send_signal(sig)
        s.proc.wait(timeout=5)
        assert time.monotonic() - started < 5
        assert "Traceback" not in s.output()
        if during == "prompt":  # every client was told why, none got a 500
            for sock in [running, *waiting]:
                reply = sock.recv(65536)
                assert reply.startswith(b"HTTP/1.1 503") and b"shutting down" in reply, reply[:200]
    finally:
        s.close()


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def test_structured_replies_and_tool_calls_on_the_real_pair(server):
    import jsonschema

    client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=120)
    ask = [{"role": "user", "content": "Ada Lovelace was 36. Give her name and age as JSON."}]
    r = client.chat.completions.create(model="target", messages=ask, max_tokens=40, temperature=0, response_format={
        "type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
    person = json.loads(r.choices[0].message.content)
    jsonschema.validate(person, PERSON)
    assert person == {"name": "Ada Lovelace", "age": 36}
    r = client.chat.completions.create(model="target", messages=ask, max_tokens=120, temperature=0,
                                       response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop" and isinstance(json.loads(r.choices[0].message.content), dict)

    weather = [{"role": "user", "content": "What's the weather in Paris, in celsius?"}]
    r = client.chat.completions.create(model="target", messages=weather, tools=[WEATHER_TOOL], tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=60, temperature=0)
    (call,) = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "C"}
    chunks = list(client.chat.completions.create(model="target", messages=weather, tools=[WEATHER_TOOL],
                                                 tool_choice="required", parallel_tool_calls=False, max_tokens=60,
                                                 temperature=0, stream=True))
    streamed = "".join(d.function.arguments or "" for c in chunks if c.choices
                       for d in c.choices[0].delta.tool_calls or [])
    assert streamed == call.function.arguments
