"""Anthropic's Messages and OpenAI's Responses APIs on the real pair, through the official clients: answers,
tool calls and their results, and one greedy text whichever API asks."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
from conftest import real_models_dir
from serverproc import ServeProcess

pytestmark = pytest.mark.real
QUESTION = "What is the capital of France? Answer in one word."
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
           "required": ["city", "unit"], "additionalProperties": False}
ASK_WEATHER = "What's the weather in Paris, in celsius?"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = real_models_dir()
    s = ServeProcess(["-t", str(d / "target.gguf"), "-d", str(d / "draft.gguf"), "--ctx", "4096"],
                     tmp_path_factory.mktemp("serve-agents-real"), timeout=300)
    yield s
    s.close()


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.base, api_key="x", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=300)


def test_one_greedy_answer_through_chat_messages_and_responses(claude, oai):
    chat = oai.chat.completions.create(model="target", max_tokens=12, messages=[{"role": "user", "content": QUESTION}])
    msg = claude.messages.create(model="claude-sonnet-4-5", max_tokens=12, messages=[{"role": "user",
                                                                                      "content": QUESTION}])
    resp = oai.responses.create(model="target", input=QUESTION, max_output_tokens=12)
    assert "Paris" in chat.choices[0].message.content
    assert chat.choices[0].message.content == msg.content[0].text == resp.output_text
    assert msg.stop_reason == "end_turn" and resp.status == "completed"


def _after_the_call(oai, call_id: str, arguments: str, system: list) -> str:
    """What chat completions answers once the call has its result (the same history, in OpenAI's shape)."""
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                               "parameters": WEATHER}}]
    r = oai.chat.completions.create(model="target", tools=tools, max_tokens=40, messages=[
        *system, {"role": "user", "content": ASK_WEATHER},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "22 C and sunny"}])
    return r.choices[0].message.content or ""


def test_claude_style_tool_use_and_its_result(claude, oai):
    tools = [{"name": "get_weather", "description": "Current weather in a city", "input_schema": WEATHER}]
    ask = [{"role": "user", "content": ASK_WEATHER}]
    with claude.messages.stream(model="x", max_tokens=80, messages=ask, tools=tools,
                                tool_choice={"type": "any", "disable_parallel_tool_use": True}) as stream:
        r = stream.get_final_message()
    (use,) = [b for b in r.content if b.type == "tool_use"]
    assert r.stop_reason == "tool_use" and use.input == {"city": "Paris", "unit": "C"}
    history = [*ask, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                             "content": [{"type": "text", "text": "22 C and sunny"}]}]}]
    answer = claude.messages.create(model="x", max_tokens=40, messages=history, tools=tools)
    assert answer.stop_reason == "end_turn"
    assert answer.content[0].text == _after_the_call(oai, use.id, json.dumps(use.input), [])


def test_codex_style_function_call_and_its_output(oai):
    tools = [{"type": "function", "name": "get_weather", "description": "Current weather in a city",
              "parameters": WEATHER}]
    r = oai.responses.create(model="target", instructions="You are a helpful assistant.", input=ASK_WEATHER,
                             tools=tools, tool_choice="required", parallel_tool_calls=False, max_output_tokens=80,
                             store=False)
    (call,) = [item for item in r.output if item.type == "function_call"]
    assert json.loads(call.arguments) == {"city": "Paris", "unit": "C"}
    events = list(oai.responses.create(model="target", instructions="You are a helpful assistant.", tools=tools,
                                       max_output_tokens=40, stream=True, input=[
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ASK_WEATHER}]},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "22 C and sunny"}]))
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == _after_the_call(oai, call.call_id, call.arguments, [
        {"role": "system", "content": "You are a helpful assistant."}])


READ_TOOL = {"name": "Read", "description": "Read a file from the local filesystem.",
             "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}},
                              "required": ["file_path"]}}
FENCE_SYSTEM = ("You are a coding agent. To call a tool, reply with only a ```json block holding "
                '{"name": ..., "arguments": ...}.')


def test_a_call_the_model_writes_as_a_json_block_is_a_tool_use_whole_and_streamed(claude):
    """Qwen2.5-Coder writes its call as a Markdown block rather than in <tool_call> tags here (as it does under
    Claude Code's long system prompt): both ways it reaches the client as a tool_use block."""
    ask = dict(model="qwen", max_tokens=80, tools=[READ_TOOL], system=FENCE_SYSTEM,
               messages=[{"role": "user", "content": "Read the file calc.py."}])
    whole = claude.messages.create(**ask)
    with claude.messages.stream(**ask) as stream:
        streamed = stream.get_final_message()
    for m in (whole, streamed):
        assert m.stop_reason == "tool_use", m.content
        assert [(b.type, b.name, b.input) for b in m.content] == [("tool_use", "Read", {"file_path": "calc.py"})]


def test_count_tokens_and_a_streamed_beta_message_count_the_same_prompt(claude):
    """Claude Code's way: POST /v1/messages?beta=true with cache_control, thinking and metadata, streamed."""
    system = [{"type": "text", "text": "You are a geography assistant.", "cache_control": {"type": "ephemeral"}}]
    ask = [{"role": "user", "content": QUESTION}]
    counted = claude.messages.count_tokens(model="x", system=system, messages=ask).input_tokens
    tools = [{"name": "get_weather", "description": "Current weather in a city", "input_schema": WEATHER}]
    assert claude.messages.count_tokens(model="x", system=system, messages=ask, tools=tools).input_tokens > counted
    events = list(claude.beta.messages.create(
        model="claude-sonnet-4-5", max_tokens=12, system=system, messages=ask, stream=True,
        betas=["interleaved-thinking-2025-05-14"], metadata={"user_id": "u1"},
        thinking={"type": "enabled", "budget_tokens": 1024}))
    start, end = events[0].message.usage, next(e for e in events if e.type == "message_delta").usage
    assert start.input_tokens + start.cache_read_input_tokens == counted  # the prompt counted is the one run
    assert (start.input_tokens, start.cache_read_input_tokens) == (end.input_tokens, end.cache_read_input_tokens)
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert "Paris" in text and end.output_tokens > 0  # no reasoning channel: thinking changes nothing


def test_anthropics_error_shape_on_the_real_pair(claude):
    with pytest.raises(anthropic.BadRequestError, match="prompt is too long") as caught:
        claude.messages.create(model="x", max_tokens=4, messages=[{"role": "user", "content": "Paris " * 5000}])
    assert caught.value.body["type"] == "error" and caught.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError, match="answers no tool_use") as unpaired:
        claude.messages.create(model="x", max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_nope", "content": "22 C"}]}])
    assert unpaired.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError) as missing:
        claude.messages.batches.list()  # not served here
    assert missing.value.body == {"type": "error", "error": {"type": "not_found_error",
                                                             "message": missing.value.body["error"]["message"]}}


def test_responses_text_format_json_schema_on_the_real_pair(oai):
    schema = {"type": "object", "properties": {"capital": {"type": "string"}}, "required": ["capital"],
              "additionalProperties": False}
    r = oai.responses.create(model="target", input=QUESTION, max_output_tokens=30, text={"format": {
        "type": "json_schema", "name": "answer", "schema": schema, "strict": True}})
    assert r.status == "completed" and json.loads(r.output_text) == {"capital": "Paris"}
