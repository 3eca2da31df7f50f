"""OpenAI's Responses API on `localspec serve` (tiny models), through the official `openai` client: the same
generation as chat completions, as a response object or its typed events."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from chatdefs import SCHEMAS, WEATHER
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serverproc import ServeProcess
from tinymodel import HERMES_TEMPLATE as TEMPLATE
from tinymodel import write_tiny_model

import localspec
from localspec.structured.tool_use import CLOSE, OPEN

TEXT = "in the end, in the end, what is the weather in the end"
MESSAGES = [{"role": "user", "content": TEXT}]
TOOLS = [{"type": "function", "name": "get_weather", "description": "The forecast", "parameters": WEATHER}]
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The forecast",
                                                "parameters": WEATHER}}]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("responses")
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
    return openai.OpenAI(base_url=server.url, api_key="not-needed", max_retries=0, timeout=60)


def test_a_response_is_the_chat_reply(client, pair):
    want = pair.chat([{"role": "system", "content": "be brief"}, *MESSAGES], max_tokens=24)
    r = client.responses.create(model="t", instructions="be brief", input=TEXT, max_output_tokens=24, store=False)
    assert r.object == "response" and r.id.startswith("resp_") and r.output_text == want.text
    assert [item.type for item in r.output] == ["message"] and r.output[0].content[0].type == "output_text"
    assert r.status == ("incomplete" if want.finish_reason == "length" else "completed")
    assert r.usage.input_tokens == len(want.prompt_tokens) and r.usage.output_tokens == len(want.tokens)
    items = client.responses.create(model="t", instructions="be brief", max_output_tokens=24, input=[
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": TEXT}]}])
    assert items.output_text == want.text and items.usage.input_tokens_details.cached_tokens > 0
    drafted = client.responses.create(model="t", instructions="be brief", input=TEXT, max_output_tokens=24,
                                      extra_body={"method": "lookup", "k": 4})
    assert drafted.output_text == want.text and drafted.model_extra["localspec"]["method"] == "lookup"


def test_a_streamed_response_has_every_event_typed_and_numbered_and_ends_whole(client, pair):
    want = pair.chat(MESSAGES, max_tokens=30)
    events = list(client.responses.create(model="t", input=TEXT, max_output_tokens=30, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:5] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added", "response.output_text.delta"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == want.text
    assert events[-1].response.output_text == want.text and events[-1].response.usage.output_tokens == len(
        want.tokens)


def test_a_function_call_and_its_output_round_trip(client, pair):
    ask = dict(model="t", input=TEXT, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
               max_output_tokens=160)
    r = client.responses.create(**ask)
    (call,) = [item for item in r.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id
    jsonschema.validate(json.loads(call.arguments), SCHEMAS["get_weather"])
    events = list(client.responses.create(**ask, stream=True))
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.arguments == call.arguments
    answered = client.responses.create(model="t", tools=TOOLS, tool_choice="none", max_output_tokens=20, input=[
        *MESSAGES, {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    library = pair.chat([*MESSAGES, {"role": "assistant", "content": "", "tool_calls": [{
        "id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}], max_tokens=20, tools=CHAT_TOOLS,
        tool_choice="none")
    assert answered.output_text == library.text
    with pytest.raises(openai.BadRequestError, match="answers no function_call"):
        client.responses.create(model="t", input=[*MESSAGES, {"type": "function_call_output", "call_id": "nope",
                                                              "output": "x"}])


def test_text_format_json_schema_is_the_structured_output(client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    r = client.responses.create(model="t", input=TEXT, max_output_tokens=60, text={"format": {
        "type": "json_schema", "name": "count", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(r.output_text), schema)
    streamed = client.responses.create(model="t", input=TEXT, max_output_tokens=60, stream=True, text={"format": {
        "type": "json_schema", "name": "count", "schema": schema, "strict": True}})
    assert [e for e in streamed if e.type == "response.completed"][0].response.output_text == r.output_text
    bad = {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}
    with pytest.raises(openai.BadRequestError, match="cannot be compiled") as chat:
        openai.OpenAI(base_url=client.base_url, api_key="x", max_retries=0).chat.completions.create(
            model="t", messages=MESSAGES, max_tokens=8, response_format={"type": "json_schema", "json_schema": {
                "name": "x", "schema": bad["schema"]}})
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="t", input=TEXT, max_output_tokens=8, text={"format": bad})
    assert caught.value.body["message"] == chat.value.body["message"]  # the 400 chat completions gives


@pytest.mark.parametrize("body,param,needle", [
    ({"previous_response_id": "resp_1"}, "previous_response_id", "keeps no responses"),
    ({"tools": [{"type": "custom", "name": "apply_patch"}]}, "tools", "'custom'"),
    ({"tools": [{"type": "namespace", "name": "ns", "tools": [{"type": "custom", "name": "x"}]}]}, "tools",
     "tools[0].tools[0] has type 'custom'"),
    ({"input": [{"type": "computer_call", "call_id": "c"}]}, "input", "unknown item type 'computer_call'"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input",
     "without a vision projector"),
    ({"max_output_tokens": "9"}, "max_output_tokens", "integer"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format", "text.format"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format", "needs its 'schema'"),
    ({"model": "gpt-5"}, "model", "does not exist"),
    ({"input": None}, "input", "input"),
])
def test_malformed_bodies_are_openai_4xx_naming_the_field(server, body, param, needle):
    status, reply, _ = server.post("/v1/responses", json.dumps({"input": TEXT, **body}).encode())
    assert status in (400, 404) and reply["error"]["param"] == param and needle in reply["error"]["message"], reply


def test_a_prompt_over_the_context_is_context_length_exceeded_naming_input(client):
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as caught:
            client.responses.create(model="t", input="in the end " * 600, max_output_tokens=4, stream=stream)
        assert caught.value.body["code"] == "context_length_exceeded" and caught.value.body["param"] == "input"


def test_the_guards_hold_and_a_client_leaving_mid_stream_leaves_the_next_request_exact(server, client, pair):
    status, reply, _ = server.post("/v1/responses", b"{}", headers={"Origin": "https://evil.example"})
    assert status == 403 and reply["error"]["code"] == "origin_not_allowed"
    big = server.raw(b"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 99999999\r\n\r\n")
    assert big[0] == 413
    want = pair.chat(MESSAGES, max_tokens=8).text
    stream = client.responses.create(model="t", input=TEXT, max_output_tokens=200, stream=True)
    for e in stream:
        if e.type == "response.output_text.delta":
            break
    stream.close()
    assert client.responses.create(model="t", input=TEXT, max_output_tokens=8).output_text == want


JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 40) | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                 max_size=3), max_leaves=8)
FIELDS = ["model", "input", "instructions", "tools", "tool_choice", "text", "reasoning", "max_output_tokens",
          "messages", "system", "max_tokens", "stop_sequences", "thinking", "temperature", "stream", "content",
          "role", "type", "call_id", "output", "tool_use_id"]
ITEMS = st.fixed_dictionaries({}, optional={k: JSON for k in ("type", "role", "content", "call_id", "name",
                                                                "arguments", "output", "tool_use_id", "input")})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.dictionaries(st.sampled_from(FIELDS), JSON | st.lists(ITEMS, max_size=3), max_size=6),
       path=st.sampled_from(["/v1/responses", "/v1/messages", "/v1/messages/count_tokens"]))
def test_no_body_gives_a_5xx_on_the_new_routes(server, body, path):
    if isinstance(body.get("max_tokens"), int) or isinstance(body.get("max_output_tokens"), int):
        body = {**body, "max_tokens": 4, "max_output_tokens": 4} if path != "/v1/responses" else \
            {**body, "max_output_tokens": 4}
    status, reply, _ = server.post(path, json.dumps(body).encode())
    assert status < 500, (body, reply)


def test_after_the_fuzzing_the_server_is_still_exact(client, pair):
    assert client.responses.create(model="t", input=TEXT, max_output_tokens=16).output_text == pair.chat(
        MESSAGES, max_tokens=16).text


def test_a_request_shaped_as_codexs_streams_to_response_completed(server):
    shell = {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}},
                                              "workdir": {"type": "string"}, "timeout_ms": {"type": "number"}},
             "required": ["command"], "additionalProperties": False}
    body = {"model": "t", "instructions": "You are a coding agent.", "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions>"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]}],
        "tools": [{"type": "function", "name": "shell", "description": "Runs a shell command", "strict": False,
                   "parameters": shell}], "tool_choice": "auto", "parallel_tool_calls": False, "reasoning": None,
        "store": False, "stream": True, "include": [], "prompt_cache_key": "abc", "text": {"verbosity": "medium"},
        "max_output_tokens": 64}
    status, events, _ = server.post("/v1/responses", json.dumps(body).encode())
    data = [json.loads(line[6:]) for line in events.splitlines() if line.startswith("data: ")]
    assert status == 200 and all("type" in d and "sequence_number" in d for d in data)
    assert data[-1]["type"] == "response.completed" and data[-1]["response"]["status"] in ("completed", "incomplete")


def test_codexs_namespaced_functions_are_offered_and_its_hosted_tools_left_out(client):
    """Codex sends its sub-agent functions in a namespace tool and web_search with every request: the
    namespace's functions are offered under their names, a call of one comes back with its namespace, whole
    and streamed, and the hosted tool is left out rather than refusing the request."""
    space = {"type": "namespace", "name": "weather_v1", "description": "Weather tools",
             "tools": [{"type": "function", "name": "get_weather", "description": "The forecast",
                        "parameters": WEATHER}]}
    ask = dict(model="t", input=TEXT, tools=[space, {"type": "web_search", "external_web_access": False}],
               tool_choice="required", parallel_tool_calls=False, max_output_tokens=160)
    whole = client.responses.create(**ask)
    (call,) = [item for item in whole.output if item.type == "function_call"]
    assert (call.name, call.namespace) == ("get_weather", "weather_v1")
    jsonschema.validate(json.loads(call.arguments), SCHEMAS["get_weather"])
    events = list(client.responses.create(**ask, stream=True))
    done = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    assert [(c.name, c.namespace, c.arguments) for c in done] == [("get_weather", "weather_v1", call.arguments)]
    final = events[-1].response
    assert [(c.name, c.namespace) for c in final.output if c.type == "function_call"] == [("get_weather",
                                                                                          "weather_v1")]
    alone = client.responses.create(model="t", input=TEXT, max_output_tokens=8, tool_choice="auto",
                                    tools=[{"type": "web_search"}])  # only hosted tools: a plain reply
    assert alone.status in ("completed", "incomplete") and alone.output_text


def test_text_format_json_object_is_chat_completions_json_mode(server, client):
    ask = "the cat"  # the random model closes its object within 60 tokens here
    r = client.responses.create(model="t", input=ask, max_output_tokens=120, text={"format": {"type": "json_object"}})
    assert isinstance(json.loads(r.output_text), dict) and r.status == "completed"
    assert r.text.format.type == "json_object"  # echoed as sent
    chat = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=60).chat.completions.create(
        model="t", messages=[{"role": "user", "content": ask}], max_tokens=120, response_format={"type": "json_object"})
    assert r.output_text == chat.choices[0].message.content
    events = list(client.responses.create(model="t", input=ask, max_output_tokens=120, stream=True,
                                          text={"format": {"type": "json_object"}}))
    assert events[-1].response.output_text == r.output_text


def test_temperature_and_top_p_sample_as_chat_completions_does(server, client, pair):
    ask = dict(model="t", input=TEXT, max_output_tokens=24, temperature=1.3, top_p=0.95,
               extra_body={"seed": 11, "method": "plain"})
    r = client.responses.create(**ask)
    assert (r.temperature, r.top_p) == (1.3, 0.95)
    chat = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=60).chat.completions.create(
        model="t", messages=MESSAGES, max_tokens=24, temperature=1.3, top_p=0.95, seed=11,
        extra_body={"method": "plain"})
    assert r.output_text == chat.choices[0].message.content != pair.chat(MESSAGES, max_tokens=24).text
    assert client.responses.create(**ask).output_text == r.output_text  # the seed makes it repeatable
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="t", input=TEXT, max_output_tokens=4, temperature=-1)
    assert caught.value.param == "temperature"


def test_an_assistant_turn_given_back_as_output_text_parts_is_the_history(client, pair):
    first = client.responses.create(model="t", input=TEXT, max_output_tokens=12)
    again = "and in the end?"
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": TEXT}]},
             *[item.model_dump(exclude_none=True) for item in first.output],  # as Codex sends its history back
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": again}]}]
    assert items[1]["content"][0]["type"] == "output_text"
    r = client.responses.create(model="t", input=items, max_output_tokens=16)
    want = pair.chat([*MESSAGES, {"role": "assistant", "content": first.output_text},
                      {"role": "user", "content": again}], max_tokens=16)
    assert r.output_text == want.text and r.usage.input_tokens == len(want.prompt_tokens)
    assert r.usage.input_tokens_details.cached_tokens > 0  # the first turn's prompt, from the cache
