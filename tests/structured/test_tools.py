"""Tool calls: offered through the chat template, constrained by each function's parameter schema (from
``<tool_call>`` on under tool_choice "auto"), read back as OpenAI's tool_calls, exact under every method."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from chatdefs import SCHEMAS, TIME, TOOL_MESSAGES, TOOLS, WEATHER
from helpers import same_distribution, token_counts
from hypothesis import given, settings
from hypothesis import strategies as st
from serverproc import ServeProcess
from tinymodel import HERMES_TEMPLATE, write_tiny_model

import localspec
from localspec.constraint import Constraint
from localspec.errors import ConfigError
from localspec.structured.call_reader import CallReader, read_calls
from localspec.structured.tool_use import CLOSE, OPEN, ToolUse

MESSAGES = TOOL_MESSAGES
METHODS = [("lookup", 3), ("draft", 2), ("draft", 5), ("auto", None)]
TEMPLATE = HERMES_TEMPLATE


@pytest.fixture(scope="module")
def tool_pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("tools")
    for name, noise in (("t.gguf", 0.0), ("d.gguf", 0.35)):
        write_tiny_model(d / name, seed=0, noise=noise, user_tokens=[OPEN, CLOSE], chat_template=TEMPLATE)
    with localspec.load(d / "t.gguf", d / "d.gguf", n_ctx=1024, history=False) as pair:
        yield pair


def _open_token(pair) -> int:
    (token,) = pair.target.tokenize(OPEN, add_special=False)
    return token


def _check_calls(result, names=("get_weather", "get_time")):
    assert result.tool_calls, f"no tool call in {result.text!r}"
    for call in result.tool_calls:
        assert call.name in names and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])


@pytest.mark.parametrize("choice", ["required", "get_time"])
def test_required_calls_validate_and_every_method_gives_plain_decodings_tokens(tool_pair, choice):
    plain = tool_pair.chat(MESSAGES, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False,
                           max_tokens=120, method="plain")
    _check_calls(plain, ("get_time",) if choice == "get_time" else SCHEMAS)
    assert len(plain.tool_calls) == 1 and plain.finish_reason == "tool_calls" and plain.content is None
    assert plain.text.startswith(OPEN + "\n{")
    for method, k in METHODS:
        r = tool_pair.chat(MESSAGES, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False, max_tokens=120,
                           method=method, k=k)
        assert r.tokens == plain.tokens, f"{method} k={k} diverged from plain decoding under the tools' grammar"
        assert r.tool_calls[0].arguments == plain.tool_calls[0].arguments
    assert r.stats.accepted_by.get("grammar", 0) > 0  # the call's keys and quotes cost no drafting


def test_auto_is_free_text_until_the_model_writes_the_call_token(tool_pair):
    free = tool_pair.chat(MESSAGES, max_tokens=40, method="plain")
    bias = {_open_token(tool_pair): 6.0}  # so that this random model calls after a few words
    plain = tool_pair.chat(MESSAGES, tools=TOOLS, parallel_tool_calls=False, max_tokens=160, method="plain",
                           logit_bias=bias)
    at = plain.tokens.index(_open_token(tool_pair))
    assert at > 0, "the call came first: the test wants free text before it"
    prompt = tool_pair.target.tokenize(tool_pair.format_chat(MESSAGES, tools=ToolUse.from_openai(TOOLS).offered()),
                                       add_special=False)
    unconstrained = tool_pair.generate(prompt, max_tokens=at + 1, method="plain", logit_bias=bias)
    assert plain.tokens[:at + 1] == unconstrained.tokens  # free up to and with the call token
    _check_calls(plain)
    assert plain.finish_reason == "tool_calls" and len(plain.tool_calls) == 1
    assert plain.content == plain.text[:plain.text.index(OPEN)].rstrip()
    for method, k in METHODS:
        r = tool_pair.chat(MESSAGES, tools=TOOLS, parallel_tool_calls=False, max_tokens=160, method=method, k=k,
                           logit_bias=bias)
        assert r.tokens == plain.tokens, f"{method} k={k} diverged from plain decoding under the lazy grammar"
    none = tool_pair.chat(MESSAGES, tools=TOOLS, tool_choice="none", max_tokens=40, method="plain", logit_bias=bias)
    assert _open_token(tool_pair) not in none.tokens and none.tool_calls is None  # shown the tools, it cannot call
    assert free.tokens != none.tokens  # the tools are in the prompt under "none" too, as OpenAI shows them


@pytest.mark.parametrize("method,k", [("draft", 3), ("lookup", 3)])
def test_sampled_speculation_keeps_the_distribution_of_a_grammar_that_waits_for_its_trigger(tiny_pair, method, k):
    prompt = "in the end, in the end, in the end, in the"
    free = token_counts(tiny_pair, prompt, 300, 0, method="plain")
    def one_token(t):
        text = tiny_pair.target.detokenize([t])
        return text.isascii() and text.isprintable() and tiny_pair.target.tokenize(text, add_special=False) == [t]

    # the likeliest first token that is text of its own: many replies start the grammar, many do not
    text = tiny_pair.target.detokenize([max(filter(one_token, free), key=free.__getitem__)])
    lazy = Constraint("lark", f'start: {json.dumps(text)} " " animal "."\nanimal: "cat" | "dog" | "bird" | "fox"',
                      trigger=text)
    for position in (0, 2):  # the free first token, and the animal's first letter where the trigger came
        plain = token_counts(tiny_pair, prompt, 1500, position, method="plain", grammar=lazy)
        spec = token_counts(tiny_pair, prompt, 1500, position, method=method, k=k, grammar=lazy)
        p = same_distribution(plain, spec)
        assert p > 1e-3, f"{method} position {position}: chi-square p = {p:.2e}"


def test_an_earlier_call_and_its_answer_go_back_into_the_template(tool_pair):
    messages = [*MESSAGES,
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 2}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "rain"}]
    text = tool_pair.format_chat(messages, tools=ToolUse.from_openai(TOOLS).offered())
    assert '"name": "get_weather"' in text and '"description": "The forecast"' in text  # the tools, shown
    assert '{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}' in text  # an object, not a string
    assert "<tool_response>\nrain\n</tool_response>" in text
    assert tool_pair.chat(messages, tools=TOOLS, tool_choice="required", max_tokens=120).tool_calls


def test_parameter_schemas_with_their_own_definitions_compile_and_the_arguments_follow_them(tool_pair):
    order = {"$defs": {"Size": {"enum": ["s", "m"]},
                       "Item": {"type": "object", "properties": {"size": {"$ref": "#/$defs/Size"}},
                                "required": ["size"], "additionalProperties": False}},
             "type": "object", "properties": {"item": {"$ref": "#/$defs/Item"}, "note": {"$ref": "#/properties/tag"},
                                              "tag": {"enum": ["x", "y"]}},
             "required": ["item", "note"], "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "order", "parameters": order}}, TOOLS[1]]
    r = tool_pair.chat(MESSAGES, tools=tools, tool_choice="order", parallel_tool_calls=False, max_tokens=200,
                       method="plain")
    assert r.finish_reason == "tool_calls"
    jsonschema.validate(json.loads(r.tool_calls[0].arguments), order)


@pytest.mark.parametrize("tools,choice,needle", [
    ([{"type": "function"}], None, "tools[0] must be"),
    ([{"type": "function", "function": {"name": "a b"}}], None, "tools[0].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": []}}], None, "parameters must be"),
    ([{"type": "function", "function": {"name": "f", "params": {}}}], None, "'params'"),
    (TOOLS + TOOLS[:1], None, "Two tools are named 'get_weather'"),
    (TOOLS, "get_tide", "'get_tide', which is not among the tools"),
    (TOOLS, {"type": "function"}, "tool_choice must be"),
    (TOOLS, "always", "'always', which is not among the tools"),
    (None, "required", "needs tools"),
    ([{"type": "function", "function": {"name": "auto"}}], None, "tool_choice word"),
])
def test_malformed_tools_are_one_sentence(tool_pair, tools, choice, needle):
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        tool_pair.chat(MESSAGES, tools=tools, tool_choice=choice, max_tokens=4)


def test_the_moved_schema_keeps_values_that_look_like_refs_and_drops_the_root_id():
    params = {"$id": "https://example.com/p", "$defs": {"A": {"const": {"$ref": "#/not/a/schema"}}},
              "type": "object", "properties": {"a": {"$ref": "#/$defs/A"}, "b": {"enum": [{"$ref": "#"}]}}}
    source = ToolUse.from_openai([{"type": "function", "function": {"name": "f", "parameters": params}}]).constraint()
    calls = json.loads(source.source.split("%json ", 1)[1])
    assert calls["$defs"]["tool0.defs.A"] == {"const": {"$ref": "#/not/a/schema"}}  # data, not a pointer
    assert calls["$defs"]["tool0"]["properties"] == {"a": {"$ref": "#/$defs/tool0.defs.A"},
                                                     "b": {"enum": [{"$ref": "#"}]}}
    assert "$id" not in calls["$defs"]["tool0"] and "$defs" in params  # the caller's schema is left as it was


def test_tools_need_a_template_that_writes_calls_and_no_second_constraint(tiny_pair, tool_pair):
    plain = tiny_pair.chat(MESSAGES, max_tokens=8, method="plain")  # "none" with a template that cannot call:
    assert tiny_pair.chat(MESSAGES, tools=TOOLS, tool_choice="none", max_tokens=8, method="plain").tokens == \
        plain.tokens  # the tools are not shown, since nothing could keep the model from its own call format
    with pytest.raises(ConfigError, match="does not write tool calls as <tool_call>"):
        tiny_pair.chat(MESSAGES, tools=TOOLS, max_tokens=4)
    with pytest.raises(ConfigError, match="cannot also follow the JSON schema"):
        tool_pair.chat(MESSAGES, tools=TOOLS, max_tokens=4, grammar=Constraint.json_schema(WEATHER))
    with pytest.raises(ConfigError, match="cannot be compiled"):
        bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "minProperties": "x"}}}]
        tool_pair.chat(MESSAGES, tools=bad, tool_choice="required", max_tokens=4)


@pytest.mark.parametrize("text,content,calls", [
    ("text <tool_call> in prose, no close", "text <tool_call> in prose, no close", []),  # spelt out: no call
    (f'{OPEN}\n{{"name": "f", "arguments": 123}}\n{CLOSE}', None, [("f", "123")]),  # a bare value
    (f'{OPEN}\n{{"name": "f", "arguments": true}}\n{CLOSE}\nafter it', "after it", [("f", "true")]),
    (f'{OPEN}\n{{"name": "f", "arguments": {{"a": 1}}}}\n{CLOSE}\nhi there friend', "hi there friend",
     [("f", '{"a": 1}')]),  # text after a call keeps its spaces, however it streams
])
def test_the_reader_on_replies_no_grammar_held(text, content, calls):
    import random

    whole = read_calls(text)
    assert [(c.name, c.arguments) for c in whole.calls] == calls and not whole.cut
    assert ("".join(whole.content) or None if calls else "".join(whole.content)) == content
    rng = random.Random(0)
    for _ in range(30):
        reader, start = CallReader(), 0
        while start < len(text):
            n = rng.randint(1, 4)
            reader.feed(text[start:start + n])
            start += n
        reader.close()
        assert [(c.name, c.arguments) for c in reader.calls] == calls
        assert "".join(reader.content) == "".join(whole.content)


_text = st.text(st.one_of(st.characters(codec="utf-8"), st.sampled_from(list("<tool_call>/ \n"))), max_size=14) \
    .filter(lambda t: OPEN not in t)
_value = st.lists(st.one_of(st.characters(codec="utf-8"), st.sampled_from(['"', "\\", "{", "}", "[", "]", CLOSE])),
                  max_size=8).map("".join)  # what an argument's string may hold, the call's own end tag included
_call = st.tuples(st.sampled_from(["get_weather", "f.x", "g-2"]),
                  st.dictionaries(st.sampled_from(["a", "b", "é"]),
                                  st.one_of(st.integers(), _value, st.lists(_value, max_size=2)), max_size=3))


@settings(max_examples=200, deadline=None)
@given(st.one_of(_text, st.just("")), st.lists(_call, max_size=3), st.lists(st.integers(1, 30), max_size=40),
       st.sampled_from(["whole", "in the arguments", "before the name"]))
def test_the_reader_finds_the_same_content_and_calls_however_the_text_is_cut(content, calls, cuts, end):
    body = "\n".join(f'{OPEN}\n{{"name": "{n}", "arguments": {json.dumps(a, ensure_ascii=False)}}}\n{CLOSE}'
                     for n, a in calls)
    text = (content + "\n" if content and calls else content) + body
    complete = end == "whole" or not calls
    if end == "in the arguments" and calls:
        text = text[:-len(CLOSE) - 3]  # as max_tokens would
    if end == "before the name" and calls:
        text = text[:text.rindex(OPEN) + len(OPEN) + 6]
    whole = read_calls(text)
    whole_calls = whole.calls
    whole_content = ("".join(whole.content) or None) if whole_calls else "".join(whole.content)
    reader, events, start = CallReader(), [], 0
    for n in cuts:
        events += reader.feed(text[start:start + n])
        start += n
    events += reader.feed(text[start:]) + reader.close()
    streamed = "".join(e.text for e in events if e.kind == "content")
    assert [(c.name, c.arguments) for c in reader.calls] == [(c.name, c.arguments) for c in whole_calls]
    assert streamed == "".join(reader.content) and (streamed or None if reader.calls else streamed) == whole_content
    assert [e.text for e in events if e.kind == "call"] == [c.name for c in reader.calls]
    assert [e.id for e in events if e.kind == "call"] == [c.id for c in reader.calls]
    for i, c in enumerate(reader.calls):
        assert "".join(e.text for e in events if e.kind == "arguments" and e.index == i) == c.arguments
    assert whole.cut == (not complete) and reader.cut == whole.cut
    if calls:
        named = calls[:-1] if end == "before the name" else calls
        assert [c.name for c in whole_calls] == [n for n, _ in named]
        done = calls if complete else calls[:-1]
        assert [json.loads(c.arguments) for c in whole_calls[:len(done)]] == [a for _, a in done]
        assert whole_content == (content.rstrip() or (None if named else ""))
    else:
        assert whole_content == content and not whole_calls


@pytest.fixture(scope="module")
def tool_server(tool_pair, tmp_path_factory):
    home = tmp_path_factory.mktemp("tool-server")
    server = ServeProcess(["-t", str(tool_pair.target.path), "-d", str(tool_pair.draft.path), "--ctx", "1024",
                           "--no-history"], home)
    yield server, openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=60)
    server.close()


def test_the_server_answers_tool_calls_whole_and_streamed_with_the_openai_client(tool_pair, tool_server):
    server, client = tool_server
    bias = {str(_open_token(tool_pair)): 6.0}
    ask = dict(model="t", messages=MESSAGES, tools=TOOLS, max_tokens=160, temperature=0, logit_bias=bias,
               parallel_tool_calls=False)
    whole = client.chat.completions.create(**ask)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    library = tool_pair.chat(MESSAGES, tools=TOOLS, parallel_tool_calls=False, max_tokens=160, logit_bias={
        _open_token(tool_pair): 6.0}, method="plain")
    assert choice.message.content == library.content and call.function.arguments == library.tool_calls[0].arguments

    chunks = list(client.chat.completions.create(**ask, stream=True))
    calls: dict[int, dict] = {}
    for c in chunks:
        for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            got = calls.setdefault(d.index, {"id": d.id, "name": d.function.name, "arguments": ""})
            got["arguments"] += d.function.arguments or ""
            assert d.id in (None, got["id"])
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == choice.message.content
    assert list(calls.values()) == [{"id": calls[0]["id"], "name": call.function.name,
                                     "arguments": call.function.arguments}]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.tool_calls) > 2  # the arguments, in pieces

    echoed = choice.message.model_dump(exclude_none=True)
    echoed["tool_calls"][0]["index"] = 0  # as a client that put the call together from the deltas keeps it
    answered = client.chat.completions.create(model="t", tools=TOOLS, tool_choice={"type": "function", "function": {
        "name": "get_time"}}, max_tokens=120, temperature=0, messages=[
        *MESSAGES, echoed, {"role": "tool", "tool_call_id": call.id, "name": call.function.name, "content": "sunny"}])
    names = [c.function.name for c in answered.choices[0].message.tool_calls]
    assert names and set(names) == {"get_time"}  # a named function, as often as the model calls it


@pytest.mark.parametrize("body,param,needle", [
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "must be none, auto, required"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "'nope', which is not among the tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]}, "tools", "parameters must be"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": TOOLS, "response_format": {"type": "json_object"}}, None, "cannot also follow JSON mode"),
])
def test_bad_tool_requests_are_400s_naming_the_field(tool_server, body, param, needle):
    server, _ = tool_server
    status, reply, _ = server.post("/v1/chat/completions", json.dumps({"messages": MESSAGES, **body}).encode())
    assert status == 400 and needle in reply["error"]["message"], reply
    assert param is None or reply["error"]["param"] == param
    status, reply, _ = server.post("/v1/completions", json.dumps({"prompt": "hi", "tools": TOOLS}).encode())
    assert status == 400 and reply["error"]["param"] == "tools" and "chat/completions" in reply["error"]["message"]
    status, reply, _ = server.post("/v1/chat/completions", json.dumps({"messages": [
        {"role": "tool", "content": "x"}]}).encode())
    assert status == 400 and "tool_call_id" in reply["error"]["message"]


def test_generate_takes_a_tools_file_and_prints_the_calls(tool_pair, tmp_path):
    from clirun import run_cli

    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    base = ["generate", "-t", str(tool_pair.target.path), "--message", MESSAGES[0]["content"], "-n", "60",
            "--method", "plain", "--tools", str(tools), "--tool-choice", "get_time", "--no-history"]
    r = run_cli(base)
    assert r.exit_code == 0, r.output
    first = json.loads(r.stdout.splitlines()[1])  # the reply's content line (empty: it is only calls), then calls
    assert r.stdout.splitlines()[0] == "" and first["function"]["name"] == "get_time"
    jsonschema.validate(json.loads(first["function"]["arguments"]), TIME)
    whole = json.loads(run_cli([*base, "--json"]).stdout)
    assert whole["tool_calls"][0]["function"] == first["function"] and whole["content"] is None
    (tmp_path / "bad.json").write_text('{"type": "function"}')
    r = run_cli([*base[:-5], "--tools", str(tmp_path / "bad.json")])
    assert r.exit_code == 2 and "must hold a JSON list of tools" in r.output
    r = run_cli(["generate", "-t", str(tool_pair.target.path), "-p", "hi", "--tools", str(tools)])
    assert r.exit_code == 2 and "go with --message" in r.output
