"""Anthropic's Messages API on `localspec serve` (tiny models), through the official `anthropic` client:
the same generation as chat completions, in Anthropic's shapes, events and errors."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Literal

import anthropic
import jsonschema
import ollama
import openai
import pydantic
import pytest
import requests
from chatdefs import SCHEMAS, WEATHER
from serverproc import ServeProcess
from tinymodel import HERMES_TEMPLATE as TEMPLATE
from tinymodel import write_tiny_model

import localspec
from localspec.constraint import Constraint
from localspec.server.anthropic.replies import error_body
from localspec.server.anthropic.requests import error_response
from localspec.server.http import ApiError
from localspec.structured.tool_use import CLOSE, OPEN

MESSAGES = [{"role": "user", "content": "in the end, in the end, what is the weather in the end"}]
TOOLS = [{"name": "get_weather", "description": "The forecast", "input_schema": WEATHER}]
PET = {"type": "object", "properties": {"animal": {"enum": ["cat", "dog", "bird"]}, "ok": {"type": "boolean"}},
       "required": ["animal", "ok"], "additionalProperties": False}
ORDER = ["message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
         "message_stop"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("anthropic")
    for name, noise in (("t.gguf", 0.0), ("d.gguf", 0.35)):
        write_tiny_model(d / name, seed=0, noise=noise, user_tokens=[OPEN, CLOSE], chat_template=TEMPLATE)
    with localspec.load(d / "t.gguf", d / "d.gguf", n_ctx=1024, history=False) as p:
        yield p


@pytest.fixture(scope="module")
def server(pair, tmp_path_factory):
    s = ServeProcess(["-t", str(pair.target.path), "-d", str(pair.draft.path), "--ctx", "1024", "--no-history"],
                     tmp_path_factory.mktemp("serve"))
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.base, api_key="not-needed", max_retries=0, timeout=60)


def test_a_message_is_the_chat_reply_with_anthropics_usage(client, pair):
    want = pair.chat(MESSAGES, max_tokens=24)
    r = client.messages.create(model="claude-sonnet-4-5", max_tokens=24, messages=MESSAGES)
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_")
    assert [b.type for b in r.content] == ["text"] and r.content[0].text == want.text
    assert r.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[want.finish_reason]
    assert r.usage.output_tokens == len(want.tokens)
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == len(want.prompt_tokens)
    again = client.messages.create(model="x", max_tokens=24, messages=MESSAGES)
    assert again.content[0].text == want.text and again.usage.cache_read_input_tokens > 0  # the prompt cache


def test_a_streamed_message_has_anthropics_event_order_and_the_same_text(client, pair):
    want = pair.chat(MESSAGES, max_tokens=30)
    events = list(client.messages.create(model="x", max_tokens=30, messages=MESSAGES, stream=True))
    kinds = [e.type for e in events if e.type != "ping"]
    assert kinds[:2] == ORDER[:2] and kinds[-3:] == ORDER[-3:] and set(kinds[2:-3]) == {"content_block_delta"}
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == want.text
    final = next(e for e in events if e.type == "message_delta")
    assert final.usage.output_tokens == len(want.tokens) and final.delta.stop_reason in ("max_tokens", "end_turn")
    for again in (False, True):  # again: the prompt cache gives all of the prompt but its last token
        if again:
            events = list(client.messages.create(model="x", max_tokens=30, messages=MESSAGES, stream=True))
        start = events[0].message.usage  # known before the first token
        end = next(e for e in events if e.type == "message_delta").usage
        # Anthropic's count: input_tokens are the tokens processed, the cached ones in cache_read_input_tokens
        assert start.input_tokens + start.cache_read_input_tokens == len(want.prompt_tokens)
        assert (start.input_tokens, start.cache_read_input_tokens) == (end.input_tokens, end.cache_read_input_tokens)
    assert end.cache_read_input_tokens == len(want.prompt_tokens) - 1 and end.input_tokens == 1
    with client.messages.stream(model="x", max_tokens=30, messages=MESSAGES) as stream:
        assert stream.get_final_message().content[0].text == want.text


def test_stop_sequences_give_stop_sequence(client, pair):
    ref = pair.chat(MESSAGES, max_tokens=40)
    stop = ref.text[10:13]
    r = client.messages.create(model="x", max_tokens=40, messages=MESSAGES, stop_sequences=[stop])
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop
    assert r.content[0].text == ref.text[: ref.text.find(stop)]


def test_tool_use_whole_and_streamed_has_a_schema_valid_input_and_a_tool_result_round_trip(client, pair):
    ask = dict(model="x", max_tokens=160, messages=MESSAGES, tools=TOOLS,
               tool_choice={"type": "any", "disable_parallel_tool_use": True})
    r = client.messages.create(**ask)
    assert r.stop_reason == "tool_use"
    (use,) = [b for b in r.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, SCHEMAS["get_weather"])
    with client.messages.stream(**ask) as stream:
        events = list(stream)
        streamed = stream.get_final_message()
    assert any(e.type == "content_block_delta" and e.delta.type == "input_json_delta" for e in events)
    assert [b.input for b in streamed.content if b.type == "tool_use"] == [use.input]
    history = [*MESSAGES, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]}]
    answered = client.messages.create(model="x", max_tokens=20, messages=history, tools=TOOLS,
                                      tool_choice={"type": "none"})
    library = pair.chat([*MESSAGES, {"role": "assistant", "content": "", "tool_calls": [{
        "id": use.id, "type": "function", "function": {"name": use.name, "arguments": json.dumps(use.input)}}]},
        {"role": "tool", "tool_call_id": use.id, "content": "sunny"}], max_tokens=20,
        tools=[{"type": "function", "function": {"name": "get_weather", "description": "The forecast",
                                                 "parameters": WEATHER}}], tool_choice="none")
    assert answered.content[0].text == library.text
    with pytest.raises(anthropic.BadRequestError, match="answers no tool_use") as caught:
        client.messages.create(model="x", max_tokens=20, messages=[
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_nope", "content": "x"}]}])
    assert caught.value.body["error"]["type"] == "invalid_request_error"


def test_count_tokens_is_the_prompts_length(client, pair):
    want = pair.chat(MESSAGES, max_tokens=1)
    assert client.messages.count_tokens(model="x", messages=MESSAGES).input_tokens == len(want.prompt_tokens)
    with_tools = client.messages.count_tokens(model="x", messages=MESSAGES, tools=TOOLS)
    assert with_tools.input_tokens > len(want.prompt_tokens)


def test_the_beta_path_takes_cache_control_thinking_and_metadata(client, pair):
    system = [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}]
    want = pair.chat([{"role": "system", "content": "be brief"}, *MESSAGES], max_tokens=16)
    r = client.beta.messages.create(model="x", max_tokens=16, system=system, messages=MESSAGES,
                                    betas=["interleaved-thinking-2025-05-14"], metadata={"user_id": "u1"},
                                    thinking={"type": "enabled", "budget_tokens": 1024},
                                    extra_body={"service_tier": "auto", "container": None})
    assert [b.type for b in r.content] == ["text"] and r.content[0].text == want.text  # no reasoning channel
    legacy = client.messages.create(model="x", max_tokens=16, messages=MESSAGES,
                                    extra_body={"temperature": 0.9, "top_k": 3, "top_p": 0.9})
    assert legacy.usage.output_tokens > 0
    drafted = client.messages.create(model="x", max_tokens=16, messages=MESSAGES,
                                     extra_body={"speculative": {"method": "draft", "k": 3}})
    assert drafted.content[0].text == pair.chat(MESSAGES, max_tokens=16).text
    assert drafted.model_extra["localspec"]["method"] == "draft" and "timings" in drafted.model_extra


@pytest.fixture(scope="module")
def method_server(pair, tmp_path_factory):
    """A server whose default method is the one asked for: Ollama's API has no field that picks a method, so
    an Ollama client gets the server's (``-m``)."""
    running: dict[tuple, ServeProcess] = {}

    def get(method: str, k) -> ServeProcess:
        if (method, k) not in running:
            for s in running.values():
                s.close()
            running.clear()
            running[method, k] = ServeProcess(["-t", str(pair.target.path), "-d", str(pair.draft.path), "--ctx", "1024",
                                               "--no-history", "-m", method, *(["-k", str(k)] if k else [])],
                                              tmp_path_factory.mktemp(f"serve-{method}"))
        return running[method, k]

    yield get
    for s in running.values():
        s.close()


@pytest.mark.parametrize("method,k", [("plain", None), ("lookup", 3), ("draft", 4), ("auto", None)])
def test_chat_completions_messages_responses_and_ollama_chat_give_one_greedy_text(server, pair, method_server,
                                                                                   method, k):
    want = pair.chat(MESSAGES, max_tokens=32, method=method, k=k).text
    extra = {"method": method, **({"k": k} if k else {})}
    oai = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=60)
    chat = oai.chat.completions.create(model="t", messages=MESSAGES, max_tokens=32, extra_body=extra)
    resp = oai.responses.create(model="t", input=MESSAGES[0]["content"], max_output_tokens=32, extra_body=extra)
    ant = anthropic.Anthropic(base_url=server.base, api_key="x", max_retries=0)
    msg = ant.messages.create(model="x", max_tokens=32, messages=MESSAGES, extra_body=extra)
    assert chat.choices[0].message.content == resp.output_text == msg.content[0].text == want
    assert chat.model_extra["localspec"]["method"] == resp.model_extra["localspec"]["method"] == \
        msg.model_extra["localspec"]["method"] == method
    by_method = method_server(method, k)
    ol = ollama.Client(host=by_method.base, timeout=60).chat("t", messages=MESSAGES, options={"num_predict": 32})
    assert ol.message.content == want and ol.eval_count == msg.usage.output_tokens
    raw = requests.post(f"{by_method.base}/api/chat", json={"model": "t", "messages": MESSAGES, "stream": False,
                                                            "options": {"num_predict": 32}}, timeout=60).json()
    assert raw["message"]["content"] == want and raw["localspec"]["method"] == method  # it ran under that method


@pytest.mark.parametrize("body,needle", [
    ({"messages": MESSAGES}, "max_tokens: Field required"),
    ({"max_tokens": "8", "messages": MESSAGES}, "max_tokens"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "video", "data": "x"}]}]},
     "unknown content block type 'video'"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]},
     "without a vision projector"),
    ({"max_tokens": 8, "messages": MESSAGES, "tools": [{"name": "f"}]}, "input_schema"),
    ({"max_tokens": 8, "messages": MESSAGES, "tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ({"max_tokens": 8, "messages": MESSAGES, "temperature": -1}, "temperature"),
    ({"max_tokens": 8, "messages": MESSAGES, "thinking": {"type": "enabled", "budget_tokens": "lots"}},
     "budget_tokens"),
    ({"max_tokens": 8, "messages": MESSAGES, "output_config": {"format": {"type": "yaml"}}},
     "output_config.format must be"),
    ({"max_tokens": 8, "messages": MESSAGES, "output_config": {"format": {"type": "json_schema"}}},
     "output_config.format must be"),
    ({"max_tokens": 8, "messages": MESSAGES, "output_format": {"type": "json_schema", "schema": PET},
      "output_config": {"format": {"type": "json_schema", "schema": PET}}}, "give it once"),
    ({"max_tokens": 8, "messages": MESSAGES, "output_config": "json"}, "output_config"),
])
def test_malformed_bodies_are_anthropic_400s_naming_the_field(server, body, needle):
    status, reply, _ = server.post("/v1/messages", json.dumps({"model": "x", **body}).encode())
    assert status == 400 and reply["type"] == "error", reply
    assert reply["error"]["type"] == "invalid_request_error" and needle in reply["error"]["message"], reply


def test_the_guards_hold_on_the_new_routes_and_answer_in_each_apis_shape(server, pair):
    for path in ("/v1/messages", "/v1/messages?beta=true", "/v1/messages/count_tokens"):
        status, reply, _ = server.post(path, b"{}", headers={"Content-Type": "text/plain"})
        assert status == 415 and reply["type"] == "error" and reply["error"]["type"] == "invalid_request_error"
        status, reply, _ = server.post(path, b"{}", headers={"Origin": "https://evil.example"})
        assert status == 403 and reply["error"]["type"] == "permission_error"
        head = f"POST {path} HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n".encode()
        rebound = server.raw(head + b"Host: evil.example\r\n\r\n{}")  # a page that points its name here
        assert rebound[0] == 403 and json.loads(rebound[1])["error"]["type"] == "permission_error"
        big = server.raw(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         "Content-Length: 99999999\r\n\r\n".encode())
        assert big[0] == 413 and json.loads(big[1])["error"]["type"] == "request_too_large"
    status, reply, _ = server.post("/v1/responses", b"{}", headers={"Content-Type": "text/plain"})
    assert status == 415 and reply["error"]["code"] == "unsupported_media_type"  # OpenAI's shape there
    want = pair.chat(MESSAGES, max_tokens=8).text
    cut = anthropic.Anthropic(base_url=server.base, api_key="x", max_retries=0)
    with cut.messages.stream(model="x", max_tokens=200, messages=MESSAGES) as stream:
        next(iter(stream.text_stream))  # leave mid-stream
    assert cut.messages.create(model="x", max_tokens=8, messages=MESSAGES).content[0].text == want


def test_a_prompt_over_the_context_is_prompt_is_too_long_and_the_server_serves_on(client, pair):
    with pytest.raises(anthropic.BadRequestError, match="prompt is too long") as caught:
        client.messages.create(model="x", max_tokens=8, messages=[{"role": "user", "content": "in the end " * 600}])
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError, match="prompt is too long"):
        client.messages.create(model="x", max_tokens=8, stream=True,
                               messages=[{"role": "user", "content": "in the end " * 600}])
    assert client.messages.create(model="x", max_tokens=8, messages=MESSAGES).content[0].text == pair.chat(
        MESSAGES, max_tokens=8).text


def test_the_api_key_comes_as_x_api_key_or_bearer(pair, tmp_path):
    s = ServeProcess(["-t", str(pair.target.path), "-d", "none", "--ctx", "512", "--api-key", "k3y", "-m", "plain"],
                     tmp_path)
    try:
        for kind in ("api_key", "auth_token"):
            ok = anthropic.Anthropic(base_url=s.base, max_retries=0, **{kind: "k3y"})
            assert ok.messages.create(model="x", max_tokens=4, messages=MESSAGES).usage.output_tokens == 4
            assert ok.messages.count_tokens(model="x", messages=MESSAGES).input_tokens > 0
        wrong = anthropic.Anthropic(base_url=s.base, api_key="wrong", max_retries=0)
        for call in (lambda: wrong.messages.create(model="x", max_tokens=4, messages=MESSAGES),
                     lambda: wrong.messages.count_tokens(model="x", messages=MESSAGES)):
            with pytest.raises(anthropic.AuthenticationError) as caught:
                call()
            assert caught.value.body["error"]["type"] == "authentication_error"
    finally:
        s.close()


def test_a_client_that_writes_a_60_mb_body_first_reads_the_413_in_each_apis_shape(server):
    body = b'{"messages": "' + b"x" * 60_000_000 + b'"}'
    for path, shape in (("/v1/messages", b'"request_too_large"'), ("/v1/responses", b'"body_too_large"')):
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
            s.sendall(head + body)  # all of it before reading a byte, as requests and httpx do
            reply = b""
            while chunk := s.recv(65536):
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 413") and shape in reply, reply[:300]
    assert server.get("/health")["status"] == "ok"


def test_a_full_queue_is_overloaded_529(pair, tmp_path):
    r = error_response(ApiError(503, "busy", type="server_error", code="server_busy"))
    assert r.status_code == 529 and json.loads(r.body)["error"]["type"] == "overloaded_error"
    s = ServeProcess(["-t", str(pair.target.path), "-d", "none", "--ctx", "1024", "--max-queue", "0", "--parallel", "1",
                      "-m", "plain"], tmp_path)
    try:
        busy = anthropic.Anthropic(base_url=s.base, api_key="x", max_retries=0, timeout=60)
        with busy.messages.stream(model="x", max_tokens=1000, messages=MESSAGES) as running:
            next(iter(running))  # generating now, with nobody allowed to wait behind it
            with pytest.raises(anthropic.APIStatusError) as caught:
                busy.messages.create(model="x", max_tokens=4, messages=MESSAGES)
        assert caught.value.status_code == 529 and caught.value.body["error"]["type"] == "overloaded_error"
    finally:
        s.close()


BASH = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "properties": {
    "command": {"type": "string", "description": "The command"}, "timeout": {"type": "number"},
    "run_in_background": {"type": "boolean"}}, "required": ["command"], "additionalProperties": False}


# Claude Code's task tools take metadata whose keys are constrained by propertyNames, which the grammar
# engine does not implement: the call's grammar leaves it out instead of refusing the request.
TASK = {"type": "object", "properties": {"subject": {"type": "string"}, "metadata": {
    "type": "object", "propertyNames": {"type": "string"}, "additionalProperties": {}}}, "required": ["subject"]}


def test_a_request_shaped_as_claude_codes_streams_to_message_stop(server):
    body = {"model": "claude-sonnet-4-5-20250929", "max_tokens": 32000, "stream": True, "temperature": 1,
            "metadata": {"user_id": "user_abc_account__session_x"}, "thinking": {"type": "enabled",
                                                                             "budget_tokens": 31999},
            "system": [{"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "<system-reminder>x</system-reminder>"},
                                                      {"type": "text", "text": "list files",
                                                       "cache_control": {"type": "ephemeral"}}]}],
            "tools": [{"name": "Bash", "description": "Run a command", "input_schema": BASH},
                      {"name": "TaskCreate", "description": "Create a task", "input_schema": TASK}],
            "context_management": {"edits": []}, "output_config": {"effort": "high"}}
    status, events, _ = server.post("/v1/messages?beta=true", json.dumps(body).encode(), headers={
        "anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219", "x-api-key": "x"})
    names = [line.removeprefix("event: ") for line in events.splitlines() if line.startswith("event: ")]
    assert status == 200 and names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]


def test_a_system_message_among_the_turns_joins_the_user_turn_before_it(server, client, pair):
    # Claude Code 2.1 sends its agent list as a system message after the first user message.
    turns = [{"role": "user", "content": [{"type": "text", "text": "<system-reminder>today</system-reminder>"},
                                          {"type": "text", "text": "Say hi."}]},
             {"role": "system", "content": "Available agent types: claude, Explore."}]
    got = client.messages.create(model="x", max_tokens=6, messages=turns)
    want = pair.chat([{"role": "user", "content": "<system-reminder>today</system-reminder>\nSay hi.\n\n"
                                                  "Available agent types: claude, Explore."}], max_tokens=6)
    assert got.content[0].text == want.text
    assert got.usage.input_tokens + (got.usage.cache_read_input_tokens or 0) == len(want.prompt_tokens)
    assert client.messages.count_tokens(model="x", messages=turns).input_tokens == len(want.prompt_tokens)
    # first, it is a user turn of its own; a non-text block in it is the usual 400
    first = pair.chat([{"role": "user", "content": "Rules."}, {"role": "user", "content": "Say hi."}], max_tokens=6)
    alone = client.messages.create(model="x", max_tokens=6, messages=[{"role": "system", "content": "Rules."},
                                                                       {"role": "user", "content": "Say hi."}])
    assert alone.content[0].text == first.text
    status, body, _ = server.post("/v1/messages", json.dumps({
        "model": "x", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}, {
            "role": "system", "content": [{"type": "image", "source": {}}]}]}).encode())
    assert status == 400 and "messages[1].content[0]" in body["error"]["message"]


def test_claude_codes_billing_header_is_dropped_so_the_rest_of_the_prompt_is_reused(client):
    """Its hash changes with every request; left in, it would be the first thing two prompts differ in."""
    rules = "You are a coding agent. Follow the rules of the repository, run the tests, keep changes small. " * 8

    def ask(cch: str) -> anthropic.types.Message:
        billing = f"x-anthropic-billing-header: cc_version=2.1.0; cc_entrypoint=cli; cch={cch};"
        system = [{"type": "text", "text": billing},
                  {"type": "text", "text": rules, "cache_control": {"type": "ephemeral"}}]
        return client.messages.create(model="claude-sonnet-4-5", max_tokens=4, system=system, messages=MESSAGES)

    first, second = ask("a1b2c"), ask("f9e8d")
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens == \
        first.usage.input_tokens + first.usage.cache_read_input_tokens  # the same prompt: the hash is not in it
    assert second.usage.cache_read_input_tokens >= first.usage.input_tokens + first.usage.cache_read_input_tokens - 1


def test_keep_billing_header_leaves_the_system_prompt_as_sent():
    from localspec.options import GenerationOptions
    from localspec.server.anthropic.requests import parse_messages
    from localspec.server.generation import Limits

    body = {"model": "m", "max_tokens": 4, "messages": MESSAGES,
            "system": [{"type": "text", "text": "x-anthropic-billing-header: cch=1;"},
                       {"type": "text", "text": "Be brief."}]}
    dropped = parse_messages(body, GenerationOptions(), Limits(("m",)))
    kept = parse_messages(body, GenerationOptions(), Limits(("m",), keep_billing_header=True))
    assert dropped.messages[0]["content"] == "Be brief."
    assert kept.messages[0]["content"].startswith("x-anthropic-billing-header: cch=1;")


class Pet(pydantic.BaseModel):
    animal: Literal["cat", "dog", "bird"]
    ok: bool


def test_output_config_format_is_chat_completions_structured_output(server, client, pair):
    want = pair.chat(MESSAGES, max_tokens=120, grammar=Constraint.json_schema(PET))
    assert want.finish_reason == "stop"
    fmt = {"type": "json_schema", "schema": PET}
    r = client.messages.create(model="x", max_tokens=120, messages=MESSAGES, output_config={"format": fmt})
    assert r.content[0].text == want.text and r.stop_reason == "end_turn"
    jsonschema.validate(json.loads(r.content[0].text), PET)
    oai = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=60)
    chat = oai.chat.completions.create(model="t", messages=MESSAGES, max_tokens=120, response_format={
        "type": "json_schema", "json_schema": {"name": "pet", "schema": PET}})
    assert chat.choices[0].message.content == want.text  # one constraint, whichever door
    with client.messages.stream(model="x", max_tokens=120, messages=MESSAGES, output_config={"format": fmt}) as stream:
        assert stream.get_final_message().content[0].text == want.text
    effort = client.messages.create(model="x", max_tokens=120, messages=MESSAGES,
                                    output_config={"format": fmt, "effort": "high"})
    assert effort.content[0].text == want.text  # effort changes nothing here
    beta = client.beta.messages.create(model="x", max_tokens=120, messages=MESSAGES,
                                       betas=["structured-outputs-2025-11-13"], extra_body={"output_format": fmt})
    assert beta.content[0].text == want.text  # the beta's older field
    parsed = client.messages.parse(model="x", max_tokens=120, messages=MESSAGES, output_format=Pet)
    assert isinstance(parsed.parsed_output, Pet)  # the SDK's own schema from a model, parsed back


def test_a_schema_the_engine_cannot_take_is_the_400_chat_completions_gives(server, client, pair):
    bad = {"type": "nonsense"}
    oai = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError, match="cannot be compiled") as chat:
        oai.chat.completions.create(model="t", messages=MESSAGES, max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": bad}})
    for stream in (False, True):
        with pytest.raises(anthropic.BadRequestError) as caught:
            r = client.messages.create(model="x", max_tokens=8, messages=MESSAGES, stream=stream,
                                       output_config={"format": {"type": "json_schema", "schema": bad}})
            list(r) if stream else None
        error = caught.value.body["error"]
        assert error["type"] == "invalid_request_error" and error["message"] == chat.value.body["message"]
    assert client.messages.create(model="x", max_tokens=8, messages=MESSAGES).content[0].text == \
        pair.chat(MESSAGES, max_tokens=8).text  # and it serves on


def test_count_tokens_waits_in_the_queue_and_is_refused_with_it(pair, tmp_path):
    s = ServeProcess(["-t", str(pair.target.path), "-d", "none", "--ctx", "1024", "--max-queue", "0", "--parallel", "1",
                      "-m", "plain"], tmp_path)
    try:
        busy = anthropic.Anthropic(base_url=s.base, api_key="x", max_retries=0, timeout=60)
        with busy.messages.stream(model="x", max_tokens=1000, messages=MESSAGES) as running:
            next(iter(running))  # generating now, with nobody allowed to wait behind it
            with pytest.raises(anthropic.APIStatusError) as caught:
                busy.messages.count_tokens(model="x", messages=MESSAGES)
        assert caught.value.status_code == 529 and caught.value.body["error"]["type"] == "overloaded_error"
        deadline = time.monotonic() + 30
        while s.get("/health")["running"] and time.monotonic() < deadline:
            time.sleep(0.05)  # the generation left stops at its next token
        assert busy.messages.count_tokens(model="x", messages=MESSAGES).input_tokens == \
            len(pair.chat(MESSAGES, max_tokens=1).prompt_tokens)
        assert s.get("/health")["generations"]["completed"] == 0  # a count is not a generation
    finally:
        s.close()


def test_counting_a_100k_token_prompt_keeps_the_server_answering(server, client, pair):
    long = [{"role": "user", "content": "in the end, the cat sat on the mat. " * 12_000}]
    want = len(pair.target.tokenize(pair.format_chat(long), add_special=False))
    assert want > 100_000  # far over the context: a count is not a generation
    counted: list[int] = []
    worker = threading.Thread(target=lambda: counted.append(client.messages.count_tokens(
        model="x", messages=long).input_tokens))
    worker.start()
    slowest = 0.0
    while worker.is_alive():
        start = time.monotonic()
        assert server.get("/health")["status"] == "ok"
        slowest = max(slowest, time.monotonic() - start)
        time.sleep(0.02)
    worker.join()
    assert counted == [want] and slowest < 1.0


TWO_TOOLS = [*TOOLS, {"name": "get_time", "input_schema": SCHEMAS["get_time"]}]
CHAT_TWO_TOOLS = [{"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"],
                                                    **({"description": t["description"]} if "description" in t
                                                       else {})}} for t in TWO_TOOLS]


def test_tool_choice_of_type_tool_calls_that_tool_as_chat_completions_does(client, pair):
    for name in ("get_time", "get_weather"):
        r = client.messages.create(model="x", max_tokens=160, messages=MESSAGES, tools=TWO_TOOLS,
                                   tool_choice={"type": "tool", "name": name, "disable_parallel_tool_use": True})
        uses = [b for b in r.content if b.type == "tool_use"]
        assert r.stop_reason == "tool_use" and uses and {u.name for u in uses} == {name}
        for use in uses:
            jsonschema.validate(use.input, SCHEMAS[name])
        want = pair.chat(MESSAGES, max_tokens=160, tools=CHAT_TWO_TOOLS,
                         tool_choice={"type": "function", "function": {"name": name}}, parallel_tool_calls=False)
        assert [u.input for u in uses] == [json.loads(c.arguments) for c in want.tool_calls]
    with pytest.raises(anthropic.BadRequestError, match="names the tool"):
        client.messages.create(model="x", max_tokens=8, messages=MESSAGES, tools=TWO_TOOLS,
                               tool_choice={"type": "tool"})


def test_a_tool_result_with_is_error_reaches_the_model_as_an_error(client, pair):
    use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Atlantis", "days": 1}}

    def history(result: dict) -> list:
        return [*MESSAGES, {"role": "assistant", "content": [use]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", **result}]}]

    failed = history({"content": [{"type": "text", "text": "no such city"}], "is_error": True})
    r = client.messages.create(model="x", max_tokens=20, messages=failed, tools=TOOLS, tool_choice={"type": "none"})
    call = {"id": "toolu_1", "type": "function", "function": {"name": "get_weather",
                                                              "arguments": json.dumps(use["input"])}}
    library = pair.chat([*MESSAGES, {"role": "assistant", "content": "", "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: no such city"}],
                        max_tokens=20, tools=CHAT_TWO_TOOLS[:1], tool_choice="none")
    assert r.content[0].text == library.text
    counted = [client.messages.count_tokens(model="x", messages=history(result), tools=TOOLS).input_tokens
               for result in ({"content": "no such city", "is_error": True}, {"content": "no such city"})]
    assert counted[0] > counted[1]  # the error is said in the prompt
    with pytest.raises(anthropic.BadRequestError, match="is_error must be true or false"):
        client.messages.create(model="x", max_tokens=8, messages=history({"content": "x", "is_error": "yes"}))


def test_not_found_and_api_errors_have_anthropics_shape(server):
    ant = anthropic.Anthropic(base_url=server.base, api_key="x", max_retries=0)
    with pytest.raises(anthropic.NotFoundError) as caught:
        ant.messages.batches.list()  # /v1/messages/batches: not served here
    assert caught.value.status_code == 404 and caught.value.body["type"] == "error"
    assert caught.value.body["error"]["type"] == "not_found_error" and caught.value.body["error"]["message"]
    for status, kind in ((500, "api_error"), (502, "api_error"), (529, "overloaded_error"), (404, "not_found_error")):
        assert error_body(status, "m") == {"type": "error", "error": {"type": kind, "message": "m"}}
    r = error_response(ApiError(500, "The request failed: boom.", type="server_error"))
    assert r.status_code == 500 and json.loads(r.body)["error"] == {"type": "api_error",
                                                                    "message": "The request failed: boom."}


class BrokenPair:
    """``pair``, whose generations fail as a bug would."""

    def __init__(self, pair):
        self._pair = pair

    def __getattr__(self, name):
        return getattr(self._pair, name)

    def stream_chat(self, *args, **kwargs):
        raise RuntimeError("boom")


def test_an_unexpected_failure_on_a_messages_path_is_an_api_error_object(pair, monkeypatch):
    """A failure (in the generation, or in the route itself) is answered in the shape of its path's API."""
    from inprocess import local_server
    from starlette.testclient import TestClient

    from localspec.server.anthropic import routes as anthropic_routes
    from localspec.server.app import create_app

    client = TestClient(create_app(local_server(BrokenPair(pair)), hosts=()), raise_server_exceptions=False)
    body = {"model": "x", "max_tokens": 4, "messages": MESSAGES}
    r = client.post("/v1/messages", json=body)
    assert r.status_code == 500 and r.json() == {"type": "error", "error": {
        "type": "api_error", "message": "Generation failed: RuntimeError('boom')."}}
    chat = client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 4})
    assert chat.status_code == 500 and chat.json()["error"]["type"] == "server_error"  # OpenAI's, on its path

    def failing(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(anthropic_routes, "parse_messages", failing)
    r = client.post("/v1/messages?beta=true", json=body)
    assert r.status_code == 500 and r.json() == {"type": "error", "error": {
        "type": "api_error", "message": "The request failed: RuntimeError('boom')."}}


def test_the_servers_sampling_defaults_apply_to_messages_that_leave_them_out(pair, tmp_path):
    """The anthropic client has no temperature, top_p or top_k arguments: serve's own defaults apply."""
    sampled = ["--temperature", "1.3", "--top-k", "60", "--top-p", "0.95", "--seed", "11", "--repeat-penalty", "1.1"]
    s = ServeProcess(["-t", str(pair.target.path), "-d", "none", "--ctx", "1024", "--no-history", "-m", "plain",
                      *sampled], tmp_path)
    try:
        ant = anthropic.Anthropic(base_url=s.base, api_key="x", max_retries=0, timeout=60)
        r = ant.messages.create(model="x", max_tokens=24, messages=MESSAGES)
        chat = openai.OpenAI(base_url=s.url, api_key="x", max_retries=0, timeout=60).chat.completions.create(
            model="t", messages=MESSAGES, max_tokens=24, temperature=1.3, top_p=0.95, seed=11,
            extra_body={"top_k": 60, "repeat_penalty": 1.1})
        assert r.content[0].text == chat.choices[0].message.content  # the defaults, as if sent
        greedy = ant.messages.create(model="x", max_tokens=24, messages=MESSAGES, extra_body={"temperature": 0})
        # the temperature sent, the rest of the defaults kept: greedy, with the server's repeat penalty
        assert greedy.content[0].text == pair.chat(MESSAGES, max_tokens=24, repeat_penalty=1.1).text
        assert greedy.content[0].text != r.content[0].text
        with ant.messages.stream(model="x", max_tokens=24, messages=MESSAGES) as stream:
            assert stream.get_final_message().content[0].text == r.content[0].text
    finally:
        s.close()


def test_models_are_listed_and_retrieved_in_each_clients_shape_and_an_unknown_one_is_its_404(server, client):
    oa = openai.OpenAI(base_url=server.base + "/v1", api_key="x", max_retries=0)
    names = [m.id for m in oa.models.list().data]
    assert names and all(m.owned_by == "localspec" for m in oa.models.list().data)
    assert oa.models.retrieve(names[0]).id == names[0]
    listed = client.models.list()
    assert [m.id for m in listed.data] == names and listed.has_more is False
    one = client.models.retrieve(names[0])
    assert (one.type, one.id, one.display_name) == ("model", names[0], names[0])
    assert abs(one.created_at.timestamp() - time.time()) < 3600  # a real time, parsed by the client
    with pytest.raises(anthropic.NotFoundError) as ant:
        client.models.retrieve("no-such-model")
    assert ant.value.body["error"]["type"] == "not_found_error" and names[0] in ant.value.message
    with pytest.raises(openai.NotFoundError) as oai:
        oa.models.retrieve("no-such-model")
    assert oai.value.code == "model_not_found" and names[0] in oai.value.message
    # strictly as the SDK's types say (its parsing is lenient), and by the tag Ollama's apps use
    raw = requests.get(f"{server.base}/v1/models/{names[0]}:latest", headers={"anthropic-version": "2023-06-01"},
                       timeout=30)
    assert raw.status_code == 200 and anthropic.types.ModelInfo.model_validate(raw.json()).lifecycle == "active"
    listed_raw = requests.get(f"{server.base}/v1/models/", timeout=30).json()  # the list, with a slash
    assert [m["id"] for m in listed_raw["data"]] == names
    # a chat completions error keeps OpenAI's shape whatever headers come with it
    bad = requests.post(f"{server.base}/v1/chat/completions", json={"model": "nope", "messages": MESSAGES},
                        headers={"anthropic-version": "2023-06-01"}, timeout=30)
    assert bad.status_code == 404 and bad.json()["error"]["code"] == "model_not_found"
