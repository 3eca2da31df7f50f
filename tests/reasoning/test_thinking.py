"""Reasoning models: the reply split into reasoning and answer, thinking switched and budgeted, and a
constraint that holds only from the end of the reasoning, exactly as plain decoding gives it."""

from __future__ import annotations

import json

import jsonschema
import pytest
from chatdefs import HARMONY_TOKENS, OPENS, THINK_TOKENS, THINKING_METHODS
from helpers import same_distribution, token_counts
from hypothesis import given, settings
from hypothesis import strategies as st
from tinymodel import write_tiny_model

import localspec
from localspec.constraint import Constraint
from localspec.reasoning.template import model_reasoning

# ChatML that knows <think> but has no switch of its own: Qwen's soft switch applies.
SOFT = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'].split('</think>')[-1] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}
MESSAGES = [{"role": "user", "content": "in the end, in the end, in the"}]
METHODS = THINKING_METHODS


@pytest.fixture(scope="module")
def think_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("think")
    for name, template in (("opens", OPENS), ("soft", SOFT)):
        for role, noise in (("t", 0.0), ("d", 0.35)):
            write_tiny_model(d / f"{name}-{role}.gguf", seed=0, noise=noise, user_tokens=THINK_TOKENS,
                             chat_template=template)
    return d


@pytest.fixture(scope="module")
def opens(think_dir):
    with localspec.load(think_dir / "opens-t.gguf", think_dir / "opens-d.gguf", n_ctx=1024, history=False) as pair:
        yield pair


@pytest.fixture(scope="module")
def soft(think_dir):
    with localspec.load(think_dir / "soft-t.gguf", think_dir / "soft-d.gguf", n_ctx=1024, history=False) as pair:
        yield pair


def close_tokens(pair) -> list[int]:
    return pair.target.tokenize("\n</think>", add_special=False)


def index_of(tokens: list[int], part: list[int]) -> int:
    return next(i for i in range(len(tokens)) if tokens[i:i + len(part)] == part)


def test_a_model_reasons_only_where_its_template_writes_reasoning(tiny_pair, opens, soft):
    assert model_reasoning(tiny_pair.target) is None
    r = tiny_pair.chat(MESSAGES, max_tokens=12, method="plain", think=False, think_budget=2)
    assert r.reasoning is None and "reasoning" not in r.to_dict()
    assert r.text == tiny_pair.chat(MESSAGES, max_tokens=12, method="plain").text  # switches change nothing
    assert model_reasoning(opens.target).fmt.name == model_reasoning(soft.target).fmt.name == "think"


def test_a_budget_closes_the_reasoning_as_plain_decoding_with_the_same_forcing(opens):
    budget, close = 6, close_tokens(opens)
    prompt = opens.chat_tokens(MESSAGES)
    head = opens.generate(prompt, max_tokens=budget, method="plain").tokens
    assert len(head) == budget and "</think>" not in opens.target.detokenize(head)
    rest = opens.generate(prompt + head + close, max_tokens=20, method="plain").tokens
    expected = head + close + rest
    for method, k in [("plain", None), *METHODS]:
        r = opens.chat(MESSAGES, max_tokens=len(expected), method=method, k=k, think_budget=budget)
        assert r.tokens == expected, f"{method} k={k}"
        assert r.reasoning == opens.target.detokenize(head).strip()
        assert r.text == opens.target.detokenize(rest).lstrip()


def test_the_reply_streams_split_as_it_finishes(opens):
    stream = opens.stream_chat(MESSAGES, max_tokens=24, method="draft", k=4, think_budget=5)
    events = list(stream)
    r = stream.result
    assert r.reasoning and "".join(e.reasoning for e in events) == r.reasoning
    assert "".join(e.text for e in events) == r.text and "think>" not in r.text + r.reasoning


def test_a_schema_holds_only_after_the_reasoning_and_every_method_matches_plain(opens):
    grammar = Constraint.json_schema(SCHEMA)
    plain = opens.chat(MESSAGES, max_tokens=40, method="plain", think_budget=4, grammar=grammar)
    assert plain.finish_reason == "stop" and plain.reasoning is not None
    jsonschema.validate(json.loads(plain.text), SCHEMA)
    free = opens.chat(MESSAGES, max_tokens=4, method="plain")
    assert plain.tokens[:4] == free.tokens  # the reasoning is the model's own, unconstrained
    for method, k in METHODS:
        r = opens.chat(MESSAGES, max_tokens=40, method=method, k=k, think_budget=4, grammar=grammar)
        assert r.tokens == plain.tokens, f"{method} k={k}"
    # the forced close, the separator and the tokens the answer's grammar forces (the object's key) are free drafts
    r = opens.chat(MESSAGES, max_tokens=40, method="lookup", k=4, think_budget=4, grammar=grammar)
    separator, key = (opens.target.tokenize(t, add_special=False) for t in ("\n\n", '{"ok": '))
    assert r.text.startswith('{"ok": ')
    assert r.stats.accepted_by["grammar"] >= len(close_tokens(opens)) + len(separator) + len(key)


def test_without_a_budget_the_constraint_waits_for_the_reasoning_to_end(opens):
    grammar = Constraint.json_schema(SCHEMA)
    free = opens.chat(MESSAGES, max_tokens=30, method="plain")
    r = opens.chat(MESSAGES, max_tokens=30, method="draft", k=4, grammar=grammar)
    end = opens.target.tokenize("</think>", add_special=False)
    cut = index_of(free.tokens + end, end)
    assert r.tokens[:cut] == free.tokens[:cut]


@pytest.mark.parametrize("constrained", [False, True])
def test_sampling_across_the_forced_close_keeps_plain_decodings_distribution(opens, constrained):
    prompt = opens.format_chat(MESSAGES)
    # the answer's first token, after two reasoning tokens, the close and (before a constraint) the separator
    position = 2 + len(close_tokens(opens))
    extra = {}
    if constrained:
        position += len(opens.target.tokenize("\n\n", add_special=False))
        extra["grammar"] = Constraint.regex("(cat|dog|bird|fox)s? (sat|ran)")
    plain = token_counts(opens, prompt, 1000, position, method="plain", think_budget=2, **extra)
    spec = token_counts(opens, prompt, 1000, position, method="draft", k=4, think_budget=2, **extra)
    assert len(plain) > 1  # a position where sampling has a choice
    if constrained:
        assert {opens.target.detokenize([t])[:1] for t in plain} <= set("cdbf")  # the grammar holds there
    assert same_distribution(plain, spec) > 1e-3


def test_thinking_off_reaches_the_template_variable(opens):
    r = opens.chat(MESSAGES, max_tokens=8, method="plain", think=False)
    prompt = opens.target.detokenize(r.prompt_tokens)
    assert prompt.endswith("<think>\n\n</think>\n\n")
    assert r.reasoning in (None, "")
    on = opens.chat(MESSAGES, max_tokens=8, method="plain", think=True)
    assert opens.target.detokenize(on.prompt_tokens).endswith("<think>\n") and on.reasoning is not None


def test_thinking_off_without_a_variable_is_the_soft_switch_and_a_closed_reasoning(soft):
    r = soft.chat(MESSAGES, max_tokens=8, method="plain", think=False)
    assert "the /no_think\nassistant" in soft.target.detokenize(r.prompt_tokens)
    on = soft.chat(MESSAGES, max_tokens=8, method="plain", think=True)
    assert "the /think\nassistant" in soft.target.detokenize(on.prompt_tokens)
    # a reply that opens its reasoning under think=False is made to close it at once
    think = soft.target.tokenize("<think>", add_special=False)
    forced = soft.generate(soft.format_chat(MESSAGES) + "<think>", max_tokens=8, method="plain", think=False)
    assert forced.tokens[:len(close_tokens(soft))] == close_tokens(soft) and forced.reasoning == ""
    assert think  # the vocabulary has the marker as one token


def test_a_template_variable_the_renderer_sets_is_refused(opens):
    with pytest.raises(localspec.ConfigError, match="'messages' is set by localspec"):
        opens.chat(MESSAGES, max_tokens=2, template_vars={"messages": []})


def test_generate_json_gives_both_fields_and_the_flags_reach_the_options(think_dir):
    from clirun import run_cli

    model = str(think_dir / "opens-t.gguf")
    r = run_cli(["generate", "-t", model, "-d", "none", "--message", "hi", "-n", "16", "--method", "plain",
                 "--think-budget", "3", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert isinstance(out["reasoning"], str) and "think>" not in out["text"] + out["reasoning"]
    off = run_cli(["generate", "-t", model, "-d", "none", "--message", "hi", "-n", "4", "--no-think", "--json"])
    assert off.exit_code == 0 and json.loads(off.stdout).get("reasoning") in (None, "")
    plain = run_cli(["generate", "-t", model, "-d", "none", "--message", "hi", "-n", "16", "--method", "plain",
                     "--think-budget", "3"])
    assert plain.exit_code == 0 and plain.stdout.strip() == out["text"].strip()  # stdout is the answer alone
    assert out["reasoning"] in plain.stderr
    bad = run_cli(["generate", "-t", model, "--message", "hi", "--think-budget", "-1"])
    assert bad.exit_code == 1 and "think_budget must be a whole number" in bad.stderr


def test_chat_shows_the_reasoning_apart_and_keeps_only_the_answer(opens):
    from localspec.cli.chat_session import ChatSession

    session = ChatSession(opens, None, localspec.GenerationOptions(max_tokens=16, method="plain", think_budget=3))
    events = []
    r, _ = session.reply("hello there", events.append)
    assert r.reasoning and session.messages[-1] == {"role": "assistant", "content": r.text}
    assert session.command("/think") == ("thinking: off", False) and session.options.think is False
    assert session.command("/think on")[0] == "thinking: on" and session.command("/think auto")[0] == "thinking: auto"
    assert session.command("/think-budget 7")[0] == "think budget: 7" and session.options.think_budget == 7
    with pytest.raises(localspec.ConfigError, match="/think takes on, off or auto"):
        session.command("/think maybe")
    # the next turn's prompt holds the earlier answer, not its reasoning
    r2, _ = session.reply("again", lambda ev: None)
    assert r.reasoning not in opens.target.detokenize(r2.prompt_tokens)


def test_the_chat_loop_prints_a_thinking_block_before_the_answer(think_dir):
    from clirun import run_cli

    r = run_cli(["chat", "-t", str(think_dir / "opens-t.gguf"), "-d", "none", "-n", "12", "--method", "plain",
                 "--think-budget", "3"], input="hello\n/exit\n")
    assert r.exit_code == 0, r.output
    assert "thinking: " in r.stdout


# with <|return|> and <|call|> in the vocabulary, llama.cpp does not end a reply at <|end|> (as for GPT-OSS)
HARMONY = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}<|start|>assistant<|channel|>final<|message|>"
    "{% else %}<|start|>{{ m['role'] }}<|message|>{% endif %}{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)


def test_harmony_channels_split_and_a_budget_ends_the_analysis_channel(tmp_path):
    path = write_tiny_model(tmp_path / "harmony.gguf", seed=0, control_tokens=HARMONY_TOKENS, chat_template=HARMONY)
    with localspec.load(path, None, n_ctx=1024, history=False) as pair:
        reasoning = model_reasoning(pair.target)
        assert reasoning.fmt.name == "harmony"

        def shown(tokens):  # control tokens as their text, as the reader sees them
            return "".join(reasoning.text(t, pair.target.detokenize([t])) for t in tokens)

        prompt = pair.format_chat(MESSAGES) + "<|channel|>analysis<|message|>"
        close = pair.target.tokenize("<|end|><|start|>assistant<|channel|>final<|message|>", add_special=False)
        stream = pair.stream(prompt, max_tokens=40, method="lookup", think_budget=3)
        events = list(stream)
        r = stream.result
        assert r.tokens[3:3 + len(close)] == close
        assert r.reasoning == shown(r.tokens[:3]).strip() and r.text
        assert r.text == pair.target.detokenize(r.tokens[3 + len(close):]).lstrip()
        assert "".join(e.reasoning for e in events) == r.reasoning
        assert r.text.startswith("".join(e.text for e in events))  # an incomplete last character comes at the end
        plain = pair.generate(prompt, max_tokens=40, method="plain", think_budget=3)
        assert plain.tokens == r.tokens
        # thinking off, before the model wrote a channel: it is made to open the final one
        final = pair.target.tokenize("<|channel|>final<|message|>", add_special=False)
        off = pair.chat(MESSAGES, max_tokens=len(final) + 4, method="draft" if pair.draft else "lookup", think=False)
        assert off.tokens[:len(final)] == final and off.reasoning is None


def test_a_reasoning_block_then_tool_calls_under_every_method(tmp_path):
    from chatdefs import SCHEMAS, TOOLS
    from chatdefs import TOOL_MESSAGES as ASK
    from tinymodel import HERMES_TEMPLATE as TOOLS_TEMPLATE

    from localspec.structured.tool_use import CLOSE, OPEN

    opening = "<|im_start|>assistant\n{% endif %}"
    template = TOOLS_TEMPLATE.replace(opening, opening.replace("\n", "\n<think>\n"))
    assert template != TOOLS_TEMPLATE
    for name, noise in (("t.gguf", 0.0), ("d.gguf", 0.35)):
        write_tiny_model(tmp_path / name, seed=0, noise=noise, user_tokens=[OPEN, CLOSE, *THINK_TOKENS],
                         chat_template=template)
    with localspec.load(tmp_path / "t.gguf", tmp_path / "d.gguf", n_ctx=1024, history=False) as pair:
        one = {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 80,
               "think_budget": 4}
        plain = pair.chat(ASK, method="plain", **one)
        assert plain.reasoning is not None and "<think>" not in plain.reasoning
        assert len(plain.tool_calls) == 1 and plain.finish_reason == "tool_calls" and plain.content is None
        for call in plain.tool_calls:
            jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
        for method, k in METHODS:
            r = pair.chat(ASK, method=method, k=k, **one)
            assert r.tokens == plain.tokens, f"{method} k={k}"
            assert [c.arguments for c in r.tool_calls] == [c.arguments for c in plain.tool_calls]
        # under "auto" the calls' grammar waits for its trigger, and the trigger counts only after the reasoning
        free = {**one, "tool_choice": "auto"}
        auto = pair.chat(ASK, method="plain", **free)
        assert pair.chat(ASK, method="draft", k=4, **free).tokens == auto.tokens


def test_chat_in_a_terminal_dims_the_thinking_block_folds_it_and_toggles_it(think_dir, tmp_path):
    pexpect = pytest.importorskip("pexpect")
    from clirun import spawn_localspec

    child = spawn_localspec(["chat", "-t", str(think_dir / "opens-t.gguf"), "-d", "none", "-n", "12", "--method",
                             "plain", "--think-budget", "3"], tmp_path / "home")
    try:
        child.expect(">>>")
        child.send("hello\r")
        child.expect(r"\x1b\[2mthinking: ")  # dimmed
        child.expect(r"\x1b\[J")  # the answer began: the block's rows are erased...
        child.expect(r"\x1b\[2mthought: [^\r\n]*\(\d+ words\)")  # ...and one dimmed line stands for them
        child.expect(r"\[\d+ tokens")
        child.expect(">>>")
        child.send("/think\r")
        child.expect("thinking: off")
        child.expect(">>>")
        child.send("/exit\r")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)


def shared_piece(reasoning: str, answer: str) -> str:
    """A short text that comes in the reasoning and, not at its start, in the answer."""
    for n in (3, 2, 1):
        for i in range(1, len(answer) - n + 1):
            piece = answer[i:i + n]
            if piece.strip() and piece in reasoning:
                return piece
    raise AssertionError(f"no text in common: {reasoning!r} / {answer!r}")


def test_a_stop_string_counts_in_the_answer_only_whole_and_streamed(opens):
    ask = {"max_tokens": 40, "think_budget": 6}
    free = opens.chat(MESSAGES, method="plain", **ask)
    assert free.reasoning and free.text
    stop = shared_piece(free.reasoning, free.text)
    cut = free.text[:free.text.index(stop)]
    plain = opens.chat(MESSAGES, method="plain", stop=[stop], **ask)
    # the reasoning runs on past the stop string; the answer is cut before it, as a reply without reasoning is
    assert plain.reasoning == free.reasoning and stop in plain.reasoning
    assert plain.text == cut and plain.finish_reason == "stop" and plain.stop_string == stop
    assert len(plain.tokens) < len(free.tokens) and plain.tokens == free.tokens[:len(plain.tokens)]
    for method, k in METHODS:
        r = opens.chat(MESSAGES, method=method, k=k, stop=[stop], **ask)
        assert r.tokens == plain.tokens, f"{method} k={k}"
        assert (r.reasoning, r.text, r.finish_reason) == (plain.reasoning, plain.text, "stop")
        stream = opens.stream_chat(MESSAGES, method=method, k=k, stop=[stop], **ask)
        events = list(stream)
        assert "".join(e.reasoning for e in events) == plain.reasoning
        assert plain.text.startswith("".join(e.text for e in events)) and stream.result.text == plain.text
        assert stream.result.tokens == plain.tokens
    # the markers are not the answer's text either
    marker = opens.chat(MESSAGES, method="plain", stop=["</think>"], **ask)
    assert marker.tokens == free.tokens and marker.stop_string is None


def test_a_stop_string_that_comes_only_in_the_reasoning_leaves_the_reply_whole(opens):
    ask = {"max_tokens": 40, "think_budget": 6}
    free = opens.chat(MESSAGES, method="plain", **ask)
    only = next(free.reasoning[i:i + n] for n in range(1, len(free.reasoning) + 1)
                for i in range(len(free.reasoning) - n + 1) if free.reasoning[i:i + n] not in free.text)
    for method, k in [("plain", None), ("draft", 4)]:
        r = opens.chat(MESSAGES, method=method, k=k, stop=[only], **ask)
        assert r.tokens == free.tokens and r.stop_string is None and r.finish_reason == free.finish_reason


def test_the_stats_count_drafting_inside_and_outside_the_reasoning_apart(opens, tiny_pair):
    for method, k in METHODS:
        r = opens.chat(MESSAGES, max_tokens=40, method=method, k=k, think_budget=6)
        s = r.stats
        assert set(s.drafted_in) == {"reasoning", "answer"}, f"{method} k={k}"
        assert sum(s.drafted_in.values()) == s.drafted and sum(s.accepted_in.values()) == s.accepted
        assert s.drafted_in["reasoning"] > 0 and s.to_dict()["accepted_in"] == s.accepted_in
        for phase, accepted in s.accepted_in.items():
            assert accepted <= s.drafted_in[phase]
    plain = opens.chat(MESSAGES, max_tokens=40, method="plain", think_budget=6).stats
    assert plain.drafted == 0 and set(plain.drafted_in) == {"reasoning", "answer"} and not plain.accepted_in
    other = tiny_pair.generate("in the end, in the end, in the", max_tokens=24, method="lookup", k=3).stats
    assert other.drafted_in == {"answer": other.drafted} and sum(other.accepted_in.values()) == other.accepted


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=400), st.integers(20, 200))
def test_a_folded_block_is_one_line_that_fits_the_terminal(reasoning, width):
    from localspec.cli.chat_session import _fold, _rows

    line = _fold(reasoning, len(reasoning.split()), width)
    assert "\n" not in line and line.startswith("thought: ") and _rows(line, width) == 1


def test_off_a_colour_terminal_the_whole_reasoning_stays():
    import io

    from localspec.cli.chat_session import ThinkingBlock

    out = io.StringIO()
    block = ThinkingBlock(out, colour=False)
    block.add("first, ")
    block.add("then")
    block.close()
    block.close()  # closing twice writes nothing more
    assert out.getvalue() == "thinking: first, then\n\n"
