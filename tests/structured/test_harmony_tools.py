"""GPT-OSS's tool calls: harmony messages on the commentary channel, read back as calls (both header orders,
whole and in any chunks), constrained after the analysis channel under "required" and a function's name,
with the analysis as the reply's reasoning, exact under every method, and served as chat's tool_calls."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from chatdefs import HARMONY_TOKENS, SCHEMAS, TOOLS
from chatdefs import THINKING_METHODS as METHODS
from hypothesis import given
from hypothesis import strategies as st
from serverproc import ServeProcess
from tinymodel import write_tiny_model

import localspec
from localspec.structured.call_reader import CallReader, read_calls
from localspec.structured.tool_use import call_format, can_call

MESSAGES = [{"role": "user", "content": "in the end, in the end, in the"}]
# A harmony template of our own, as GPT-OSS's writes it: the tools in a developer message, an earlier call as
# a commentary message to the function, its answer from the function, and the reply opening its analysis.
TEMPLATE = (
    "{% if tools %}<|start|>developer<|message|># Tools\n"
    "{% for t in tools %}{{ t['function']['name'] }}\n{% endfor %}<|end|>{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' and 'tool_calls' in m and m['tool_calls'] %}"
    "<|start|>assistant to=functions.{{ m['tool_calls'][0]['function']['name'] }}<|channel|>commentary json"
    "<|message|>{{ m['tool_calls'][0]['function']['arguments'] | tojson }}<|call|>"
    "{% elif m['role'] == 'assistant' %}<|start|>assistant<|channel|>final<|message|>{{ m['content'] }}<|end|>"
    "{% elif m['role'] == 'tool' %}<|start|>functions.tool to=assistant<|channel|>commentary<|message|>"
    "{{ m['content'] }}<|end|>"
    "{% else %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant<|channel|>analysis<|message|>{% endif %}"
)
CALL_TOKENS = [*HARMONY_TOKENS, "<|constrain|>"]
WEATHER_CALL = '{"city": "Paris", "days": 2}'


@pytest.fixture(scope="module")
def harmony_pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("harmony-tools")
    for name, noise in (("t.gguf", 0.0), ("d.gguf", 0.35)):
        write_tiny_model(d / name, seed=0, noise=noise, control_tokens=CALL_TOKENS, chat_template=TEMPLATE)
    with localspec.load(d / "t.gguf", d / "d.gguf", n_ctx=1024, history=False) as pair:
        yield pair


READS = [
    # the recipient in the channel's header, as GPT-OSS writes a call
    (f"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{WEATHER_CALL}",
     "", [("get_weather", WEATHER_CALL)]),
    # the recipient in the role's header (the <|start|>assistant before it is the reasoning reader's)
    (f"to=functions.get_weather<|channel|>commentary json<|message|>{WEATHER_CALL}", "",
     [("get_weather", WEATHER_CALL)]),
    ('<|channel|>analysis to=functions.get_time<|message|>{"zone": "utc"}', "", [("get_time", '{"zone": "utc"}')]),
    # a preamble, then the call
    ('Checking.<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{"zone": "cet"}',
     "Checking.", [("get_time", '{"zone": "cet"}')]),
    # not calls: a recipient within the text, a header that never reaches its message
    ("I sent it to=functions.x later", "I sent it to=functions.x later", []),
    ("to=functions.x and then\nmore", "to=functions.x and then\nmore", []),
]


@pytest.mark.parametrize("text,content,calls", READS)
def test_the_reader_reads_harmony_calls_in_both_header_orders(text, content, calls):
    reader = read_calls(text)
    assert "".join(reader.content) == content
    assert [(c.name, c.arguments) for c in reader.calls] == calls
    assert not reader.cut


@given(st.sampled_from(READS), st.lists(st.integers(0, 120)))
def test_a_harmony_call_reads_the_same_however_the_text_is_cut(case, cuts):
    text, content, calls = case
    reader = CallReader()
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    events = [e for a, b in zip(bounds[:-1], bounds[1:], strict=True) for e in reader.feed(text[a:b])]
    events += reader.close()
    assert "".join(e.text for e in events if e.kind == "content") == content
    assert [e.text for e in events if e.kind == "call"] == [name for name, _ in calls]
    assert "".join(e.text for e in events if e.kind == "arguments") == "".join(args for _, args in calls)


def test_a_harmony_call_cut_in_its_header_gives_nothing_and_says_so():
    reader = read_calls("<|channel|>commentary to=functions.get_wea")
    assert reader.calls == [] and "".join(reader.content) == "" and reader.cut
    cut = read_calls('<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{"zone": "u')
    assert [(c.name, c.arguments) for c in cut.calls] == [("get_time", '{"zone": "u')] and cut.cut


def test_a_harmony_template_may_be_offered_tools(harmony_pair, tiny_pair):
    assert call_format(TEMPLATE) == "harmony" and can_call(harmony_pair.target)
    assert not can_call(tiny_pair.target)
    earlier = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": WEATHER_CALL}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rain"}]
    text = harmony_pair.format_chat(earlier, tools=TOOLS)
    assert f"to=functions.get_weather<|channel|>commentary json<|message|>{WEATHER_CALL}<|call|>" in text
    # "none" shows no tools and constrains nothing; "auto" leaves the reply free, its calls read as written
    none = harmony_pair.chat(MESSAGES, tools=TOOLS, tool_choice="none", max_tokens=12, method="plain")
    assert none.tokens == harmony_pair.chat(MESSAGES, max_tokens=12, method="plain").tokens
    auto = harmony_pair.chat(MESSAGES, tools=TOOLS, max_tokens=24, method="plain", think_budget=3)
    assert harmony_pair.chat(MESSAGES, tools=TOOLS, max_tokens=24, method="draft", k=4,
                             think_budget=3).tokens == auto.tokens


@pytest.mark.parametrize("choice,name", [("required", "get_weather"), ("get_time", "get_time")])
def test_a_harmony_reply_calls_after_its_analysis_under_every_method(harmony_pair, choice, name):
    pair = harmony_pair
    ask = {"tools": TOOLS, "tool_choice": choice, "max_tokens": 150, "think_budget": 3}
    plain = pair.chat(MESSAGES, method="plain", **ask)
    assert plain.finish_reason == "tool_calls" and plain.content is None
    assert [c.name for c in plain.tool_calls] == [name]
    jsonschema.validate(json.loads(plain.tool_calls[0].arguments), SCHEMAS[name])
    # the analysis is the reasoning, closed after its budget; the call is its own commentary message
    header = pair.target.tokenize(f"<|end|><|start|>assistant<|channel|>commentary to=functions.{name} "
                                  "<|constrain|>json<|message|>", add_special=False)
    assert plain.tokens[3:3 + len(header)] == header
    assert plain.reasoning is not None and plain.reasoning == plain.reasoning.strip()
    assert 3 < plain.reasoning_tokens < 3 + len(header)  # the analysis and the message's start, not the call
    for method, k in METHODS:
        r = pair.chat(MESSAGES, method=method, k=k, **ask)
        assert r.tokens == plain.tokens, f"{method} k={k}"
        assert [(c.name, c.arguments) for c in r.tool_calls] == [(name, plain.tool_calls[0].arguments)]
    # streamed, as the servers read it: the answer's text through a CallReader
    stream = pair.stream_chat(MESSAGES, method="draft", k=4, **ask)
    reader, events = CallReader(), []
    for ev in stream:
        events += reader.feed(ev.text)
    events += reader.close()
    assert [e.text for e in events if e.kind == "call"] == [name]
    assert "".join(e.text for e in events if e.kind == "arguments") == plain.tool_calls[0].arguments
    assert not any(e.kind == "content" for e in events)
    # thinking off: the analysis closes at once and the call follows
    off = pair.chat(MESSAGES, method="plain", **{**ask, "think_budget": None, "think": False})
    assert off.reasoning == "" and [c.name for c in off.tool_calls] == [name]


def test_the_server_answers_a_harmony_call_as_tool_calls_with_the_analysis_apart(harmony_pair, tmp_path_factory):
    pair = harmony_pair
    want = pair.chat(MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=150, think_budget=3, method="plain")
    server = ServeProcess(["-t", str(pair.target.path), "-d", "none", "--ctx", "1024", "--no-history"],
                          tmp_path_factory.mktemp("harmony-serve"))
    try:
        client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=60)
        ask = dict(model="t", messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=150,
                   temperature=0, extra_body={"method": "plain", "think_budget": 3})
        choice = client.chat.completions.create(**ask).choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        [call] = choice.message.tool_calls
        assert (call.function.name, call.function.arguments) == (want.tool_calls[0].name,
                                                                 want.tool_calls[0].arguments)
        assert choice.message.model_extra["reasoning_content"] == want.reasoning
        chunks = [c for c in client.chat.completions.create(**ask, stream=True) if c.choices]
        deltas = [d for c in chunks for d in c.choices[0].delta.tool_calls or []]
        assert [d.function.name for d in deltas if d.function.name] == [call.function.name]
        assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == ""
        assert "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
                       for c in chunks) == want.reasoning
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
    finally:
        server.close()
