"""`localspec serve` against hostile web pages and careless clients, on the tiny models.

Each test is one probe of the hardening issue: the request that used to kill the
server, reach it from another site, or get a 500 or a silent ignore, and the
answer it must get now. Raw sockets where the HTTP layer itself is the input.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import anthropic
import ollama
import openai
import pytest
from clirun import run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serverproc import ServeProcess

from localspec.drafting.history import list_stores

N_VOCAB = 271  # tests/tinymodel.py's vocabulary: 256 bytes, 12 merges, 3 specials


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("serve-hostile")


@pytest.fixture(scope="module")
def server(tiny_dir, home):
    """History on, so that a request that must record nothing can be seen to record nothing."""
    s = ServeProcess(["-t", str(tiny_dir / "target.gguf"), "-d", str(tiny_dir / "draft.gguf"), "--ctx", "1024",
                      "--allow-origin", "http://localhost:3000"], home, env={"LOCALSPEC_HISTORY": "on"})
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="not-needed", max_retries=0, timeout=60)


def recorded(home) -> int:
    stores = list_stores(home / "history")
    return sum(c.records for _, _, c in stores)


def request(method: str, path: str, port: int, body: bytes = b"", headers: dict[str, str] | None = None,
            host: str | None = "default") -> bytes:
    lines = [f"{method} {path} HTTP/1.1"]
    if host == "default":
        host = f"127.0.0.1:{port}"
    if host is not None:
        lines.append(f"Host: {host}")
    for k, v in (headers or {}).items():
        lines.append(f"{k}: {v}")
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def error_of(body: bytes) -> dict:
    err = json.loads(body)["error"]
    assert err["message"].endswith(".") and "Traceback" not in err["message"]
    return err


@pytest.mark.parametrize("prompt", [[-1], [152000], [10, -5, 20], [N_VOCAB], [1099511627776], [2**70]])
def test_token_ids_outside_the_vocabulary_are_a_400_and_the_server_lives_on(server, client, home, prompt):
    before = recorded(home)
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="target", prompt=prompt, max_tokens=4)
    assert err.value.status_code == 400 and err.value.param == "prompt"
    assert "vocabulary" in err.value.message or "whole number" in err.value.message
    assert server.get("/health")["status"] == "ok"
    ok = client.completions.create(model="target", prompt=[10, 20, 30], max_tokens=4, temperature=0)
    assert ok.usage.completion_tokens >= 1
    assert recorded(home) == before + 1  # the refused request left nothing behind; the good one was recorded


def test_the_python_api_raises_instead_of_aborting(tiny_dir):
    code = f"""
import localspec
pair = localspec.load({str(tiny_dir / 'target.gguf')!r}, {str(tiny_dir / 'draft.gguf')!r}, n_ctx=256, history=False)
for bad in ([-1], [{N_VOCAB}], [5, 2**40], [1.5], [True]):
    try:
        pair.generate(bad, max_tokens=3)
    except localspec.TokenIdError as exc:
        print("refused:", exc)
for call in (lambda: pair.target.detokenize([-3]), lambda: pair.target.eval([999]), lambda: pair.target.is_eog(-2)):
    try:
        call()
    except localspec.TokenIdError as exc:
        print("refused:", exc)
print("after:", pair.generate([10, 20, 30], max_tokens=5, method="draft").tokens
      == pair.generate([10, 20, 30], max_tokens=5, method="plain").tokens)
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert len([ln for ln in lines if ln.startswith("refused:")]) == 8 and lines[-1] == "after: True"
    assert f"Token id -1 is outside the vocabulary of target.gguf, whose ids run from 0 to {N_VOCAB - 1}" in lines[0]
    assert "1.5 is not a whole number" in run.stdout and "True is not a whole number" in run.stdout


def test_a_padded_target_with_ids_the_draft_lacks(tmp_path):
    """A prompt with a padded target's extra ids cannot reach the draft model; plain decoding's tokens result."""
    code = f"""
import sys, warnings
sys.path.insert(0, {str(__import__('pathlib').Path(__file__).parent.parent)!r})
from tinymodel import write_tiny_model
import localspec
d = {str(tmp_path)!r}
write_tiny_model(d + "/padded.gguf", seed=0, pad_to=320)
write_tiny_model(d + "/draft.gguf", seed=0, noise=0.3)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pair = localspec.load(d + "/padded.gguf", d + "/draft.gguf", n_ctx=256, history=False)
prompt = [10, 20, 300, 30, 315, 40]
a = pair.generate(prompt, max_tokens=20, method="draft", k=3).tokens
b = pair.generate(prompt, max_tokens=20, method="plain").tokens
print(a == b, len(a))
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[0] == "True"


@pytest.mark.parametrize("host,status", [
    ("evil.example:{port}", 403), ("evil.example", 403), (":{port}", 403), ("", 403), (None, 0),
    ("localhost.evil.example:{port}", 403), ("127.0.0.1.nip.io:{port}", 403), ("localhost/health?", 403),
    ("localhost:{port}", 200), ("127.0.0.1:{port}", 200), ("[::1]:{port}", 200), ("LOCALHOST", 200),
])
def test_only_loopback_host_names_are_answered(server, host, status):
    got, body = server.raw(request("GET", "/v1/models", server.port,
                                   host=None if host is None else host.format(port=server.port)))
    if host is None:  # HTTP/1.1 without Host: the HTTP layer itself refuses it
        assert got in (400, 403)
        return
    assert got == status, body
    if status == 403:
        assert error_of(body)["code"] == "host_not_allowed"


def test_a_cross_site_page_cannot_use_the_server(server, home):
    before = recorded(home)
    body = b'{"prompt": "hi", "max_tokens": 3}'
    # A form or no-cors fetch from any page: text/plain, with the page's Origin.
    got, reply = server.raw(request("POST", "/v1/completions", server.port, body,
                                    {"Content-Type": "text/plain", "Origin": "http://evil.example"}))
    assert got == 403 and error_of(reply)["code"] == "origin_not_allowed"
    got, reply = server.raw(request("POST", "/v1/completions", server.port, body,
                                    {"Content-Type": "application/json", "Origin": "http://evil.example"}))
    assert got == 403
    got, reply = server.raw(request("POST", "/v1/completions", server.port, body, {"Content-Type": "text/plain"}))
    assert got == 415 and error_of(reply)["code"] == "unsupported_media_type"
    got, reply = server.raw(request("POST", "/v1/completions", server.port, body, {}))
    assert got == 415
    got, reply = server.raw(request("OPTIONS", "/v1/completions", server.port, headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}))
    assert got == 403
    assert recorded(home) == before  # nothing generated, nothing recorded


def test_an_allowed_origin_gets_cors_headers(server):
    origin = "http://localhost:3000"
    status, reply, headers = server.post("/v1/completions", b'{"prompt": "hi", "max_tokens": 2}',
                                         headers={"Origin": origin})
    assert status == 200 and headers["Access-Control-Allow-Origin"] == origin
    raw = request("OPTIONS", "/v1/chat/completions", server.port, headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type,authorization"})
    got, _ = server.raw(raw)
    assert got == 200
    # The Anthropic and OpenAI browser SDKs send headers of their own; a preflight naming them is allowed.
    sdk_headers = "x-api-key,anthropic-version,anthropic-beta,anthropic-dangerous-direct-browser-access,x-stainless-os"
    got, reply = server.raw(request("OPTIONS", "/v1/messages", server.port, headers={
        "Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": sdk_headers}))
    assert got == 200, reply  # a header outside the allowed list is a 400 "Disallowed CORS headers"
    status, _, headers = server.post("/v1/completions", b'{"prompt": "hi", "max_tokens": 2}')
    assert status == 200 and "Access-Control-Allow-Origin" not in headers  # none without an Origin


@pytest.mark.parametrize("body,param,code", [
    ({"prompt": "hi", "stream_options": "x"}, "stream_options", "invalid_type"),
    ({"prompt": "hi", "stream_options": {"include_usage": "yes"}}, "stream_options", "invalid_type"),
    ({"prompt": "hi", "mirostat": 2}, "mirostat", "unsupported_parameter"),
    ({"prompt": "hi", "repeat_penalty": 0}, "repeat_penalty", "invalid_value"),
    ({"prompt": "hi", "logit_bias": {"x": 1}}, "logit_bias", "invalid_value"),
    ({"prompt": "hi", "logit_bias": [1, 2]}, "logit_bias", "invalid_type"),
    ({"prompt": "hi", "ignore_eos": True}, "ignore_eos", "unsupported_parameter"),
    ({"prompt": "hi", "made_up_field": 1}, "made_up_field", "unknown_parameter"),
    ({"prompt": "hi", "max_tokens": 2.0}, "max_tokens", "invalid_type"),
    ({"prompt": "hi", "max_tokens": True}, "max_tokens", "invalid_type"),
    ({"prompt": "hi", "temperature": "0.5"}, "temperature", "invalid_type"),
    ({"prompt": "hi", "stream": "true"}, "stream", "invalid_type"),
    ({"prompt": "hi", "seed": -2}, "seed", "invalid_value"),
    ({"prompt": "hi", "stop": "x" * 200_000}, "stop", "invalid_value"),
    ({"prompt": "hi", "stop": ["a"] * 17}, "stop", "invalid_value"),
    ({"prompt": "hi", "speculative": {"method": "lookup", "depth": 3}}, "speculative", "unknown_parameter"),
    ({"prompt": [[1, 2], [3]]}, "prompt", None),
    ({"prompt": None}, "prompt", "invalid_type"),
    ({}, "prompt", "missing_parameter"),
])
def test_client_mistakes_are_400_error_objects_naming_the_field(server, body, param, code):
    status, reply, _ = server.post("/v1/completions", json.dumps(body).encode())
    assert status == 400, reply
    assert reply["error"]["param"] == param and reply["error"]["code"] == code, reply
    assert reply["error"]["message"].endswith(".")


@pytest.mark.parametrize("messages,fragment", [
    ([{"role": "wizard", "content": "hi"}], "role"),
    ([{"role": "tool", "content": "hi"}], "role"),
    ([{"role": "user", "content": 5}], "content"),
    ([{"role": "user", "content": "hi", "name": "bob"}], "name"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "without a vision projector"),
    ([{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}], "'input_audio' part"),
    ("hello", "messages"),
])
def test_bad_messages_are_400s(server, messages, fragment):
    status, reply, _ = server.post("/v1/chat/completions", json.dumps({"messages": messages}).encode())
    assert status == 400 and reply["error"]["param"] == "messages" and fragment in reply["error"]["message"], reply


def test_messages_as_clients_send_them_back_are_accepted(client):
    first = client.chat.completions.create(model="target", max_tokens=4, temperature=0,
                                           messages=[{"role": "developer", "content": "be brief"},
                                                     {"role": "user", "content": "hi"}])
    echoed = first.choices[0].message.model_dump()  # refusal, tool_calls... as None
    again = client.chat.completions.create(model="target", max_tokens=4, temperature=0, messages=[
        {"role": "user", "content": "hi"}, echoed, {"role": "user", "content": [{"type": "text", "text": "more"}]}])
    assert again.choices[0].message.content is not None


def test_json_nested_deeper_than_the_parser_goes_is_a_400(server):
    deep = b'{"prompt": "hi", "logit_bias": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    status, reply, _ = server.post("/v1/completions", deep)
    assert status == 400 and "nested too deeply" in reply["error"]["message"]
    status, reply, _ = server.post("/v1/completions", b"[" * 100_000 + b"]" * 100_000)
    assert status == 400


def test_seed_minus_one_is_a_random_seed(client):
    texts = {client.completions.create(model="target", prompt="once upon", max_tokens=12, temperature=1.0,
                                       seed=-1).choices[0].text for _ in range(4)}
    assert len(texts) > 1


def test_a_huge_body_is_refused_at_once(server):
    started = time.monotonic()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {60_000_000}\r\n\r\n").encode()
    status, reply = server.raw(head, body_chunks=4, chunk=b" " * 65536)
    assert status == 413 and error_of(reply)["code"] == "body_too_large" and "--max-body" in reply.decode()
    assert time.monotonic() - started < 1.0
    # the same without a length: chunked, counted as it arrives
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n").encode()
    piece = b"100000\r\n" + b" " * 0x100000 + b"\r\n"
    status, reply = server.raw(head, body_chunks=8, chunk=piece)
    assert status == 413
    assert server.get("/health")["status"] == "ok"


def test_a_client_that_writes_its_whole_too_large_body_before_reading_still_reads_the_413(server):
    import requests

    from localspec.server.app import MAX_BODY

    big = b'{"prompt": "' + b"x" * (3 * MAX_BODY) + b'"}'
    r = requests.post(f"{server.url}/completions", data=big, headers={"Content-Type": "application/json"},
                      timeout=60)  # requests writes the whole body, then reads
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(big)}\r\n\r\n").encode()
    status, reply = server.raw(head + big)  # a raw socket, the same way
    assert status == 413 and error_of(reply)["code"] == "body_too_large"
    assert server.get("/health")["status"] == "ok"


def test_a_prompt_that_cannot_fit_is_refused_before_it_is_tokenized(server):
    status, reply, _ = server.post("/v1/completions", json.dumps({"prompt": "x" * 3_000_000}).encode())
    assert status == 400 and reply["error"]["code"] == "context_length_exceeded"
    assert "characters" in reply["error"]["message"]


def test_no_history_on_the_server_is_absolute(tiny_dir, tmp_path):
    s = ServeProcess(["-t", str(tiny_dir / "target.gguf"), "--ctx", "512", "--no-history"], tmp_path,
                     env={"LOCALSPEC_HISTORY": "on"})
    try:
        client = openai.OpenAI(base_url=s.url, api_key="x", max_retries=0, timeout=60)
        for extra, param in (({"history": True}, "history"), ({"method": "history"}, "method"),
                             ({"speculative": {"method": "history"}}, "method")):
            with pytest.raises(openai.BadRequestError) as err:
                client.completions.create(model="target", prompt="hi", max_tokens=3, extra_body=extra)
            assert err.value.param == param and err.value.code == "history_off"
        client.completions.create(model="target", prompt="hi", max_tokens=3, extra_body={"history": False})
        client.completions.create(model="target", prompt="hi", max_tokens=3)
        assert recorded(tmp_path) == 0
    finally:
        s.close()


def test_the_operators_max_tokens_caps_every_request(tiny_dir, tmp_path):
    s = ServeProcess(["-t", str(tiny_dir / "target.gguf"), "--ctx", "512", "-n", "5", "-m", "plain"], tmp_path)
    try:
        client = openai.OpenAI(base_url=s.url, api_key="x", max_retries=0, timeout=60)
        r = client.completions.create(model="target", prompt=[10, 20], max_tokens=300, temperature=0,
                                      extra_body={"stop": []})
        assert r.usage.completion_tokens <= 5
    finally:
        s.close()


def test_the_api_key_is_checked_on_the_asgi_path_whatever_the_host(tiny_dir, tmp_path):
    s = ServeProcess(["-t", str(tiny_dir / "target.gguf"), "--ctx", "512", "--api-key", "k3y", "-m", "plain"], tmp_path)
    try:
        for host in ("x?", "localhost/health?", f"localhost:{s.port}/health?", f"127.0.0.1:{s.port}"):
            got, _ = s.raw(request("GET", "/v1/models", s.port, host=host))
            assert got in (401, 403), host
        got, _ = s.raw(request("GET", "/health", s.port))
        assert got == 200
        got, _ = s.raw(request("GET", "/v1/models", s.port, headers={"Authorization": "Bearer k3y"}))
        assert got == 200
    finally:
        s.close()


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True)
                    | st.text(max_size=20), lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
ROLES = st.sampled_from(["user", "system", "assistant", "developer", "wizard"])
MESSAGES = st.lists(st.fixed_dictionaries({"role": ROLES, "content": st.text(max_size=20)}), min_size=1, max_size=3)
PROMPTS = st.text(min_size=1, max_size=30) | st.lists(st.integers(-5, 400), min_size=1, max_size=6)
#: Mostly plausible values (often out of range), each also replaceable by any JSON at all.
FIELDS = {
    "model": st.sampled_from(["target", "gpt-4o"]), "max_tokens": st.integers(-3, 10),
    "max_completion_tokens": st.integers(-3, 10), "temperature": st.floats(-1, 3),
    "top_p": st.floats(-0.5, 1.5), "top_k": st.integers(-2, 50), "min_p": st.floats(-0.5, 1.5),
    "seed": st.integers(-3, 2**66), "stop": st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=3),
    "stream": st.booleans(), "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "method": st.sampled_from(["auto", "plain", "draft", "lookup", "history", "beam"]),
    "k": st.integers(-2, 20), "history": st.booleans(),
    "speculative": st.fixed_dictionaries({"method": st.sampled_from(["lookup", "draft", "x"]),
                                          "k": st.integers(-1, 20)}),
    "n": st.integers(0, 2), "logprobs": st.booleans(), "presence_penalty": st.floats(-3, 3),
    "logit_bias": st.dictionaries(st.sampled_from(["1", "5", "x", "-1", "999999"]), st.floats(-200, 200), max_size=3),
    "repeat_penalty": st.floats(-1, 3), "repeat_last_n": st.integers(-2, 100),
    "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"}]), "user": st.text(max_size=8),
    "ignore_eos": st.booleans(), "tools": st.just([]),
}
OPTIONAL = st.dictionaries(st.sampled_from(sorted(FIELDS)) | st.text(max_size=6), st.just(None), max_size=5).flatmap(
    lambda keys: st.fixed_dictionaries({k: (FIELDS[k] | FIELDS[k] | JSON) if k in FIELDS else JSON for k in keys}))


@st.composite
def bodies(draw, chat: bool):
    body = draw(OPTIONAL)
    main = "messages" if chat else "prompt"
    shape = draw(st.sampled_from(["good", "good", "good", "junk", "absent"]))
    if shape != "absent":
        body[main] = draw((MESSAGES if chat else PROMPTS) if shape == "good" else JSON)
    return body


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), chat=st.booleans())
def test_no_body_gives_a_5xx_or_stops_the_server(capped_server, data, chat):
    body = data.draw(bodies(chat))
    path = "/v1/chat/completions" if chat else "/v1/completions"
    data = json.dumps(body).encode()  # NaN and Infinity included: Python's JSON reads them
    status, _, _ = capped_server.post(path, data)
    assert status < 500, (path, data[:300])


@pytest.fixture(scope="module")
def capped_server(tiny_dir, tmp_path_factory):
    s = ServeProcess(["-t", str(tiny_dir / "target.gguf"), "-d", str(tiny_dir / "draft.gguf"), "--ctx", "512",
                      "-n", "6"], tmp_path_factory.mktemp("fuzz"), env={"LOCALSPEC_HISTORY": "on"})
    yield s
    s.close()


def test_after_the_fuzzing_the_server_is_still_exact(capped_server, tiny_pair):
    want = tiny_pair.generate("The cat sat on the", max_tokens=6, method="plain")
    status, reply, _ = capped_server.post("/v1/completions", json.dumps(
        {"prompt": "The cat sat on the", "max_tokens": 6, "temperature": 0}).encode())
    assert status == 200 and reply["choices"][0]["text"] == want.text
    # token ids outside the vocabulary are found on the worker: a refusal, not a failure (the fuzzing may
    # or may not have drawn one)
    status, _, _ = capped_server.post("/v1/completions", json.dumps({"prompt": [5, 10**6], "max_tokens": 2}).encode())
    assert status == 400
    counts = capped_server.get("/health")["generations"]
    assert counts["failed"] == 0 and counts["completed"] > 0 and counts["refused"] > 0  # ids outside the vocabulary


@pytest.mark.parametrize("body,param,fragment", [
    ({"prompt": "\ud800"}, "prompt", "lone surrogate"),
    ({"prompt": "hi", "stop": ["\udfff"]}, "stop", "lone surrogate"),
    ({"prompt": "hi", "max_tokens": 2, "max_completion_tokens": 5}, "max_completion_tokens", "twice"),
    ({"prompt": "hi", "method": "plain", "speculative": {"method": "lookup"}}, "method", "twice"),
    ({"prompt": "hi", "stream_options": {"include_usage": True}}, "stream_options", "stream"),
    ({"prompt": "hi", "stop": [1]}, "stop", "stop[0]"),
    ({"prompt": [1, "a"]}, "prompt", "prompt[1]"),
])
def test_conflicts_and_text_that_is_not_unicode_are_400s(server, body, param, fragment):
    status, reply, _ = server.post("/v1/completions", json.dumps(body).encode())
    assert status == 400 and reply["error"]["param"] == param and fragment in reply["error"]["message"], reply


@pytest.mark.parametrize("messages,fragment", [
    ([{"role": "user", "content": "\udfff"}], "lone surrogate"),
    ([{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}],
     "cache_control"),
])
def test_chat_text_the_template_cannot_take_is_a_400(server, messages, fragment):
    status, reply, _ = server.post("/v1/chat/completions", json.dumps({"messages": messages}).encode())
    assert status == 400 and reply["error"]["param"] == "messages" and fragment in reply["error"]["message"], reply


def test_tools_for_a_template_that_cannot_call_them_are_a_400_naming_tools_in_each_api(server, client):
    """The tiny models' template has no tool calls at all."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    ask = [{"role": "user", "content": "the weather?"}]
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as caught:
            r = client.chat.completions.create(model="target", messages=ask, max_tokens=4, stream=stream, tools=[
                {"type": "function", "function": {"name": "get_weather", "parameters": schema}}])
            list(r) if stream else None
        assert caught.value.param == "tools" and caught.value.code == "unsupported_parameter"
        assert "leave out 'tools'" in caught.value.message and caught.value.message.count(". ") == 0
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="target", input="the weather?", max_output_tokens=4, tools=[
            {"type": "function", "name": "get_weather", "parameters": schema}])
    assert caught.value.param == "tools" and "leave out 'tools'" in caught.value.message
    with pytest.raises(anthropic.BadRequestError) as refused:
        anthropic.Anthropic(base_url=server.base, api_key="x", max_retries=0).messages.create(
            model="target", max_tokens=4, messages=ask, tools=[{"name": "get_weather", "input_schema": schema}])
    assert refused.value.body["error"]["type"] == "invalid_request_error"
    assert "leave out 'tools'" in refused.value.body["error"]["message"]
    with pytest.raises(ollama.ResponseError) as err:
        ollama.Client(host=server.base, timeout=60).chat("target", messages=ask, tools=[
            {"type": "function", "function": {"name": "get_weather", "parameters": schema}}])
    assert err.value.status_code == 400 and "leave out 'tools'" in err.value.error
    unused = client.chat.completions.create(model="target", messages=ask, max_tokens=4, tool_choice="none", tools=[
        {"type": "function", "function": {"name": "get_weather", "parameters": schema}}])
    assert unused.choices[0].message.content  # offered but not to be called: the template is not asked to show them


def test_refusals_an_allowed_page_receives_carry_cors_headers_and_health_answers_head(server):
    origin = "http://localhost:3000"
    status, reply, headers = server.post("/v1/completions", b"{}", headers={"Origin": origin,
                                                                             "Content-Type": "text/plain"})
    assert status == 415 and headers["Access-Control-Allow-Origin"] == origin  # the page can read why
    got, _ = server.raw(request("HEAD", "/health", server.port))
    assert got == 200


def test_a_client_too_slow_with_its_body_gets_408():
    import asyncio

    from localspec.server.http import Guard

    async def app(scope, receive, send):  # pragma: no cover - never reached
        raise AssertionError("the application saw a request the guard should have answered")

    sent: list[dict] = []

    async def receive():
        await asyncio.sleep(3600)  # a client that never sends its body

    async def send(message):
        sent.append(message)

    guard = Guard(app, hosts=("localhost",), origins=(), api_key=None, max_body=1000, body_seconds=0.05)
    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "query_string": b"",
             "headers": [(b"host", b"localhost"), (b"content-type", b"application/json")]}
    asyncio.run(guard(scope, receive, send))
    assert sent[0]["status"] == 408 and b"took longer than 0.05 s" in sent[1]["body"]


@pytest.mark.parametrize("flag", [["--api-key", "k\u00e9y"], ["--api-key", "key "], ["--allow-origin", "http://x/"],
                                  ["--allow-origin", "localhost:3000"]])
def test_serve_refuses_keys_and_origins_no_client_could_send(tiny_dir, flag):
    r = run_cli(["serve", "-t", str(tiny_dir / "target.gguf"), *flag])
    assert r.exit_code == 1
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ")
    assert "--allow-origin" in lines[0] or "API key" in lines[0]


def test_a_client_that_writes_a_60_mb_body_before_it_reads_gets_the_413_not_a_reset(server):
    body = b'{"prompt": "' + b"x" * 60_000_000 + b'"}'
    for path in ("/v1/completions", "/api/generate"):
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
            s.sendall(head + body)  # all of it, as requests, httpx and curl do, before reading a byte
            reply = b""
            while chunk := s.recv(65536):
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 413") and b"connection: close" in reply
        # each API answers in its own error shape: OpenAI's code, Ollama's one sentence
        assert b"body_too_large" in reply if path.startswith("/v1/") else b'{"error": "The request body' in reply
    assert server.get("/health")["status"] == "ok"


def test_responses_refuses_a_host_name_that_is_not_loopback(server, home):
    before, done = recorded(home), server.get("/health")["generations"]
    body = json.dumps({"model": "target", "input": "hi", "max_output_tokens": 3}).encode()
    for host in ("evil.example", f"evil.example:{server.port}", f"127.0.0.1.nip.io:{server.port}",
                 f"localhost.evil.example:{server.port}", ""):
        got, reply = server.raw(request("POST", "/v1/responses", server.port, body,
                                        {"Content-Type": "application/json"}, host=host))
        assert got == 403 and error_of(reply)["code"] == "host_not_allowed", (host, reply)  # OpenAI's shape
    got, reply = server.raw(request("POST", "/v1/responses", server.port, body, {"Content-Type": "application/json"}))
    assert got == 200 and json.loads(reply)["object"] == "response"  # the same request from a loopback name
    assert server.get("/health")["generations"]["completed"] == done["completed"] + 1
    assert recorded(home) == before + 1  # only the one answered


@pytest.mark.parametrize("path,body", [
    ("/api/generate", {"model": "target", "prompt": "hi", "stream": False, "options": {"num_predict": 3}}),
    ("/api/show", {"model": "target"}),
])
def test_a_cross_site_page_cannot_use_ollamas_generate_or_show(server, home, path, body):
    """A form or a no-cors fetch from any page sends text/plain with the page's Origin; neither gets through."""
    before, done = recorded(home), server.get("/health")["generations"]["completed"]
    data = json.dumps(body).encode()
    for headers, status in (({"Content-Type": "text/plain", "Origin": "http://evil.example"}, 403),
                            ({"Content-Type": "application/json", "Origin": "http://evil.example"}, 403),
                            ({"Content-Type": "application/json", "Origin": "null"}, 403),
                            ({"Content-Type": "text/plain"}, 415),
                            ({"Content-Type": "text/plain;charset=UTF-8"}, 415),
                            ({"Content-Type": "application/x-www-form-urlencoded"}, 415),
                            ({}, 415)):
        got, reply = server.raw(request("POST", path, server.port, data, headers))
        assert got == status, (headers, reply)
        found = json.loads(reply)
        assert set(found) == {"error"} and isinstance(found["error"], str), found  # Ollama's shape
    got, reply = server.raw(request("OPTIONS", path, server.port, headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}))
    assert got == 403
    assert server.get("/health")["generations"]["completed"] == done and recorded(home) == before
    got, reply = server.raw(request("POST", path, server.port, data, {"Content-Type": "application/json"}))
    assert got == 200 and json.loads(reply)  # the same body, sent as an app sends it


def test_a_client_hanging_up_during_count_tokens_leaves_nothing_behind(server, tiny_pair):
    messages = [{"role": "user", "content": "in the end, the cat sat on the mat. " * 90_000}]  # 3.2 MB
    body = json.dumps({"model": "x", "messages": messages}).encode()
    head = (f"POST /v1/messages/count_tokens HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
            f"Content-Type: application/json\r\nanthropic-version: 2023-06-01\r\nContent-Length: {len(body)}\r\n\r\n")
    logged, counts = len(server.output()), server.get("/health")["generations"]
    busy = []
    for sent in (body[:1000], body[: len(body) // 2], body, body):  # mid-body, and with the whole body sent
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
            s.sendall(head.encode() + sent)
        # closed without reading: the count may be parsing, waiting or running
        started, seen = time.monotonic(), False
        while True:  # a whole body is read, parsed and then counted; a cut one never gets there
            health = server.get("/health")
            occupied = health["running"] + health["queued"]
            seen = seen or occupied > 0
            if (seen or sent is not body or time.monotonic() > started + 3) and not occupied:
                break
            assert time.monotonic() < started + 30, health
            time.sleep(0.02)
        busy.append(seen)
    assert any(busy)  # a count whose client had left was seen on the worker, and then gone
    assert server.get("/health")["generations"] == counts  # a count is not a generation, nor a failed one
    short = [{"role": "user", "content": "in the end, the cat sat on the mat."}]
    want = len(tiny_pair.target.tokenize(tiny_pair.format_chat(short), add_special=False))
    counted = anthropic.Anthropic(base_url=server.base, api_key="x", max_retries=0, timeout=60).messages.count_tokens(
        model="x", messages=short)
    assert counted.input_tokens == want
    assert "Traceback" not in server.output()[logged:]


def _shape(body: bytes) -> str:
    """Which API's error object ``body`` is."""
    found = json.loads(body)
    if found.get("type") == "error" and isinstance(found["error"], dict):
        return "anthropic"
    return "ollama" if isinstance(found["error"], str) else "openai"


@pytest.mark.parametrize("path,headers,shape", [
    ("/v1/chat/completions", {}, "openai"), ("/v1/completions", {}, "openai"), ("/v1/responses", {}, "openai"),
    ("/v1/models", {}, "openai"), ("/v1/models", {"anthropic-version": "2023-06-01"}, "anthropic"),
    ("/v1/messages", {}, "anthropic"), ("/v1/messages/count_tokens", {}, "anthropic"), ("/api/chat", {}, "ollama"),
    ("/api/generate", {}, "ollama"), ("/api/nope", {}, "ollama"),
])
def test_the_guards_and_the_router_answer_in_the_shape_of_the_paths_api(server, path, headers, shape):
    """A refused Host, Origin or content type, a wrong method and an unknown path: each its path's API's error."""
    body = b'{"model": "target"}'
    kinds = {"Content-Type": "application/json", **headers}
    for method, more, host, status in (("POST", kinds, "evil.example", 403),
                                       ("POST", {**kinds, "Origin": "http://evil.example"}, "default", 403),
                                       ("POST", {**headers, "Content-Type": "text/plain"}, "default", 415),
                                       ("DELETE", headers, "default", 404 if path == "/api/nope" else 405)):
        got, reply = server.raw(request(method, path, server.port, body if method == "POST" else b"", more,
                                        host=host))
        assert got == status and _shape(reply) == shape, (method, more, host, reply)
