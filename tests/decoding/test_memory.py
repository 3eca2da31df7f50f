"""Models whose memory is not a plain KV cache: recurrent (mamba), hybrid with bounded rollback (qwen35,
lfm2) and interleaved sliding windows (gemma2), against llama-cpp-python's own plain decoding of each file."""

from __future__ import annotations

from pathlib import Path

import helpers
import numpy as np
import openai
import pytest
from clirun import run_cli, spawn_localspec
from helpers import same_distribution, token_counts
from serverproc import ServeProcess
from tinyarch import write_tiny_gemma2, write_tiny_lfm2, write_tiny_mamba, write_tiny_qwen35

import localspec
from localspec.runtime import memory
from localspec.runtime.model import Model

WRITERS = {"mamba": write_tiny_mamba, "qwen35": write_tiny_qwen35, "lfm2": write_tiny_lfm2,
           "gemma2": write_tiny_gemma2}
KINDS = {"mamba": memory.CHECKPOINT, "qwen35": memory.ROLLBACK, "lfm2": memory.ROLLBACK, "gemma2": memory.FULL}
PROMPTS = ["in the end, in the end, in the end, in the", "The cat sat on the mat and the dog sat on the"]
METHODS = [("plain", None), ("lookup", 3), ("draft", 2), ("draft", 6), ("auto", None)]
N = 48


@pytest.fixture(scope="module")
def arch_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("arch")
    for name, write in WRITERS.items():
        write(d / f"{name}.gguf", seed=0)
        write(d / f"{name}-draft.gguf", seed=0, noise=0.35)  # agrees often, not always
    return d


def lcp_greedy(path: Path, prompt: list[int], n: int = N, **settings: int) -> list[int]:
    """llama-cpp-python's own greedy decoding of ``path``, ``N`` tokens unless told."""
    return helpers.lcp_greedy(path, prompt, n, **settings)


@pytest.fixture(scope="module")
def pairs(arch_dir: Path):
    opened = {name: localspec.load(arch_dir / f"{name}.gguf", arch_dir / f"{name}-draft.gguf", n_ctx=1024)
              for name in WRITERS}
    yield opened
    for pair in opened.values():
        pair.close()


@pytest.mark.parametrize("arch", list(WRITERS))
def test_each_memory_is_what_its_architecture_allows(pairs, arch):
    pair = pairs[arch]
    assert pair.target.memory.kind == KINDS[arch]
    assert pair.target.memory.rollback_tokens == (8 if KINDS[arch] == memory.ROLLBACK else 0)
    assert pair.draft.memory.kind == (memory.FULL if arch == "gemma2" else memory.CHECKPOINT)  # single steps


@pytest.mark.parametrize("arch", list(WRITERS))
@pytest.mark.parametrize("prompt", PROMPTS)
def test_every_method_gives_llama_cpp_pythons_own_greedy_tokens(arch_dir, pairs, arch, prompt):
    pair = pairs[arch]
    tokens = pair.tokenize(prompt)
    expected = lcp_greedy(arch_dir / f"{arch}.gguf", tokens)
    if len(expected) < 8:  # a random model may end its answer at once: then go on from a longer prompt
        prompt += " and then"
        expected = lcp_greedy(arch_dir / f"{arch}.gguf", pair.tokenize(prompt))
    assert len(expected) >= 8
    for method, k in METHODS + ([("mtp", 3)] if arch == "qwen35" else []):
        r = pair.generate(prompt, max_tokens=N, method=method, k=k)
        assert r.tokens == expected[: len(r.tokens)], f"{arch}: {method} k={k} diverged from llama-cpp-python"
        assert len(r.tokens) == len(expected) or r.finish_reason == "stop"
        if method == "draft":
            assert 0 < r.stats.accepted < r.stats.drafted  # guesses were kept and rejected
            if KINDS[arch] == memory.CHECKPOINT:
                assert r.stats.rewinds > 0  # rejections went back to a checkpoint


@pytest.mark.parametrize("arch", ["mamba", "qwen35"])
def test_history_drafts_from_an_earlier_reply_and_stays_exact(arch_dir, tmp_path, monkeypatch, arch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))  # an empty store of this test's own
    path = arch_dir / f"{arch}.gguf"
    with localspec.load(path, history=True) as pair:
        expected = lcp_greedy(path, pair.tokenize(PROMPTS[1]))
        pair.generate(PROMPTS[1], max_tokens=N, method="plain")  # recorded
        drafted = {}
        for method in ("history", "auto"):
            r = pair.generate(PROMPTS[1], max_tokens=N, method=method)
            assert r.tokens == expected[: len(r.tokens)], f"{arch}: {method} diverged"
            drafted[method] = r.stats.accepted_by.get("history", 0)
        assert drafted["history"] > 10  # the earlier reply was found and copied


@pytest.mark.parametrize("arch", ["mamba", "qwen35"])
def test_generate_on_the_command_line_is_exact_for_every_method(arch_dir, arch):
    import json



    path = arch_dir / f"{arch}.gguf"
    base = ["generate", "-t", str(path), "-d", str(arch_dir / f"{arch}-draft.gguf"), "--prompt", PROMPTS[1],
            "--max-tokens", "24", "--json"]
    with Model(path, n_ctx=64) as m:
        expected = lcp_greedy(path, m.tokenize(PROMPTS[1]), 24)
    for method in ("plain", "draft", "lookup", "auto", *(("mtp",) if arch == "qwen35" else ())):
        out = run_cli([*base, "--method", method], catch_exceptions=False)
        assert out.exit_code == 0, out.output
        assert json.loads(out.stdout)["tokens"] == expected, f"{arch}: generate --method {method}"


def test_a_rollback_beyond_the_snapshots_takes_a_checkpoint_and_stays_exact(arch_dir, pairs):
    pair = pairs["qwen35"]
    prompt = PROMPTS[1]
    expected = lcp_greedy(arch_dir / "qwen35.gguf", pair.tokenize(prompt))
    r = pair.generate(prompt, max_tokens=N, method="draft", k=12)  # 12 > the 8 snapshots
    assert r.tokens == expected[: len(r.tokens)] and r.stats.rejected_rounds > 0


@pytest.mark.parametrize("arch", ["mamba", "gemma2"])
def test_a_rounds_checkpoint_is_timed_apart_from_its_verification(pairs, arch):
    """Auto corrects the profile's verify(n) by what rounds of n tokens took, and the profile prices a checkpoint
    apart (its ``rollback``): a round that saves one reports the saving apart, or auto would count it twice."""
    from localspec.decoding.rounds import speculative_round
    from localspec.drafting.costs import RoundTiming
    from localspec.drafting.drafters import Draft, Drafter
    from localspec.options import SamplingParams

    class Wrong(Drafter):
        name = "lookup"
        timings: list[RoundTiming] = []

        def propose(self, context, k, rng):
            return Draft([7] * k, None, self.name)

        def observe_timing(self, timing):
            self.timings.append(timing)

    pair = pairs[arch]
    target = pair.target
    context = np.asarray(pair.tokenize(PROMPTS[0]), dtype=np.int32)
    target.truncate(0)
    target.eval([int(t) for t in context[:-1]], logits="none")
    drafter = Wrong()
    busy = target.busy_seconds
    speculative_round(target, drafter, context, 4, SamplingParams(), np.random.default_rng(0))
    (timing,) = drafter.timings
    assert timing.n == 5 and timing.verify_seconds > 0
    assert timing.verify_seconds + timing.rollback_seconds == pytest.approx(target.busy_seconds - busy)
    assert (timing.rollback_seconds > 0) == (arch == "mamba")  # an attention cache just cuts its tail off


@pytest.mark.parametrize("arch", ["mamba", "qwen35", "gemma2"])
def test_chat_follow_ups_that_reuse_or_diverge_are_exact(arch_dir, pairs, arch):
    pair = pairs[arch]
    first = [{"role": "user", "content": "in the end, in the end"}]
    r1 = pair.chat(first, max_tokens=20, method="draft", k=4)
    again = first + [{"role": "assistant", "content": r1.text}, {"role": "user", "content": "and then?"}]
    early = [{"role": "user", "content": "in the start"}]  # diverges a few tokens in
    for messages in (again, early, again):
        tokens = pair.chat_tokens(messages)
        expected = lcp_greedy(arch_dir / f"{arch}.gguf", tokens, 20)
        r = pair.chat(messages, max_tokens=20, method="draft", k=4)
        assert r.tokens == expected[: len(r.tokens)], f"{arch} diverged on a follow-up"


@pytest.mark.parametrize("arch", ["mamba", "qwen35"])
def test_after_rejections_the_target_equals_a_fresh_context(arch_dir, pairs, arch):
    pair = pairs[arch]
    r = pair.generate(PROMPTS[1], max_tokens=30, method="draft", k=5)
    assert r.stats.rejected_rounds > 0
    full = r.prompt_tokens + r.tokens
    for model, path in ((pair.target, arch_dir / f"{arch}.gguf"), (pair.draft, arch_dir / f"{arch}-draft.gguf")):
        assert list(model.tokens) == full[: model.n_past]
        probe = [*model.tokens, 42]
        got = model.eval([42], logits="last")[0].copy()
        with Model(path, n_ctx=1024) as fresh:
            want = fresh.eval(probe, logits="last")[0].copy()
        assert np.allclose(got, want, atol=1e-3), f"{arch}: {model.memory.kind} {np.abs(got - want).max()}"
        model.truncate(len(probe) - 1)


@pytest.mark.parametrize("arch", ["mamba", "qwen35"])
def test_ctrl_c_inside_a_decode_leaves_the_next_request_exact(arch_dir, pairs, arch, monkeypatch):
    import llama_cpp

    pair = pairs[arch]
    expected = lcp_greedy(arch_dir / f"{arch}.gguf", pair.tokenize(PROMPTS[0]), 30)
    real_decode = llama_cpp.llama_decode
    calls = {"n": 0, "at": 0}

    def decode_then_interrupt(ctx, batch):
        rc = real_decode(ctx, batch)
        calls["n"] += 1
        if calls["n"] == calls["at"]:
            raise KeyboardInterrupt
        return rc

    for interrupt_at in (3, 8, 13):
        calls.update(n=0, at=interrupt_at)
        monkeypatch.setattr(llama_cpp, "llama_decode", decode_then_interrupt)
        with pytest.raises(KeyboardInterrupt):
            pair.generate(PROMPTS[1], max_tokens=40, method="draft", k=5)
        monkeypatch.setattr(llama_cpp, "llama_decode", real_decode)
        r = pair.generate(PROMPTS[0], max_tokens=30, method="draft", k=5)
        assert r.tokens == expected[: len(r.tokens)]


@pytest.mark.parametrize("arch", ["mamba", "qwen35", "gemma2"])
def test_a_decode_that_fails_after_llama_cpp_cleaned_up_leaves_the_next_request_exact(arch_dir, pairs, arch,
                                                                                     monkeypatch):
    # llama.cpp answers a failed decode by removing the chunk's positions itself; on a recurrent state
    # with snapshots that removal is a rollback to a snapshot the failed decode never wrote.
    import llama_cpp

    pair = pairs[arch]
    prompt = PROMPTS[0] + " and then"
    expected = lcp_greedy(arch_dir / f"{arch}.gguf", pair.tokenize(prompt), 20)
    pair.generate(PROMPTS[0], max_tokens=1, method="plain")  # the cache holds exactly a prefix of the next prompt
    real_decode = llama_cpp.llama_decode

    def decode_then_fail(ctx, batch):
        real_decode(ctx, batch)
        first = batch.pos[0]
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx), 0, first, -1)
        return 1

    monkeypatch.setattr(llama_cpp, "llama_decode", decode_then_fail)
    with pytest.raises(localspec.BackendError):
        pair.generate(prompt, max_tokens=20, method="plain")
    monkeypatch.setattr(llama_cpp, "llama_decode", real_decode)
    tokens = pair.tokenize(prompt)
    got = pair.target.sync(tokens).copy()  # continues from whatever the failure left
    with Model(arch_dir / f"{arch}.gguf", n_ctx=1024) as fresh:
        want = fresh.eval(tokens, logits="last")[0].copy()
    assert np.abs(got - want).max() < 1e-3, f"{arch}: the state after a failed decode is not the record's"
    for method in ("plain", "draft"):
        r = pair.generate(prompt, max_tokens=20, method=method, k=4)
        assert r.tokens == expected[: len(r.tokens)], f"{arch}: {method} after a failed decode"


@pytest.mark.parametrize("arch,method", [("mamba", "draft"), ("qwen35", "draft"), ("qwen35", "lookup")])
def test_sampled_speculation_keeps_the_plain_distribution(pairs, arch, method):
    pair = pairs[arch]
    prompt = PROMPTS[0]
    n = 1500
    for position in (1, 3):
        plain = token_counts(pair, prompt, n, position, method="plain")
        spec = token_counts(pair, prompt, n, position, method=method, k=3)
        p = same_distribution(plain, spec)
        assert p > 1e-3, f"{arch} {method} position {position}: chi-square p = {p:.2e}"


def test_the_sliding_window_is_exact_past_the_window_after_a_shared_prefix(arch_dir):
    # f32 caches on both sides: this tiny gemma2's f16 cache rounds its logits by ~2e-3, more than
    # some of its greedy margins, and the question here is the window's cache, not rounding.
    from localspec.api import Pair

    path = arch_dir / "gemma2.gguf"
    pair = Pair(Model(path, n_ctx=1024, cache_type="f32"), Model(arch_dir / "gemma2-draft.gguf", n_ctx=1024))
    try:
        long = PROMPTS[1] + " and so on, and so on"
        pair.generate(long, max_tokens=30, method="draft", k=6)  # the cache holds far more than the 8-token window
        shorter = PROMPTS[1] + " and so"  # reuses a prefix, then cuts back past the window
        expected = lcp_greedy(path, pair.tokenize(shorter), 30, type_k=0, type_v=0)
        for method, k in METHODS:
            r = pair.generate(shorter, max_tokens=30, method=method, k=k)
            assert r.tokens == expected[: len(r.tokens)], f"gemma2: {method} diverged"
            pair.generate(long, max_tokens=10, method="draft", k=6)
    finally:
        pair.close()


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """qwen35 targets whose MTP head is a bigram table: exactly the target's guess (trunk 0), or often it."""
    d = tmp_path_factory.mktemp("mtp")
    for trunk in (0.0, 0.2):
        write_tiny_qwen35(d / f"trunk{trunk}.gguf", seed=0, trunk=trunk, bigram_head=True)
    return d


def test_mtp_drafts_are_the_heads_predictions(head_dir):
    # With no trunk the target predicts from its last token alone, and so does the head: every guess the
    # head makes is the target's own token, so all are kept. An empty or misaligned drafter keeps none.
    path = head_dir / "trunk0.0.gguf"
    with localspec.load(path) as pair:
        assert pair.target.n_nextn == 1
        r = pair.generate(PROMPTS[1], max_tokens=N, method="mtp", k=3)
        expected = lcp_greedy(path, pair.tokenize(PROMPTS[1]))
    assert r.tokens == expected[: len(r.tokens)]
    assert r.stats.drafted > 20 and r.stats.accepted == r.stats.drafted
    assert r.stats.drafted_by == {"mtp": r.stats.drafted} and r.stats.accepted_by["mtp"] == r.stats.accepted


def test_mtp_with_partial_acceptance_is_exact_greedy_and_sampled(head_dir):
    path = head_dir / "trunk0.2.gguf"
    with localspec.load(path) as pair:
        expected = lcp_greedy(path, pair.tokenize(PROMPTS[1]))
        for k in (1, 3, 10):  # 10: longer than the target's 8 rollback snapshots
            r = pair.generate(PROMPTS[1], max_tokens=N, method="mtp", k=k)
            assert r.tokens == expected[: len(r.tokens)], f"mtp k={k} diverged from llama-cpp-python"
            assert 0 < r.stats.accepted < r.stats.drafted
        for position in (1, 3):
            plain = token_counts(pair, PROMPTS[0], 1500, position, method="plain")
            spec = token_counts(pair, PROMPTS[0], 1500, position, method="mtp", k=3)
            p = same_distribution(plain, spec)
            assert p > 1e-3, f"mtp position {position}: chi-square p = {p:.2e}"


def test_mtp_under_a_grammar_is_exact_greedy_and_sampled(head_dir):
    from localspec.constraint import Constraint

    regex = Constraint.regex("(cat|dog|bird)s? (sat|ran) on the [a-z]{1,8}")
    schema = Constraint.json_schema({"type": "object", "properties": {"animal": {"enum": ["cat", "dog"]},
                                     "n": {"type": "integer"}}, "required": ["animal", "n"]})
    with localspec.load(head_dir / "trunk0.2.gguf", history=False) as pair:
        for constraint in (regex, schema):  # the head draws among what the grammar allows, after no forced tokens
            plain = pair.generate(PROMPTS[0], max_tokens=N, method="plain", grammar=constraint)
            for k in (1, 3):
                r = pair.generate(PROMPTS[0], max_tokens=N, method="mtp", k=k, grammar=constraint)
                assert r.tokens == plain.tokens, f"mtp k={k} diverged from plain constrained decoding"
                assert r.stats.drafted_by.get("mtp", 0) > 0
        position = 3  # after "cat"/"dog"/"bird" and an optional "s": open at every seed
        plain_counts = token_counts(pair, PROMPTS[0], 1500, position, method="plain", grammar=regex)
        spec = token_counts(pair, PROMPTS[0], 1500, position, method="mtp", k=3, grammar=regex)
        assert len(plain_counts) > 1
        p = same_distribution(plain_counts, spec)
        assert p > 1e-3, f"mtp under a grammar, position {position}: chi-square p = {p:.2e}"


def test_auto_drafts_with_the_head_where_the_costs_let_it_and_stays_exact(head_dir):
    from localspec.drafting.costs import CostProfile

    path = head_dir / "trunk0.2.gguf"
    with localspec.load(path, history=False) as pair:
        expected = lcp_greedy(path, pair.tokenize(PROMPTS[1]))
        flat = CostProfile([0.01 * (1 + 0.02 * n) for n in range(9)], 0.0, 2e-5, "flat", mtp_step=0.001)
        pair.set_profile(flat)  # a GPU-like curve: a guess of the head costs a tenth of a step
        r = pair.generate(PROMPTS[1], max_tokens=N, method="auto")
        assert r.tokens == expected[: len(r.tokens)]
        assert r.stats.rounds_by_method.get("mtp", 0) > 0 and r.stats.accepted_by.get("mtp", 0) > 0
        dear = CostProfile([0.01 * (n + 1) for n in range(9)], 0.0, 2e-5, "dear", mtp_step=0.01)
        pair.set_profile(dear)  # verifying n tokens costs n steps: no head round can pay
        r = pair.generate(PROMPTS[1], max_tokens=N, method="auto")
        assert r.tokens == expected[: len(r.tokens)] and r.stats.rounds_by_method.get("mtp", 0) == 0


def test_mtp_on_a_model_without_a_head_is_one_clear_sentence(arch_dir):
    with localspec.load(arch_dir / "lfm2.gguf") as pair:
        with pytest.raises(localspec.ConfigError, match="needs a target with an MTP head .* lfm2.gguf has none"):
            pair.generate(PROMPTS[0], max_tokens=4, method="mtp")
        assert pair.generate(PROMPTS[0], max_tokens=4, method="plain").tokens  # and plain still works


def test_a_build_without_the_mtp_functions_says_so_and_plain_and_auto_go_on(head_dir, monkeypatch):
    import sys

    path = head_dir / "trunk0.2.gguf"
    with localspec.load(path, history=False) as pair:
        expected = lcp_greedy(path, pair.tokenize(PROMPTS[1]), 20)
        notes: list[str] = []
        pair.notify = notes.append
        import llama_cpp

        monkeypatch.setitem(sys.modules, "llama_cpp.llama_cpp_ext", None)  # as if the symbols were missing
        monkeypatch.delattr(llama_cpp, "llama_cpp_ext", raising=False)
        with pytest.raises(localspec.ConfigError, match="cannot run MTP heads.*or draft with another method"):
            pair.generate(PROMPTS[1], max_tokens=4, method="mtp")
        for method in ("plain", "auto"):
            assert pair.generate(PROMPTS[1], max_tokens=20, method=method).tokens == expected[:20]
        assert [n for n in notes if "not drafting with the MTP head" in n]


def test_a_draft_of_another_architecture_with_the_same_vocabulary_drafts_exactly(arch_dir, tiny_dir):
    # Only the vocabulary must match: a mamba draft for a llama target (and the other way round) is fine.
    for target, draft in ((tiny_dir / "target.gguf", arch_dir / "mamba.gguf"),
                          (arch_dir / "qwen35.gguf", tiny_dir / "target.gguf")):
        with localspec.load(target, draft) as pair:
            plain = pair.generate(PROMPTS[1], max_tokens=30, method="plain")
            r = pair.generate(PROMPTS[1], max_tokens=30, method="draft", k=3)
            assert r.tokens == plain.tokens and r.stats.drafted > 0


@pytest.mark.parametrize("arch", ["mamba", "qwen35"])
def test_serve_answers_exactly_and_survives_a_dropped_client(arch_dir, tmp_path, arch):
    path = arch_dir / f"{arch}.gguf"
    server = ServeProcess(["-t", str(path), "-d", str(arch_dir / f"{arch}-draft.gguf"), "--ctx", "1024"], tmp_path)
    try:
        client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=60)
        with Model(path, n_ctx=64) as m:
            expected = lcp_greedy(path, m.tokenize(PROMPTS[0]), 24)
        stream = client.completions.create(model=arch, prompt=PROMPTS[1], max_tokens=200, temperature=0,
                                           stream=True)
        next(iter(stream))
        stream.close()  # the client leaves mid-generation
        for _ in range(2):  # the second one reuses the cached prompt
            r = client.completions.create(model=arch, prompt=PROMPTS[0], max_tokens=24, temperature=0)
            assert r.choices[0].text == pair_text(path, expected)
    finally:
        server.close()


def pair_text(path: Path, tokens: list[int]) -> str:
    """The text of ``tokens`` in ``path``'s vocabulary."""
    with Model(path, n_ctx=64) as m:
        return m.detokenize(tokens)


def test_chat_in_a_terminal_on_a_hybrid_model_gives_plain_decodings_replies(arch_dir, tmp_path):
    import json

    pexpect = pytest.importorskip("pexpect")
    saved = tmp_path / "conv.json"
    child = spawn_localspec(["chat", "-t", str(arch_dir / "qwen35.gguf"), "-d", str(arch_dir / "qwen35-draft.gguf"),
                             "-n", "12", "--method", "draft"], tmp_path / "home")
    try:
        for turn in ("in the end, in the end", "and then?", "in the end"):
            child.expect(">>>")
            child.send(turn + "\r")
            child.expect(r"\[\d+ tokens")
        child.expect(">>>")
        child.send(f"/save {saved}\r")
        child.expect("saved 6 messages")
        child.expect(">>>")
        child.send("/exit\r")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    messages = json.loads(saved.read_text())["messages"]
    assert sum(len(m["content"]) for m in messages[1::2]) > 10  # the replies say something
    with localspec.load(arch_dir / "qwen35.gguf", history=False) as fresh:
        for i in range(1, len(messages), 2):  # each reply, against plain decoding of its whole conversation
            want = fresh.chat(messages[:i], max_tokens=12, method="plain")
            fresh.reset()
            assert messages[i]["content"] == want.text, f"reply {i // 2 + 1} of the chat differs"
