"""The structured bench: every row under the prompt's constraint (llama-cpp-python's under its own GBNF of the
same schema), exact against constrained plain decoding, with the forced tokens' share; its suite's errors."""

from __future__ import annotations

import json

import pytest
from chatdefs import TOOLS
from clirun import run_cli
from tinymodel import HERMES_TEMPLATE as TEMPLATE
from tinymodel import write_tiny_model

import localspec
from localspec.bench import load_suite, run_bench
from localspec.bench.peers import PEER_LOOKUP, PEER_PLAIN
from localspec.bench.structured import prepare, tool_call_gbnf
from localspec.bench.suite import MethodSpec
from localspec.errors import ConfigError
from localspec.structured.tool_use import CLOSE, OPEN, ToolUse

SCHEMA = {"type": "object", "properties": {"animal": {"type": "string", "maxLength": 12},
                                           "legs": {"type": "integer", "minimum": 0, "maximum": 8}},
          "required": ["animal", "legs"], "additionalProperties": False}
MESSAGES = [{"role": "user", "content": "in the end, in the end, what is the weather in the end"}]
LINES = [
    {"category": "extract", "messages": MESSAGES,
     "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}},
    {"category": "tool-call", "messages": MESSAGES, "tools": TOOLS, "tool_choice": "required"},
    {"category": "free", "prompt": "The cat sat on the mat and the dog"},
]
METHODS = [MethodSpec("plain"), MethodSpec(PEER_PLAIN), MethodSpec(PEER_LOOKUP, 2), MethodSpec("lookup", 3),
           MethodSpec("draft", 3), MethodSpec("auto", 8)]


@pytest.fixture(scope="module")
def tool_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("structured-bench")
    for name, noise in (("t.gguf", 0.0), ("d.gguf", 0.35)):
        write_tiny_model(d / name, seed=0, noise=noise, user_tokens=[OPEN, CLOSE], chat_template=TEMPLATE)
    suite = d / "structured.jsonl"
    suite.write_text("".join(json.dumps(line) + "\n" for line in LINES))
    return d


def test_the_builtin_structured_suite_has_extraction_tool_calls_and_fill_in():
    suite = load_suite(builtin="structured.jsonl")
    assert {p.category for p in suite} == {"extract", "tool-call", "fill-in"}
    assert {p.category for p in load_suite(builtin="structured.jsonl", quick=True)} == {"extract", "tool-call",
                                                                                        "fill-in"}
    for p in suite:
        assert (p.response_format is not None) == (p.category == "extract")
        assert (p.tools is not None) == (p.category == "tool-call")
        assert (p.prefix is not None and p.suffix is not None) == (p.category == "fill-in")


@pytest.mark.parametrize("line,message", [
    ({"category": "x", "prompt": "a", "tools": TOOLS}, "\"tools\" go with chat \"messages\""),
    ({"category": "x", "prefix": "a"}, "needs both \"prefix\" and \"suffix\""),
    ({"category": "x", "prompt": "a", "prefix": "b", "suffix": "c"}, "exactly one of"),
    ({"category": "x", "prompt": "a", "response_format": {"type": "yaml"}}, "response_format type must be"),
    ({"category": "x", "messages": MESSAGES, "tools": TOOLS, "tool_choice": "get_nothing"}, "get_nothing"),
    ({"category": "x", "prefix": "a", "suffix": "b", "response_format": {"type": "json_object"}},
     "takes no \"response_format\""),
    ({"category": "x", "messages": MESSAGES, "tool_choice": "required"}, "need \"tools\""),
    ({"category": "x", "messages": MESSAGES, "tools": TOOLS, "parallel_tool_calls": "yes"}, "true or false"),
])
def test_a_bad_structured_line_names_the_file_and_line(tmp_path, line, message):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"category": "ok", "prompt": "hi"}\n' + json.dumps(line) + "\n")
    with pytest.raises(ConfigError, match=rf"bad\.jsonl, line 2: .*{message}"):
        load_suite(bad)


def test_every_row_decodes_under_the_constraint_and_localspecs_are_exact(tool_dir):
    prompts = load_suite(tool_dir / "structured.jsonl")
    with localspec.load(tool_dir / "t.gguf", tool_dir / "d.gguf", n_ctx=1024, history=False) as pair:
        report = run_bench(pair, prompts, METHODS, reps=2, max_tokens=32, checksums=False)
        prepared = {p.name: prepare(pair, p) for p in prompts}
        texts = {}  # each row's text on each prompt, from a fresh run of the same options
        for name, p in prepared.items():
            plain = pair.generate(p.tokens, max_tokens=32, method="plain", grammar=p.grammar)
            texts[name] = plain.text
    assert report.mismatches == 0 and report.settings["constrained"] == ["extract#1", "tool-call#1"]
    rows = {(r.prompt, r.label): r for r in report.rows}
    for r in report.rows:
        if r.method in ("lookup", "draft", "auto"):
            assert r.exactness in ("identical", "tie"), r
        if r.prompt != "free#1":  # the peers decode under another engine's grammar: timed, not compared
            assert r.exactness_peer == "-" and (r.exactness == "-") == (r.method in (PEER_PLAIN, PEER_LOOKUP))
    assert rows[("free#1", "lookup k=3")].exactness_peer in ("identical", "tie")  # unconstrained: compared
    assert texts["extract#1"].startswith('{"animal": "')
    assert texts["tool-call#1"].startswith(OPEN + '\n{"name": "get_')
    # keys, quotes and the call's frame are forced: drafted for free by every drafting row
    assert rows[("tool-call#1", "lookup k=3")].forced_share > 0.2
    assert rows[("tool-call#1", "plain")].forced_share is None  # plain decoding drafts nothing
    assert rows[("free#1", "auto")].forced_share is None


def test_llama_cpp_pythons_rows_follow_their_own_grammar(tool_dir):
    """The peer's GBNF holds its output to the same shapes: the schema's object, the call in its frame."""
    from localspec.bench.peers import PeerRunner

    prompts = load_suite(tool_dir / "structured.jsonl")
    with localspec.load(tool_dir / "t.gguf", n_ctx=1024, history=False) as pair:
        peers = PeerRunner(pair.target)
        try:
            for p in prompts[:2]:
                prep = prepare(pair, p)
                tokens, _ = peers.generate(PEER_PLAIN, 0, prep.tokens, 0.0, 0, 48, grammar=prep.peer_grammar)
                free, _ = peers.generate(PEER_PLAIN, 0, prep.tokens, 0.0, 0, 48)
                text = pair.target.detokenize(tokens)
                assert text.startswith("{" if p.category == "extract" else OPEN + "\n{"), text
                assert tokens != free  # the grammar changed what it decoded
        finally:
            peers.close()


def test_the_peers_gbnf_has_the_shape_of_localspecs_call_grammar():
    from llama_cpp.llama_grammar import LlamaGrammar

    named = tool_call_gbnf(ToolUse.from_openai(TOOLS, "get_time", parallel_tool_calls=False))
    assert named.startswith('root ::= frame "\\n"?\nframe ::= "' + OPEN + '\\n" call "\\n' + CLOSE + '"\n')
    assert "get_time" in named and "get_weather" not in named
    several = tool_call_gbnf(ToolUse.from_openai(TOOLS, "required"))  # parallel calls by default, as in chat
    assert several.startswith('root ::= frame ("\\n" frame)* "\\n"?') and "get_weather" in several
    item = {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]}
    pydantic = {"type": "function", "function": {"name": "order", "parameters": {
        "$defs": {"Item": item}, "type": "object", "required": ["items"],
        "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}}}}}}
    for gbnf in (named, several, tool_call_gbnf(ToolUse.from_openai([pydantic], "required"))):
        LlamaGrammar.from_string(gbnf, verbose=False)  # llama.cpp parses each
    with pytest.raises(ConfigError, match="cannot wait for"):
        tool_call_gbnf(ToolUse.from_openai(TOOLS, "auto"))


def test_exactness_under_a_constraint_takes_the_margin_among_the_allowed_tokens(tiny_pair):
    from localspec.bench.exactness import margin_at
    from localspec.constraint import Constraint

    t = tiny_pair.target
    prompt = t.tokenize("The cat sat on the mat and the dog")
    plain = tiny_pair.generate(prompt, max_tokens=6, method="plain").tokens
    free = margin_at(t, prompt, plain, 3)
    assert 0 < free < float("inf")
    forced = tiny_pair.assembly.matcher(Constraint.regex("x+"))  # one way on: no tie can explain a divergence
    assert margin_at(t, prompt, [], 0, forced) == float("inf")
    matcher = tiny_pair.assembly.matcher(Constraint.json_object())
    assert margin_at(t, prompt, [], 0, matcher) != margin_at(t, prompt, [], 0)  # '{' and its kind only
    assert margin_at(t, prompt, [], 0, matcher) == margin_at(t, prompt, [], 0, matcher)  # the matcher comes back


def test_the_structured_bench_from_the_command_line(tool_dir):
    r = run_cli(["bench", "-t", str(tool_dir / "t.gguf"), "-d", str(tool_dir / "d.gguf"), "--suite",
                 str(tool_dir / "structured.jsonl"), "--category", "tool-call", "--reps", "1", "-n", "24",
                 "--k-lookup", "3", "--k-draft", "none", "--k-lcp-lookup", "none"])
    assert r.exit_code == 0, r.output
    assert "Under a constraint (tool-call#1) every row decodes under it" in r.output
    assert "forced drafts " in r.output
    auto = tool_dir / "auto.jsonl"  # llama-cpp-python's GBNF cannot wait for the call token
    auto.write_text(json.dumps({**LINES[1], "tool_choice": "auto"}) + "\n")
    r = run_cli(["bench", "-t", str(tool_dir / "t.gguf"), "--suite", str(auto), "--reps", "1", "-n", "4"])
    assert r.exit_code == 1 and "tool-call#1: tool_choice 'auto' lets the model answer in text" in r.output
    r = run_cli(["bench", "-t", str(tool_dir / "t.gguf"), "--suite", str(auto), "--reps", "1", "-n", "4",
                 "--no-peers", "--k-lookup", "none"])
    assert r.exit_code == 0, r.output  # localspec's own rows wait for it


def test_tool_choice_none_keeps_its_ban_on_the_call_token(tool_dir):
    (line,) = [p for p in load_suite(tool_dir / "structured.jsonl") if p.tools]
    line.tool_choice = "none"
    with localspec.load(tool_dir / "t.gguf", n_ctx=1024, history=False) as pair:
        p = prepare(pair, line, peers=False)
        (call,) = pair.target.tokenize(OPEN, add_special=False)
        assert p.grammar is None and dict(p.logit_bias) == {call: -100.0}  # as Pair.chat decodes it
    r = run_cli(["bench", "-t", str(tool_dir / "t.gguf"), "--structured", "--related"])
    assert r.exit_code != 0 and "different workloads; give one" in r.output
    suite = str(tool_dir / "structured.jsonl")
    r = run_cli(["bench", "-t", str(tool_dir / "t.gguf"), "--structured", "--suite", suite])
    assert r.exit_code != 0 and "give one or the other" in r.output
    r = run_cli(["bench", "-t", str(tool_dir / "t.gguf"), "--related", "--suite", str(tool_dir / "structured.jsonl")])
    assert r.exit_code == 1 and "extract#1 gives a response_format or tools" in r.output  # never decoded freely
