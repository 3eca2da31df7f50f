"""Constrained decoding (llguidance): output that follows a JSON schema, JSON mode, a regex or a grammar,
exactly as plain constrained decoding gives it, under every method."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
from helpers import same_distribution, token_counts
from tinyarch import write_tiny_qwen35

import localspec
from localspec.constraint import Constraint

SCHEMA = {
    "type": "object",
    "properties": {
        "animal": {"enum": ["cat", "dog", "bird"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 20},
        "ok": {"type": "boolean"},
    },
    "required": ["animal", "count", "ok"],
    "additionalProperties": False,
}
REGEX = "(cat|dog|bird)s? (sat|ran) on the [a-z]{1,8}"
LARK = 'start: "the " animal (" and the " animal)? "."\nanimal: "cat" | "dog" | "bird" | "fox"'
GBNF = 'root ::= "the " animal (" and the " animal)? "."\nanimal ::= "cat" | "dog" | "bird" | "fox"'
CONSTRAINTS = {
    "schema": Constraint.json_schema(SCHEMA),
    "json mode": Constraint.json_object(),
    "regex": Constraint.regex(REGEX),
    "lark": Constraint.lark(LARK),
    "gbnf": Constraint.gbnf(GBNF),
}
PROMPT = "in the end, in the end, in the end, in the"
METHODS = [("lookup", 3), ("draft", 2), ("draft", 6), ("auto", None)]


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    d = tmp_path_factory.mktemp("structured")
    write_tiny_qwen35(d / "t.gguf", seed=0)
    write_tiny_qwen35(d / "d.gguf", seed=0, noise=0.35)
    with localspec.load(d / "t.gguf", d / "d.gguf", n_ctx=1024, history=False) as pair:
        yield pair


@pytest.mark.parametrize("name", list(CONSTRAINTS))
def test_every_method_gives_plain_constrained_decodings_tokens(tiny_pair, hybrid, name):
    constraint = CONSTRAINTS[name]
    for pair in (tiny_pair, hybrid):
        plain = pair.generate(PROMPT, max_tokens=60, method="plain", grammar=constraint)
        assert plain.tokens
        for method, k in METHODS:
            r = pair.generate(PROMPT, max_tokens=60, method=method, k=k, grammar=constraint)
            assert r.tokens == plain.tokens, f"{name}: {method} k={k} diverged from plain constrained decoding"
            assert r.finish_reason == plain.finish_reason


def test_a_json_schema_reply_validates_and_the_grammar_forced_tokens_are_free_drafts(tiny_pair):
    r = tiny_pair.generate(PROMPT, max_tokens=80, method="lookup", k=4, grammar=CONSTRAINTS["schema"])
    assert r.finish_reason == "stop"
    jsonschema.validate(json.loads(r.text), SCHEMA)
    # the keys, quotes and braces are forced: drafted without a drafter, and all kept
    assert r.stats.drafted_by["grammar"] > 10 and r.stats.accepted_by["grammar"] == r.stats.drafted_by["grammar"]
    plain = tiny_pair.generate(PROMPT, max_tokens=80, method="plain", grammar=CONSTRAINTS["schema"])
    assert "grammar" not in plain.stats.drafted_by  # plain decoding stays plain: one step per token


@pytest.mark.parametrize("name", ["regex", "lark", "gbnf"])
def test_the_output_is_in_the_language(tiny_pair, name):
    import re

    r = tiny_pair.generate(PROMPT, max_tokens=80, method="draft", k=4, grammar=CONSTRAINTS[name])
    assert r.finish_reason == "stop", r.text
    if name == "regex":
        assert re.fullmatch(REGEX, r.text)
    else:
        assert re.fullmatch(r"the (cat|dog|bird|fox)( and the (cat|dog|bird|fox))?\.", r.text)


def test_a_grammar_cut_by_max_tokens_is_a_valid_prefix(tiny_pair):
    r = tiny_pair.generate(PROMPT, max_tokens=5, method="draft", k=4, grammar=CONSTRAINTS["schema"])
    assert r.finish_reason == "length" and len(r.tokens) == 5 and '{"animal": "'.startswith(r.text)


@pytest.mark.parametrize("name,method,k", [("regex", "draft", 3), ("regex", "lookup", 3),
                                           ("schema", "draft", 6)])  # forced tokens, then the draft's masked q
def test_sampled_speculation_keeps_the_plain_constrained_distribution(tiny_pair, name, method, k):
    constraint = CONSTRAINTS[name]
    seen: dict[int, set[int]] = {}
    for seed in range(100):  # the positions after the first that the grammar leaves open
        r = tiny_pair.generate(PROMPT, max_tokens=24, temperature=1.0, seed=seed, method="plain", grammar=constraint)
        for i, t in enumerate(r.tokens[1:], start=1):
            seen.setdefault(i, set()).add(t)
    open_positions = [i for i, tokens in sorted(seen.items()) if len(tokens) > 1][:2]
    assert open_positions
    for position in open_positions:
        plain = token_counts(tiny_pair, PROMPT, 2000, position, method="plain", grammar=constraint)
        spec = token_counts(tiny_pair, PROMPT, 2000, position, method=method, k=k, grammar=constraint)
        p = same_distribution(plain, spec)
        assert p > 1e-3, f"{method} position {position}: chi-square p = {p:.2e}"


def test_the_mask_is_the_grammar(tiny_pair):
    m = tiny_pair.assembly.matcher(Constraint.regex("ab|ac"))
    allowed = {tiny_pair.target.token_bytes(int(t)) for t in np.flatnonzero(m.allowed())}
    assert allowed == {b"a"}
    m.consume(tiny_pair.target.tokenize("a", add_special=False))
    allowed = {tiny_pair.target.token_bytes(int(t)) for t in np.flatnonzero(m.allowed())}
    assert allowed == {b"b", b"c"}
    assert m.valid_prefix(tiny_pair.target.tokenize("bx", add_special=False)) == 1


@pytest.mark.parametrize("make,needle", [
    (lambda: Constraint.json_schema('{"type": "object", '), "not valid JSON"),
    (lambda: Constraint.json_schema([1, 2]), "is an object"),
    (lambda: Constraint.regex("(unclosed"), "regex cannot be compiled"),
    (lambda: Constraint.lark("start: nothing_defined"), "Lark grammar cannot be compiled"),
    (lambda: Constraint.gbnf("root ::= missing"), "GBNF grammar cannot be compiled"),
    (lambda: Constraint.json_schema({"type": "object", "properties": {"a": {"type": "nonsense"}}}),
     "JSON schema cannot be compiled"),
])
def test_a_constraint_that_cannot_compile_is_one_sentence(tiny_pair, make, needle):
    with pytest.raises(localspec.ConfigError, match=needle) as err:
        tiny_pair.generate(PROMPT, max_tokens=4, grammar=make())
    assert "Traceback" not in str(err.value)
    assert tiny_pair.generate(PROMPT, max_tokens=4, method="plain").tokens  # the pair still works


def test_response_format_shapes():
    assert Constraint.response_format({"type": "text"}) is None
    assert Constraint.response_format({"type": "json_object"}) == Constraint.json_object()
    c = Constraint.response_format({"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}})
    assert c == Constraint.json_schema(SCHEMA)
    for bad in ({"type": "xml"}, {"type": "json_schema"}, "json"):
        with pytest.raises(localspec.ConfigError, match="response_format"):
            Constraint.response_format(bad)
    with pytest.raises(localspec.ConfigError, match="must be a localspec Constraint"):
        localspec.GenerationOptions(grammar="{}")


def test_the_server_answers_response_format_and_llama_servers_grammar_with_the_openai_client(tiny_dir, tmp_path):
    import openai
    from serverproc import ServeProcess

    server = ServeProcess(["-t", str(tiny_dir / "target.gguf"), "-d", str(tiny_dir / "draft.gguf"), "--ctx", "1024"],
                          tmp_path)
    try:
        client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=60)
        fmt = {"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA}}
        r = client.chat.completions.create(model="target", messages=[{"role": "user", "content": "A pet?"}],
                                           max_tokens=80, temperature=0, response_format=fmt)
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
        chunks = list(client.chat.completions.create(model="target", messages=[{"role": "user", "content": "A pet?"}],
                                                     max_tokens=80, temperature=0, response_format=fmt, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
            r.choices[0].message.content  # streamed, the same reply
        c = client.completions.create(model="target", prompt=PROMPT, max_tokens=40, temperature=0,
                                      extra_body={"grammar": GBNF})
        import re

        assert re.fullmatch(r"the (cat|dog|bird|fox)( and the (cat|dog|bird|fox))?\.", c.choices[0].text)
        bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}
        with pytest.raises(openai.BadRequestError, match="JSON schema cannot be compiled"):
            client.chat.completions.create(model="target", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=8, response_format=bad)
        with pytest.raises(openai.BadRequestError, match="response_format"):
            client.chat.completions.create(model="target", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=8, response_format={"type": "xml"})
        with pytest.raises(openai.BadRequestError, match="Give one of"):
            client.completions.create(model="target", prompt="hi", max_tokens=8,
                                      extra_body={"grammar": GBNF, "response_format": {"type": "json_object"}})
        again = client.chat.completions.create(model="target", messages=[{"role": "user", "content": "A pet?"}],
                                               max_tokens=80, temperature=0, response_format=fmt)
        assert again.choices[0].message.content == r.choices[0].message.content  # and it keeps serving
    finally:
        server.close()


@pytest.mark.parametrize("make", [
    lambda: Constraint.json_schema({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}),
    lambda: Constraint.regex("[^\\x00-\\U0010FFFF]"),  # an empty language
])
def test_a_grammar_that_fails_inside_the_engine_is_an_error_not_an_empty_reply(tiny_pair, make):
    with pytest.raises(localspec.ConfigError, match="cannot be"):
        tiny_pair.generate(PROMPT, max_tokens=8, grammar=make())


@pytest.mark.parametrize("method,k", [("lookup", 4), ("draft", 8), ("auto", None)])
def test_forced_rounds_are_counted_as_grammar_rounds(tiny_pair, method, k):
    r = tiny_pair.generate(PROMPT, max_tokens=80, method=method, k=k, grammar=CONSTRAINTS["schema"])
    by_method = r.stats.rounds_by_method
    assert by_method["grammar"] == r.stats.grammar_rounds > 0 and sum(by_method.values()) == r.stats.rounds


def test_an_end_token_inside_a_draft_under_a_finished_grammar_ends_the_reply_exactly(tiny_pair):
    from localspec.decoding.engine import Generation
    from localspec.decoding.plan import DecodingPlan
    from localspec.drafting.drafters import Draft, Drafter
    from localspec.options import SamplingParams

    eos = tiny_pair.target.eos

    class EndThenMore(Drafter):  # guesses the end token, then text after it (a lookup that copies a template)
        name = "lookup"

        def propose(self, context, k, rng):
            return Draft([eos, 97, 98][:k], None, "lookup")

    constraint = Constraint.regex("(cat|dog)s?")
    plain = tiny_pair.generate(PROMPT, max_tokens=20, method="plain", grammar=constraint)
    prompt = tiny_pair.tokenize(PROMPT)
    for params in (SamplingParams(), SamplingParams(temperature=1.0)):
        g = Generation(tiny_pair.target, DecodingPlan(prompt, drafter=EndThenMore(), k=3, params=params, max_tokens=20,
                                                      seed=0, matcher=tiny_pair.assembly.matcher(constraint)))
        tokens = [ev.token for ev in g]
        assert g.finish_reason == "stop"
        if params.greedy:
            assert tokens == plain.tokens
        assert tiny_pair.target.detokenize(tokens) in ("cat", "cats", "dog", "dogs")


def test_a_sampling_draft_model_draws_only_what_the_grammar_allows_and_gives_the_grammar_back(tiny_pair):
    from localspec.drafting.drafters import DraftGuide, ModelDrafter
    from localspec.options import SamplingParams

    m = tiny_pair.assembly.matcher(CONSTRAINTS["regex"])
    prompt = np.asarray(tiny_pair.tokenize(PROMPT), dtype=np.int32)
    drafter = ModelDrafter(tiny_pair.draft, SamplingParams(temperature=1.0))
    before = m.allowed().copy()
    rng = np.random.default_rng(0)
    for _ in range(30):
        d = drafter.propose_guided(prompt, 6, rng, DraftGuide(m))
        assert d.tokens and m.valid_prefix(d.tokens) == len(d.tokens)
        assert np.array_equal(m.allowed(), before)  # the grammar is where it was
        assert d.probs is not None and d.probs[0][~before[: d.probs.shape[1]]].sum() == 0  # q is the masked one
    free = [drafter.propose(prompt, 6, rng) for _ in range(30)]
    assert any(m.valid_prefix(d.tokens) < len(d.tokens) for d in free)  # unmasked, it strays


def test_a_guess_continues_after_the_forced_tokens_in_the_same_verification(tiny_pair):
    from localspec.decoding.engine import Generation
    from localspec.decoding.plan import DecodingPlan
    from localspec.drafting.drafters import Draft, Drafter

    constraint = CONSTRAINTS["schema"]
    plain = tiny_pair.generate(PROMPT, max_tokens=80, method="plain", grammar=constraint).tokens
    prompt = tiny_pair.tokenize(PROMPT)

    class Oracle(Drafter):  # guesses plain constrained decoding's next tokens (never asked outside a grammar)
        name = "lookup"
        after_forced = 0

        def propose_guided(self, context, k, rng, guide):
            self.after_forced += guide.forced > 0
            at = len(context) - len(prompt)
            return Draft(plain[at: at + k], None, "lookup")

    oracle, k = Oracle(), 8
    g = Generation(tiny_pair.target, DecodingPlan(prompt, drafter=oracle, k=k, max_tokens=80,
                                                  matcher=tiny_pair.assembly.matcher(constraint)))
    assert [ev.token for ev in g] == plain
    s = g.stats
    assert oracle.after_forced > 0 and s.accepted_by["grammar"] > 0 and s.accepted_by["lookup"] > 0
    # every round is k guessed tokens and the target's own (the end token too, after the last text token)
    assert g.finish_reason == "stop" and s.rounds == -(-len(plain) // (k + 1))


def _wide_union(n):  # a choice among n objects: one grammar row of n alternatives, past llguidance's 2000
    return {"anyOf": [{"type": "object", "properties": {f"k{i}": {"type": "string"}}, "required": [f"k{i}"]}
                      for i in range(n)]}


@pytest.mark.parametrize("schema,needle", [
    ({"enum": [f"value-{i}" for i in range(200_000)]}, "cannot be compiled: .*too big"),  # refused compiling
    (_wide_union(3000), "cannot be followed: .*3000 items; max is 2000"),  # refused on the way it forces
    ({"type": "array", "uniqueItems": True}, "cannot be compiled"),  # a feature the engine does not support
])
def test_a_schema_past_the_engines_limits_is_one_sentence_and_the_pair_goes_on(tiny_pair, schema, needle):
    with pytest.raises(localspec.ConfigError, match=f"The JSON schema {needle}") as err:
        tiny_pair.generate(PROMPT, max_tokens=8, method="auto", grammar=Constraint.json_schema(schema))
    assert "refused a token it had allowed" not in str(err.value) and "\n" not in str(err.value)
    assert tiny_pair.generate(PROMPT, max_tokens=60, method="plain", grammar=CONSTRAINTS["schema"]).finish_reason \
        == "stop"


def test_a_limit_met_on_the_grammars_forced_start_is_refused_before_any_work(tiny_pair):
    # a stream is refused as it is asked for, not at its first token (when a server's stream has started)
    with pytest.raises(localspec.ConfigError, match="3000 items"):
        tiny_pair.stream(PROMPT, max_tokens=8, method="plain", grammar=Constraint.json_schema(_wide_union(3000)))
    assert tiny_pair.stream(PROMPT, max_tokens=4, method="plain",
                            grammar=Constraint.json_schema(_wide_union(1500))).finish().text


@pytest.mark.parametrize("lexeme", ['x[stop="."]: /[a-z ]*/', "x[max_tokens=3]: /[a-z ]*/"])
def test_a_grammar_that_cannot_go_back_still_starts_with_what_it_forces(tiny_pair, lexeme):
    # llguidance cannot roll back a grammar with stop= or max_tokens= lexemes: the check of the forced start
    # must not need to
    grammar = Constraint.lark(f'start: "hello world" x\n{lexeme}')
    for method in ("plain", "auto"):
        assert tiny_pair.generate(PROMPT, max_tokens=6, method=method, grammar=grammar).text.startswith("hello")


def test_the_server_refuses_a_schema_past_the_engines_limits_with_a_400_and_keeps_serving(client):
    import openai

    fmt = {"type": "json_schema", "json_schema": {"name": "wide", "schema": _wide_union(3000)}}
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError, match="cannot be followed"):
            r = client.chat.completions.create(model="target", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=8, response_format=fmt, stream=stream)
            list(r) if stream else None
    ok = client.chat.completions.create(model="target", messages=[{"role": "user", "content": "A pet?"}],
                                        max_tokens=60, temperature=0,
                                        response_format={"type": "json_schema",
                                                         "json_schema": {"name": "pet", "schema": SCHEMA}})
    jsonschema.validate(json.loads(ok.choices[0].message.content), SCHEMA)
