"""Ollama's API on `localspec serve`, through the official `ollama` client, raw HTTP and hostile clients."""

from __future__ import annotations

import json
import socket
import time

import jsonschema
import ollama
import openai
import pytest
import requests
from serverproc import ServeProcess
from tinymodel import HERMES_TEMPLATE, vocabulary, write_tiny_model

from localspec.structured.tool_use import CLOSE, OPEN

N = len(vocabulary(user_tokens=[OPEN, CLOSE])[0])  # the FIM tokens come after the call tokens
FIM = {N: "<|fim_prefix|>", N + 1: "<|fim_suffix|>", N + 2: "<|fim_middle|>"}
TEMPLATE = HERMES_TEMPLATE
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The forecast",
                                           "parameters": WEATHER}}]
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]  # a long greedy reply
GREEDY = {"temperature": 0, "num_predict": 24}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny coder: fill-in-the-middle tokens and a template that writes tool calls."""
    d = tmp_path_factory.mktemp("ollama-models")
    for name, noise in (("coder.gguf", 0.0), ("coder-draft.gguf", 0.35)):
        write_tiny_model(d / name, seed=0, noise=noise, pad_to=N + 3, rename=FIM, user_tokens=[OPEN, CLOSE],
                         chat_template=TEMPLATE)
    return d


@pytest.fixture(scope="module")
def server(models, tmp_path_factory):
    s = ServeProcess(["-t", str(models / "coder.gguf"), "-d", str(models / "coder-draft.gguf"), "--ctx", "1024",
                      "--allow-origin", "http://localhost:3000"], tmp_path_factory.mktemp("serve-ollama"))
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.base, timeout=60)


def test_root_version_tags_ps_and_show_describe_the_model(server, client):
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nConnection: close\r\n\r\n".encode())
        assert s.makefile("rb").read().endswith(b"Ollama is running")
    version = tuple(int(p) for p in server.get("/api/version")["version"].split("."))
    assert version >= (0, 6, 4)  # VS Code's Ollama provider checks this
    (listed,) = client.list().models
    assert listed.model == "coder:latest" and listed.size > 0 and listed.details.format == "gguf"
    assert len(listed.digest) == 64 and listed.details.family == "llama"
    (running,) = client.ps().models
    assert running.model == "coder:latest" and running.context_length == 1024
    for name in ("coder", "coder:latest"):
        shown = client.show(name)
        assert shown.capabilities == ["completion", "tools", "insert"]
        assert shown.modelinfo["general.architecture"] == "llama" and shown.modelinfo["llama.context_length"] == 1024
        assert shown.template == TEMPLATE and "num_ctx 1024" in shown.parameters


def test_a_model_the_server_does_not_have_is_ollamas_404(server, client):
    for call in (lambda: client.show("qwen3:8b"), lambda: client.chat("qwen3:8b", messages=MESSAGES),
                 lambda: client.generate("coder:7b", prompt="hi")):
        with pytest.raises(ollama.ResponseError) as err:
            call()
        assert err.value.status_code == 404 and "not found" in err.value.error and "coder:latest" in err.value.error


def test_chat_whole_and_streamed_give_chat_completions_greedy_text(server, client):
    oa = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=60)
    want = oa.chat.completions.create(model="coder", messages=MESSAGES, max_tokens=24, temperature=0)
    r = client.chat("coder", messages=MESSAGES, options=GREEDY)
    assert r.message.role == "assistant" and r.message.content == want.choices[0].message.content
    # an app that found the model through /api/tags asks /v1 for it by that name (VS Code's Ollama provider)
    tagged = oa.chat.completions.create(model="coder:latest", messages=MESSAGES, max_tokens=24, temperature=0)
    assert tagged.choices[0].message.content == r.message.content
    assert r.done and r.done_reason == "length" and r.eval_count == 24
    assert r.prompt_eval_count == want.usage.prompt_tokens and r.eval_duration > 0
    parts = list(client.chat("coder", messages=MESSAGES, options=GREEDY, stream=True))
    assert "".join(p.message.content for p in parts) == r.message.content
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True] and parts[-1].eval_count == 24


def test_a_raw_chat_streams_ndjson_by_default_and_load_requests_answer_at_once(server):
    r = requests.post(f"{server.base}/api/chat", json={"model": "coder", "messages": MESSAGES,
                                                        "options": {"num_predict": 5}}, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert lines[-1]["done"] is True and all(not line["done"] for line in lines[:-1])
    assert lines[-1]["localspec"]["method"] == "auto"  # the same speculation stats as chat completions
    for path, body in (("/api/chat", {"model": "coder", "messages": []}), ("/api/generate", {"model": "coder"})):
        status, reply, _ = server.post(path, json.dumps(body).encode())
        assert status == 200 and reply["done"] is True and reply["done_reason"] == "load"


def test_options_and_penalties_give_the_same_tokens_as_chat_completions(server, client):
    oa = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=60)
    want = oa.chat.completions.create(model="coder", messages=MESSAGES, max_tokens=30, temperature=0.9, seed=5,
                                      top_p=0.9, extra_body={"top_k": 20, "repeat_penalty": 1.3, "min_p": 0.05})
    r = client.chat("coder", messages=MESSAGES, options={"num_predict": 30, "temperature": 0.9, "seed": 5,
                                                         "top_p": 0.9, "top_k": 20, "repeat_penalty": 1.3,
                                                         "min_p": 0.05, "num_ctx": 8192, "num_thread": 2})
    assert r.message.content == want.choices[0].message.content
    ref = client.generate("coder", prompt="in the end, in the end, in the", raw=True, options={"num_predict": 40})
    stop = ref.response[10:13]
    cut = client.generate("coder", prompt="in the end, in the end, in the", raw=True,
                          options={"num_predict": 40, "stop": [stop]})
    assert cut.response == ref.response[:ref.response.index(stop)] and cut.done_reason == "stop"


def test_generate_with_suffix_fills_in_the_middle(server, client):
    prefix, suffix = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n", "\n\ndef mul(a, b):\n"
    want = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=60).completions.create(
        model="coder", prompt=prefix, suffix=suffix, max_tokens=16, temperature=0)
    r = client.generate("coder", prompt=prefix, suffix=suffix, options={"num_predict": 16, "temperature": 0})
    assert r.response == want.choices[0].text and r.done_reason == "length"
    streamed = "".join(p.response for p in client.generate("coder", prompt=prefix, suffix=suffix, stream=True,
                                                             options={"num_predict": 16, "temperature": 0}))
    assert streamed == r.response


def test_format_json_and_a_schema_give_valid_json(client):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["name", "age"], "additionalProperties": False}
    r = client.chat("coder", messages=MESSAGES, format=schema, options={"num_predict": 200})
    jsonschema.validate(json.loads(r.message.content), schema)
    g = client.generate("coder", prompt="a person", format="json", options={"num_predict": 200})
    assert g.done_reason == "stop" and isinstance(json.loads(g.response), dict)


@pytest.fixture(scope="module")
def tool_server(models, tmp_path_factory):
    """The call token favoured by default (Ollama's API has no logit_bias), so that the random model calls."""
    s = ServeProcess(["-t", str(models / "coder.gguf"), "-d", str(models / "coder-draft.gguf"), "--ctx", "1024",
                      "--logit-bias", f"{N - 2}=6.0"], tmp_path_factory.mktemp("serve-ollama-tools"))
    yield s
    s.close()


def test_tool_calls_follow_the_schema_equal_chat_completions_and_go_back_in(tool_server):
    # The client keeps only a property's type, items, description and enum (and no additionalProperties), which
    # leaves a random model writing arguments forever: the tools go as Ollama's wire format, the reply is read
    # with the client's own types, and the conversation goes back through the client.
    question = [{"role": "user", "content": "in the end, what is the weather in the end"}]
    body = {"model": "coder", "messages": question, "tools": TOOLS, "options": {"num_predict": 160}}
    r = ollama.ChatResponse.model_validate(requests.post(f"{tool_server.base}/api/chat", timeout=60,
                                                         json={**body, "stream": False}).json())
    assert r.message.tool_calls, f"no call in {r.message.content!r}"
    for call in r.message.tool_calls:
        assert call.function.name == "get_weather"
        jsonschema.validate(dict(call.function.arguments), WEATHER)
    want = openai.OpenAI(base_url=tool_server.url, api_key="x", max_retries=0, timeout=60).chat.completions.create(
        model="coder", messages=question, tools=TOOLS, max_tokens=160).choices[0].message
    assert [json.loads(c.function.arguments) for c in want.tool_calls] == \
        [dict(c.function.arguments) for c in r.message.tool_calls]
    assert r.message.content == (want.content or "") and r.done_reason in ("stop", "length")
    streamed = [ollama.ChatResponse.model_validate(json.loads(line)) for line in requests.post(
        f"{tool_server.base}/api/chat", json=body, timeout=60).text.splitlines()]
    assert [c for p in streamed for c in p.message.tool_calls or []] == r.message.tool_calls
    assert "".join(p.message.content for p in streamed) == r.message.content
    answer = {"role": "tool", "content": "sunny", "tool_name": "get_weather"}
    history = [*question, r.message.model_dump(exclude_none=True), answer]
    after = requests.post(f"{tool_server.base}/api/chat", timeout=60, json={**body, "messages": history,
                                                                            "stream": False}).json()
    assert after["done"] and after["prompt_eval_count"] > r.prompt_eval_count + 20  # the call and its answer
    client = ollama.Client(host=tool_server.base, timeout=60)  # the client sends the call back as it got it
    assert client.chat("coder", messages=[*question, r.message, answer], options={"num_predict": 8}).done


@pytest.mark.parametrize("path,body,fragment", [
    ("/api/chat", {"messages": MESSAGES}, "model is required"),
    ("/api/chat", {"model": "coder", "messages": MESSAGES, "temprature": 1}, "'temprature'"),
    ("/api/chat", {"model": "coder", "messages": MESSAGES, "options": {"temperature": "hot"}}, "options.temperature"),
    ("/api/chat", {"model": "coder", "messages": MESSAGES, "options": {"mirostat": 2}}, "options.mirostat"),
    ("/api/chat", {"model": "coder", "messages": MESSAGES, "options": {"top_p": 3}}, "top_p"),
    ("/api/chat", {"model": "coder", "messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ("/api/chat", {"model": "coder", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, "images"),
    ("/api/chat", {"model": "coder", "messages": MESSAGES, "format": "yaml"}, "'format'"),
    ("/api/chat", {"model": "coder", "messages": MESSAGES, "tools": [{"type": "function"}]}, "tools"),
    ("/api/generate", {"model": "coder", "prompt": "x", "context": [1, 2]}, "'context'"),
    ("/api/generate", {"model": "coder", "prompt": "x", "template": "{{ .Prompt }}"}, "'template'"),
    ("/api/generate", {"model": "coder", "prompt": 5}, "prompt"),
    ("/api/show", {"model": "coder", "extra": 1}, "'extra'"),
    ("/api/chat", [1, 2], "JSON object"),
])
def test_malformed_bodies_get_ollamas_error_naming_the_field(server, path, body, fragment):
    status, reply, _ = server.post(path, json.dumps(body).encode())
    assert status == 400 and set(reply) == {"error"} and fragment in reply["error"], reply
    status, reply, _ = server.post(path, b'{"model": "coder", ')
    assert status == 400 and "not valid JSON" in reply["error"]


def test_a_prompt_over_the_context_is_ollamas_error_not_a_cut_prompt(server, client):
    long = " ".join(f"w{i}" for i in range(1500))
    for stream in (False, True):
        with pytest.raises(ollama.ResponseError) as err:
            r = client.chat("coder", messages=[{"role": "user", "content": long}], stream=stream)
            list(r) if stream else None
        assert err.value.status_code == 400 and "context" in err.value.error
    assert client.chat("coder", messages=MESSAGES, options={"num_predict": 2}).done


def test_hostile_clients_are_refused_on_ollamas_routes(server):
    body = json.dumps({"model": "coder", "messages": MESSAGES}).encode()
    head = "POST /api/chat HTTP/1.1\r\nHost: {host}\r\nContent-Type: {kind}\r\nContent-Length: {n}\r\n{more}\r\n"
    cases = [("evil.example:80", "application/json", "", 403), (f"127.0.0.1:{server.port}", "text/plain", "", 415),
             (f"127.0.0.1:{server.port}", "application/json", "Origin: http://evil.example\r\n", 403)]
    for host, kind, more, want in cases:
        status, reply = server.raw(head.format(host=host, kind=kind, n=len(body), more=more).encode() + body)
        assert status == want and isinstance(json.loads(reply)["error"], str), (host, kind, more)  # Ollama's shape
    for path in ("/api/chat", "/api/generate", "/api/show"):
        big = head.format(host=f"127.0.0.1:{server.port}", kind="application/json", n=60_000_000, more="")
        started = time.monotonic()
        status, reply = server.raw(big.replace("/api/chat", path).encode(), body_chunks=4, chunk=b" " * 65536)
        assert status == 413 and "--max-body" in json.loads(reply)["error"] and time.monotonic() - started < 2
    status, reply = server.raw(f"GET /api/nope HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode())
    assert status == 404 and isinstance(json.loads(reply)["error"], str)
    # a client that hangs up mid-stream cancels its generation; the server goes on answering
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        long = json.dumps({"model": "coder", "messages": MESSAGES, "options": {"num_predict": 900}}).encode()
        s.sendall(head.format(host=f"127.0.0.1:{server.port}", kind="application/json", n=len(long),
                              more="").encode() + long)
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
    deadline = time.monotonic() + 20
    while server.get("/health")["generations"]["cancelled"] < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert server.get("/health")["generations"]["cancelled"] >= 1
    status, reply, _ = server.post("/api/generate", json.dumps({"model": "coder", "prompt": "hi", "stream": False,
                                                                "options": {"num_predict": 3}}).encode())
    assert status == 200 and reply["done"] is True


def test_an_allowed_page_gets_cors_headers_and_the_api_key_guards_ollamas_routes(server, models, tmp_path):
    status, _, headers = server.post("/api/show", json.dumps({"model": "coder"}).encode(),
                                     {"Origin": "http://localhost:3000"})
    assert status == 200 and headers["Access-Control-Allow-Origin"] == "http://localhost:3000"
    s = ServeProcess(["-t", str(models / "coder.gguf"), "-d", "none", "--ctx", "512", "--api-key", "k3y", "-m",
                      "plain"], tmp_path)
    try:
        with pytest.raises(ollama.ResponseError) as err:
            ollama.Client(host=s.base).list()
        assert err.value.status_code == 401 and "API key" in err.value.error
        keyed = ollama.Client(host=s.base, headers={"Authorization": "Bearer k3y"})
        assert keyed.list().models[0].model == "coder:latest"
        assert keyed.generate("coder", prompt="hi", options={"num_predict": 3}).done
    finally:
        s.close()


def test_think_switches_a_reasoning_models_thinking_and_it_comes_back_as_thinking(tmp_path):
    from chatdefs import OPENS, THINK_TOKENS

    model = write_tiny_model(tmp_path / "opens.gguf", seed=0, user_tokens=THINK_TOKENS, chat_template=OPENS)
    s = ServeProcess(["-t", str(model), "-d", "none", "--ctx", "1024", "--think-budget", "5", "-m", "plain"],
                     tmp_path)
    try:
        client = ollama.Client(host=s.base, timeout=60)
        assert "thinking" in client.show("opens").capabilities
        question = [{"role": "user", "content": "in the end, in the end, in the"}]
        want = openai.OpenAI(base_url=s.url, api_key="x", max_retries=0, timeout=60).chat.completions.create(
            model="opens", messages=question, max_tokens=20).choices[0].message
        r = client.chat("opens", messages=question, think=True, options={"num_predict": 20})
        assert r.message.thinking == want.model_extra["reasoning_content"] and r.message.content == want.content
        parts = list(client.chat("opens", messages=question, think=True, stream=True, options={"num_predict": 20}))
        assert "".join(p.message.thinking or "" for p in parts) == r.message.thinking
        assert "".join(p.message.content for p in parts) == r.message.content
        off = client.chat("opens", messages=question, think=False, options={"num_predict": 20})
        assert off.message.thinking is None
        g = client.generate("opens", prompt=question[0]["content"], think=True, options={"num_predict": 20})
        assert g.thinking == r.message.thinking and g.response == r.message.content
    finally:
        s.close()


@pytest.mark.real
def test_the_real_pair_through_the_ollama_client(tmp_path):
    from conftest import real_models_dir

    d = real_models_dir()
    s = ServeProcess(["-t", str(d / "target.gguf"), "-d", str(d / "draft.gguf"), "-m", "draft"], tmp_path,
                     timeout=300)
    try:
        assert "context 32768 tokens: the model's training context" in s.output()  # no --ctx: what fits
        client = ollama.Client(host=s.base, timeout=300)
        assert [m.model for m in client.list().models] == ["target:latest"]
        shown = client.show("target")
        assert shown.capabilities == ["completion", "tools", "insert"]
        assert shown.modelinfo["qwen2.context_length"] == 32768 and shown.details.parameter_size == "1.5B"
        question = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
        want = openai.OpenAI(base_url=s.url, api_key="x", max_retries=0, timeout=300).chat.completions.create(
            model="target", messages=question, max_tokens=16, temperature=0).choices[0].message.content
        r = client.chat("target", messages=question, options={"num_predict": 16, "temperature": 0})
        assert "Paris" in r.message.content and r.message.content == want and r.done_reason == "stop"
        assert "".join(p.message.content for p in client.chat("target", messages=question, stream=True,
                                                                options={"num_predict": 16})) == want
        filled = client.generate("target", prompt="def add(a, b):\n    return ", suffix="\n\nprint(add(1, 2))\n",
                                 options={"num_predict": 8})
        assert "a + b" in filled.response
        schema = {"type": "object", "properties": {"capital": {"type": "string"}}, "required": ["capital"],
                  "additionalProperties": False}
        j = client.chat("target", messages=question, format=schema, options={"num_predict": 30})
        assert json.loads(j.message.content)["capital"] == "Paris"
    finally:
        s.close()


def test_keep_alive_is_accepted_in_every_form_and_the_model_stays_loaded(server, client):
    want = client.chat("coder", messages=MESSAGES, options=GREEDY).message.content
    for keep in (0, -1, 300, 1.5, "5m", "1h30m", "0s", "-1"):
        r = client.chat("coder", messages=MESSAGES, options=GREEDY, keep_alive=keep)
        assert r.message.content == want, keep
    assert client.generate("coder", prompt="hi", options={"num_predict": 3}, keep_alive="10m").done
    # Ollama's "unload" (what `ollama stop` sends): answered, and the pair stays loaded while the server runs
    status, reply, _ = server.post("/api/generate", json.dumps({"model": "coder", "keep_alive": 0}).encode())
    assert status == 200 and reply["done"] is True
    assert [m.model for m in client.ps().models] == ["coder:latest"]
    assert client.chat("coder", messages=MESSAGES, options=GREEDY).message.content == want
    status, reply, _ = server.post("/api/chat", json.dumps({"model": "coder", "messages": MESSAGES,
                                                            "keep_alive": [5]}).encode())
    assert status == 400 and "keep_alive" in reply["error"]
