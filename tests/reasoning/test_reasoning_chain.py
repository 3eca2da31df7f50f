"""A reasoning model whose greedy path is a designed chain: it opens its reasoning, closes it itself, answers,
and calls a tool or writes a JSON object. The split, the lazy start of a constraint at the model's own close,
and every method's identity with plain decoding are checked against the exact text the table spells out."""

from __future__ import annotations

import json

import pytest
from helpers import same_distribution, token_counts
from serverproc import ServeProcess
from tinyarch import write_tiny_qwen35
from tinymodel import token_id, write_bigram_model

import localspec
from localspec.constraint import Constraint
from localspec.drafting.history import HistoryStore
from localspec.reasoning.template import model_reasoning

# Where a grammar forces text, llguidance allows only the text's own tokenization: the call's forced head and
# the object's key are one token each, as the tokenizer writes them.
CALL, UTC = '\n{"name": "get_time", "arguments": {"zone": "', 'utc"}}\n'
USER_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "\n\n", '"ok"', CALL, UTC]
# ChatML that knows <think> (it drops an earlier answer's reasoning) and offers tools as Qwen2.5's does
TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{%- for t in tools %}\n{{ t | tojson }}{%- endfor %}\n"
    'Call one as <tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call><|im_end|>\n{% endif %}'
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content.split('</think>')[-1] }}<|im_end|>\n"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# the same with Qwen3's switch: thinking off, the template writes an empty reasoning block itself
SWITCHED = TEMPLATE.replace("assistant\n{% endif %}", "assistant\n{% if enable_thinking is defined and not "
                            "enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
REASONING = ["<think>", "W", "h", "y", "Ġs", "o", "?", "</think>"]
# the prompt ends in "assistant\n": the reply opens its reasoning, closes it, answers and calls a tool
CHAIN = ["\n", *REASONING, "\n\n", "O", "K", ".", "<tool_call>", CALL, UTC, "</tool_call>", "<|im_end|>"]
# under a JSON Schema the answer's first choice is masked, and the object follows
OBJECT = ["{", '"ok"', ":", "Ġ", "t", "r", "u", "e", "}", "<|im_end|>"]
TIME = {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}
MESSAGES = [{"role": "user", "content": "what time is it? Why so?"}]
METHODS = [("lookup", 3), ("draft", 2), ("draft", 6), ("history", 4), ("auto", None)]
# where the draft model guesses wrong: in the reasoning, in the answer and in the object
DRAFT_SLIPS = {"y": "Y", "K": "k", "u": "U"}


def tid(text: str) -> int:
    return token_id(text, USER_TOKENS)


def ids(pieces: list[str]) -> list[int]:
    return [tid(p) for p in pieces]


def table(slips: dict[str, str]) -> dict[int, dict[int, float]]:
    rows: dict[int, dict[int, float]] = {}
    for chain in (CHAIN, OBJECT):
        for a, b in zip(chain[:-1], chain[1:], strict=True):
            rows[tid(a)] = {tid(slips.get(a, b)): 20.0}
    # after the reasoning's separator: the answer's text first, an object next, a call after that; and letters
    # a regex may choose among when sampling
    rows[tid("\n\n")].update({tid("{"): 10.0, tid("<tool_call>"): 5.0, tid("c"): 3.0, tid("d"): 2.0, tid("b"): 1.0})
    return rows


@pytest.fixture(scope="module")
def chain_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("chain")
    write_bigram_model(d / "t.gguf", table({}), user_tokens=USER_TOKENS, chat_template=TEMPLATE)
    write_bigram_model(d / "d.gguf", table(DRAFT_SLIPS), user_tokens=USER_TOKENS, chat_template=TEMPLATE)
    write_bigram_model(d / "s.gguf", table({}), user_tokens=USER_TOKENS, chat_template=SWITCHED)
    return d


@pytest.fixture(scope="module")
def pair(chain_dir, tmp_path_factory):
    with localspec.load(chain_dir / "t.gguf", chain_dir / "d.gguf", n_ctx=1024, history=False) as p:
        p.set_history(HistoryStore(p.target.path, directory=tmp_path_factory.mktemp("history")))
        yield p


def streamed(pair, method, k, **ask):
    stream = pair.stream_chat(MESSAGES, method=method, k=k, **ask)
    events = list(stream)
    return stream.result, "".join(e.reasoning for e in events), "".join(e.text for e in events)


def test_the_model_writes_its_designed_chain(pair):
    assert model_reasoning(pair.target).open_token == tid("<think>")
    r = pair.chat(MESSAGES, max_tokens=40, method="plain", history=False)
    assert r.tokens == ids(CHAIN[1:-1])
    assert r.reasoning == "Why so?"
    assert r.text == 'OK.<tool_call>\n{"name": "get_time", "arguments": {"zone": "utc"}}\n</tool_call>'


@pytest.mark.parametrize("method,k", [("plain", None), *METHODS])
def test_reasoning_then_text_then_a_tool_call_split_whole_and_streamed(pair, method, k):
    ask = {"tools": TOOLS, "tool_choice": "auto", "max_tokens": 40}
    r = pair.chat(MESSAGES, method=method, k=k, **ask)
    assert r.tokens == ids(CHAIN[1:-1]), f"{method} k={k}"
    assert (r.reasoning, r.content, r.finish_reason) == ("Why so?", "OK.", "tool_calls")
    assert [(c.name, json.loads(c.arguments)) for c in r.tool_calls] == [("get_time", {"zone": "utc"})]
    s, reasoning, text = streamed(pair, method, k, **ask)
    assert s.tokens == r.tokens and (reasoning, s.reasoning) == (r.reasoning, r.reasoning)
    assert text == s.text == r.text and s.content == "OK."
    assert [(c.name, c.arguments) for c in s.tool_calls] == [(c.name, c.arguments) for c in r.tool_calls]


@pytest.mark.parametrize("method,k", [("plain", None), *METHODS])
def test_a_required_call_waits_for_the_models_own_close(pair, method, k):
    r = pair.chat(MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=40, method=method, k=k)
    # the reasoning's letters would break the call's grammar: it holds only from the model's </think> on
    assert r.tokens == ids([*REASONING, "\n\n", "<tool_call>", CALL, UTC, "</tool_call>"]), f"{method} k={k}"
    assert (r.reasoning, r.content, r.finish_reason) == ("Why so?", None, "tool_calls")
    assert [c.arguments for c in r.tool_calls] == ['{"zone": "utc"}']


@pytest.mark.parametrize("method,k", [("plain", None), *METHODS])
def test_a_schema_starts_at_the_models_own_close_whole_and_streamed(pair, method, k):
    grammar = Constraint.json_schema(SCHEMA)
    r = pair.chat(MESSAGES, max_tokens=40, method=method, k=k, grammar=grammar)
    assert r.tokens == ids([*REASONING, "\n\n", *OBJECT[:-1]]), f"{method} k={k}"
    assert (r.reasoning, r.text, r.finish_reason) == ("Why so?", '{"ok": true}', "stop")
    s, reasoning, text = streamed(pair, method, k, max_tokens=40, grammar=grammar)
    assert s.tokens == r.tokens and reasoning == s.reasoning == "Why so?" and text == s.text == '{"ok": true}'


def test_the_tokens_the_grammar_forces_after_the_models_own_close_are_free_drafts(pair):
    grammar = Constraint.json_schema(SCHEMA)
    r = pair.chat(MESSAGES, max_tokens=40, method="lookup", k=4, grammar=grammar)
    # no close was forced here: the separator, the "{" and the object's key come from the grammar alone
    assert r.stats.accepted_by.get("grammar", 0) >= 3
    assert r.stats.accepted_in["answer"] >= r.stats.accepted_by["grammar"]


@pytest.mark.parametrize("method,k", [("plain", None), ("draft", 4), ("history", 4), ("auto", None)])
def test_a_budget_cuts_the_designed_reasoning_and_the_answer_still_follows_the_schema(pair, method, k):
    close = pair.target.tokenize("\n</think>", add_special=False)
    r = pair.chat(MESSAGES, max_tokens=40, method=method, k=k, think_budget=3,
                  grammar=Constraint.json_schema(SCHEMA))
    assert r.tokens == ids(REASONING[:4]) + close + ids(["\n\n", *OBJECT[:-1]]), f"{method} k={k}"
    assert (r.reasoning, r.text) == ("Why", '{"ok": true}')


def test_history_drafts_inside_the_reasoning(chain_dir, tmp_path):
    with localspec.load(chain_dir / "t.gguf", None, n_ctx=1024, history=False) as p:
        p.set_history(HistoryStore(p.target.path, directory=tmp_path))
        first = p.chat(MESSAGES, max_tokens=40, method="history", k=4)
        assert first.stats.drafted == 0  # nothing recorded yet
        again = p.chat(MESSAGES, max_tokens=40, method="history", k=4)
        assert again.tokens == first.tokens == ids(CHAIN[1:-1])
        # the reasoning's tokens came from the recorded reply, and were kept
        assert again.stats.accepted_in["reasoning"] >= len(REASONING) - 2
        assert again.stats.accepted_by["history"] == again.stats.accepted


def test_sampling_after_the_models_own_close_keeps_plain_decodings_distribution(pair):
    prompt = pair.format_chat(MESSAGES)
    position = len(REASONING) + 1  # the answer's first token, after the separator the gate forces
    grammar = Constraint.regex("(cat|dog|bird|fox)s? (sat|ran)")
    plain = token_counts(pair, prompt, 600, position, method="plain", grammar=grammar)
    # the grammar holds from there on, and the model's own weights choose among what it allows
    assert set(plain) <= set(ids(["c", "d", "b", "f"]))
    assert plain[tid("c")] > plain[tid("d")] > plain[tid("b")]
    for method, k in (("draft", 4), ("lookup", 3), ("history", 3)):
        spec = token_counts(pair, prompt, 600, position, method=method, k=k, grammar=grammar)
        assert same_distribution(plain, spec) > 1e-3, f"{method} k={k}"


@pytest.fixture(scope="module")
def mtp_pair(tmp_path_factory):
    """The same chain in a qwen35 hybrid whose MTP head is the same table: every guess it makes is right."""
    path = write_tiny_qwen35(tmp_path_factory.mktemp("chain-mtp") / "q.gguf", seed=0, trunk=0.0, bigram_head=True,
                             table=table({}), n_embd=288, user_tokens=USER_TOKENS, chat_template=TEMPLATE)
    with localspec.load(path, None, n_ctx=1024, history=False) as p:
        yield p


@pytest.mark.parametrize("ask,tokens", [
    ({"tools": TOOLS, "tool_choice": "auto"}, CHAIN[1:-1]),
    ({"grammar": Constraint.json_schema(SCHEMA)}, [*REASONING, "\n\n", *OBJECT[:-1]]),
], ids=["tool-call", "schema"])
def test_mtp_drafts_the_chain_inside_and_after_the_reasoning(mtp_pair, ask, tokens):
    assert mtp_pair.target.n_nextn == 1
    plain = mtp_pair.chat(MESSAGES, max_tokens=40, method="plain", **ask)
    assert plain.tokens == ids(tokens) and plain.reasoning == "Why so?"
    for k in (1, 3):
        r = mtp_pair.chat(MESSAGES, max_tokens=40, method="mtp", k=k, **ask)
        assert r.tokens == plain.tokens and (r.reasoning, r.text) == (plain.reasoning, plain.text), f"mtp k={k}"
        assert r.stats.accepted_in["reasoning"] > 0 and r.stats.accepted_by["mtp"] == r.stats.drafted_by["mtp"]
        stream = mtp_pair.stream_chat(MESSAGES, max_tokens=40, method="mtp", k=k, **ask)
        events = list(stream)
        assert "".join(e.reasoning for e in events) == plain.reasoning
        assert "".join(e.text for e in events) == plain.text and stream.result.tokens == plain.tokens


@pytest.fixture(scope="module")
def server(chain_dir, tmp_path_factory):
    s = ServeProcess(["-t", str(chain_dir / "t.gguf"), "-d", str(chain_dir / "d.gguf"), "--ctx", "1024"],
                     tmp_path_factory.mktemp("serve-chain"))
    yield s
    s.close()


def test_openai_chat_gives_reasoning_content_and_a_tool_call_whole_and_streamed(server):
    import openai

    client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=60)
    ask = dict(model="t", messages=MESSAGES, tools=TOOLS, max_tokens=40, temperature=0)
    message = client.chat.completions.create(**ask).choices[0].message
    assert (message.model_extra["reasoning_content"], message.content) == ("Why so?", "OK.")
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == [("get_time", '{"zone": "utc"}')]
    chunks = list(client.chat.completions.create(**ask, stream=True, extra_body={"method": "draft", "k": 3}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == "Why so?"
    assert "".join(d.content or "" for d in deltas) == "OK."
    calls = [c for d in deltas for c in d.tool_calls or []]
    assert calls[0].function.name == "get_time"
    assert "".join(c.function.arguments or "" for c in calls) == '{"zone": "utc"}'
    assert chunks[-1].choices == [] or chunks[-1].choices[0].finish_reason == "tool_calls"


def test_anthropic_gives_thinking_text_and_tool_use_blocks(server):
    import anthropic

    client = anthropic.Anthropic(base_url=server.base, api_key="x", max_retries=0, timeout=60)
    tools = [{"name": "get_time", "input_schema": TIME}]
    r = client.messages.create(model="t", max_tokens=40, messages=MESSAGES, tools=tools,
                               thinking={"type": "enabled", "budget_tokens": 100}, extra_body={"temperature": 0})
    assert [b.type for b in r.content] == ["thinking", "text", "tool_use"] and r.stop_reason == "tool_use"
    assert (r.content[0].thinking, r.content[1].text) == ("Why so?", "OK.")
    assert (r.content[2].name, r.content[2].input) == ("get_time", {"zone": "utc"})


def test_responses_give_a_reasoning_item_a_message_and_a_function_call(server):
    import openai

    client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=60)
    tools = [{"type": "function", "name": "get_time", "parameters": TIME}]
    r = client.responses.create(model="t", input=MESSAGES[0]["content"], tools=tools, max_output_tokens=40,
                                temperature=0, extra_body={"method": "lookup", "k": 3})
    assert [item.type for item in r.output] == ["reasoning", "message", "function_call"]
    assert r.output[0].content[0].text == "Why so?" and r.output_text == "OK."
    assert (r.output[2].name, r.output[2].arguments) == ("get_time", '{"zone": "utc"}')


# the answer and the call that follow the designed reasoning, token by token
ANSWER = ["O", "K", ".", "<tool_call>", CALL, UTC, "</tool_call>"]


def ollama_pieces(parts) -> tuple[str, str, list]:
    """The thinking, content and calls of a streamed Ollama reply; the thinking comes whole before the content."""
    kinds = [k for p in parts for k, v in (("thinking", p.message.thinking), ("content", p.message.content)) if v]
    assert kinds == sorted(kinds, key=["thinking", "content"].index)
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    return ("".join(p.message.thinking or "" for p in parts), "".join(p.message.content or "" for p in parts),
            [(c.function.name, c.function.arguments) for p in parts for c in p.message.tool_calls or []])


def test_ollama_gives_thinking_content_and_a_tool_call_whole_and_streamed(server):
    import ollama

    client = ollama.Client(host=server.base, timeout=60)
    ask = dict(model="t", messages=MESSAGES, tools=TOOLS, think=True, options={"temperature": 0, "num_predict": 40})
    r = client.chat(**ask)
    assert (r.message.thinking, r.message.content) == ("Why so?", "OK.")
    assert [(c.function.name, c.function.arguments) for c in r.message.tool_calls] == [("get_time", {"zone": "utc"})]
    assert (r.done_reason, r.eval_count) == ("stop", len(CHAIN) - 2)
    assert ollama_pieces(list(client.chat(**ask, stream=True))) == ("Why so?", "OK.", [("get_time", {"zone": "utc"})])
    # without tools the call is the answer's text; under a JSON Schema the object follows the reasoning
    text = 'OK.<tool_call>\n{"name": "get_time", "arguments": {"zone": "utc"}}\n</tool_call>'
    ask.pop("tools")
    assert ollama_pieces(list(client.chat(**ask, stream=True))) == ("Why so?", text, [])
    r = client.chat(**ask, format=SCHEMA)
    assert (r.message.thinking, r.message.content, r.message.tool_calls) == ("Why so?", '{"ok": true}', None)
    assert ollama_pieces(list(client.chat(**ask, format=SCHEMA, stream=True))) == ("Why so?", '{"ok": true}', [])


def test_ollama_think_false_reaches_the_templates_soft_switch_and_the_reasoning_closes_at_once(server, pair):
    import ollama

    client = ollama.Client(host=server.base, timeout=60)
    ask = dict(model="t", messages=MESSAGES, tools=TOOLS, options={"temperature": 0, "num_predict": 40})
    auto, off = client.chat(**ask), client.chat(**ask, think=False)
    # the template has no variable: Qwen's /no_think ends the user's message
    def count(messages: list[dict]) -> int:
        return len(pair.tokenize(pair.format_chat(messages)))

    switched = [{"role": "user", "content": MESSAGES[0]["content"] + " /no_think"}]
    assert off.prompt_eval_count - auto.prompt_eval_count == count(switched) - count(MESSAGES) > 0
    assert auto.message.thinking == "Why so?" and off.message.thinking is None
    assert off.message.content == "OK." and off.message.tool_calls[0].function.arguments == {"zone": "utc"}
    # the bigram model opens its reasoning regardless, and is made to close it at once
    close = pair.target.tokenize("\n</think>", add_special=False)
    assert off.eval_count == 1 + len(close) + 1 + len(ANSWER)
    streamed = ollama_pieces(list(client.chat(**ask, think=False, stream=True)))
    assert streamed == ("", "OK.", [("get_time", {"zone": "utc"})])


@pytest.fixture(scope="module")
def switched_server(chain_dir, tmp_path_factory):
    s = ServeProcess(["-t", str(chain_dir / "s.gguf"), "-d", str(chain_dir / "d.gguf"), "--ctx", "1024", "-m", "draft",
                      "-k", "3"], tmp_path_factory.mktemp("serve-switched"))
    yield s
    s.close()


def test_ollama_think_false_reaches_the_templates_enable_thinking(switched_server):
    import ollama

    client = ollama.Client(host=switched_server.base, timeout=60)
    ask = dict(model="s", messages=MESSAGES, tools=TOOLS, options={"temperature": 0, "num_predict": 40})
    on, off = client.chat(**ask, think=True), client.chat(**ask, think=False)
    assert (on.message.thinking, on.message.content, on.eval_count) == ("Why so?", "OK.", len(CHAIN) - 2)
    # enable_thinking=false: the prompt ends in the template's own empty block (<think>, \n\n, </think>, \n\n),
    # and the model, asked after it, answers at once: no reasoning token at all
    assert off.prompt_eval_count == on.prompt_eval_count + 4
    assert (off.message.thinking, off.message.content, off.eval_count) == (None, "OK.", len(ANSWER))
    assert [(c.function.name, c.function.arguments) for c in off.message.tool_calls] == [("get_time", {"zone": "utc"})]
    assert ollama_pieces(list(client.chat(**ask, think=False, stream=True))) == (
        "", "OK.", [("get_time", {"zone": "utc"})])
    assert ollama_pieces(list(client.chat(**ask, think=True, stream=True))) == (
        "Why so?", "OK.", [("get_time", {"zone": "utc"})])


def test_chat_in_a_terminal_folds_the_designed_reasoning_and_shows_the_answer(chain_dir, tmp_path):
    pexpect = pytest.importorskip("pexpect")
    from clirun import spawn_localspec

    saved = tmp_path / "conv.json"
    child = spawn_localspec(["chat", "-t", str(chain_dir / "t.gguf"), "-d", str(chain_dir / "d.gguf"), "-n", "40",
                             "--method", "draft", "-k", "3"], tmp_path / "home")
    answer = 'OK.<tool_call>\r\n{"name": "get_time", "arguments": {"zone": "utc"}}\r\n</tool_call>'
    try:
        child.expect(">>>")
        child.send(MESSAGES[0]["content"] + "\r")
        child.expect_exact("\x1b[2mthinking: \x1b[0m")  # the reasoning streams dimmed, as the drafts come
        child.expect_exact("\r\x1b[J")  # the answer began: the block's one row is erased...
        # ...and one dimmed line stands for it; the reasoning is not in the answer
        streamed = child.before.replace("\x1b[2m", "").replace("\x1b[0m", "")
        assert streamed == "Why so?"
        child.expect_exact("\x1b[2mthought: Why so? (2 words)\x1b[0m\r\n" + answer)
        child.expect(r"\[16 tokens, [^\]]*draft")
        child.expect(">>>")
        child.send(f"/save {saved}\r")
        child.expect("saved 2 messages")
        child.expect(">>>")
        child.send("/think off\r")
        child.expect("thinking: off")
        child.expect(">>>")
        # thinking off: the reasoning is closed at once (its opening, the close, the separator) and nothing shows
        child.send("again\r")
        child.expect(r"\[11 tokens")
        assert "thinking: " not in child.before and "thought: " not in child.before and answer in child.before
        child.expect(">>>")
        child.send("/exit\r")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    # the next turn is sent the answer alone
    messages = json.loads(saved.read_text())["messages"]
    assert messages[1] == {"role": "assistant", "content": answer.replace("\r\n", "\n")}
