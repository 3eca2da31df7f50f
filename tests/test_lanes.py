"""``Pair.generate_many``: several generations decoded together, each giving what it gives alone."""

from __future__ import annotations

import collections
import contextlib
import threading

import numpy as np
import pytest

import localspec
from localspec.constraint import Constraint
from localspec.drafting.costs import CostProfile
from localspec.errors import ConfigError, ContextOverflowError, InterleavedGenerationError
from localspec.runtime.model import Model

# Memory-bound (a GPU): a draft model pays, so auto drafts with it too.
GPU = CostProfile.synthetic([1.0] * 9, 0.1, name="gpu-like")

PROMPTS = ["The cat sat on the mat and the dog sat on the", "in the end, in the end, in the end, in the",
           "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n",
           [{"role": "user", "content": "Say the alphabet."}],
           "Once upon a time there was a", [{"role": "user", "content": "Count: one, two, three, four,"}]]


@pytest.fixture(scope="module")
def pairs(tiny_dir):
    alone = localspec.load(tiny_dir / "target.gguf", tiny_dir / "draft.gguf", n_ctx=1024, history=False,
                           prompt_cache=False)
    together = localspec.load(tiny_dir / "target.gguf", tiny_dir / "draft.gguf", n_ctx=1024, history=False,
                              prompt_cache=False, parallel=4)
    for pair in (alone, together):
        pair.set_profile(GPU)
    yield alone, together
    alone.close()
    together.close()


def _alone(pair, prompt, **options):
    return pair.chat(prompt, **options) if isinstance(prompt, list) else pair.generate(prompt, **options)


@pytest.mark.parametrize("method", ["plain", "lookup", "draft", "auto"])
def test_each_prompt_decoded_together_gives_its_tokens_alone(pairs, method):
    alone, together = pairs
    options = dict(max_tokens=40, method=method)
    expected = [_alone(alone, p, **options).tokens for p in PROMPTS]
    results = together.generate_many(PROMPTS, **options)
    assert [r.tokens for r in results] == expected
    assert all(r.stats.method == method for r in results)
    assert max(r.stats.batch_width for r in results) > 1  # their tokens shared decodes
    assert all(r.stats.batch_width == 1 for r in (_alone(alone, PROMPTS[0], **options),))


def test_a_seeded_sample_decoded_together_draws_what_it_draws_alone(pairs):
    alone, together = pairs
    options = dict(max_tokens=32, method="draft", temperature=0.9, seed=7)
    expected = [_alone(alone, p, **options).tokens for p in PROMPTS[:4]]
    assert [r.tokens for r in together.generate_many(PROMPTS[:4], **options)] == expected


def test_a_grammar_holds_for_each_prompt_decoded_together(pairs):
    alone, together = pairs
    pytest.importorskip("llguidance")
    options = dict(max_tokens=24, method="lookup", grammar=Constraint.regex(r"(yes|no|[a-z]+ [0-9]+)"))
    expected = [_alone(alone, p, **options).text for p in PROMPTS[:4]]
    assert [r.text for r in together.generate_many(PROMPTS[:4], **options)] == expected


def test_one_prompt_that_overflows_fails_alone_and_the_others_finish(pairs):
    _, together = pairs
    prompts = [PROMPTS[0], "word " * 2000, PROMPTS[1]]
    results = together.generate_many(prompts, max_tokens=16, return_exceptions=True)
    assert isinstance(results[1], ContextOverflowError)
    assert all(len(r.tokens) == 16 for r in (results[0], results[2]))
    with pytest.raises(ContextOverflowError):
        together.generate_many(prompts, max_tokens=16)


def test_more_prompts_than_sequences_wait_for_a_free_one(pairs):
    alone, together = pairs
    prompts = [f"Item {i}: the" for i in range(9)]
    expected = [alone.generate(p, max_tokens=12).tokens for p in prompts]
    assert [r.tokens for r in together.generate_many(prompts, max_tokens=12)] == expected


def test_a_prompt_an_idle_lane_holds_is_shared_not_read_again(pairs):
    alone, together = pairs
    system = "You are a careful assistant. " * 12 + "Answer in one line.\n"
    for i in range(together.lanes.width):
        together.lanes.lane(i).reset()
    first = together.generate_many([system + "Task: name a colour."], max_tokens=8)[0]  # on the pair: lane 0
    assert first.stats.cached_prompt_tokens < 10  # nothing to share yet
    tasks = [system + f"Task: {t}" for t in ("count to three.", "say hello.", "name a fruit.")]
    expected = [alone.generate(t, max_tokens=16).tokens for t in tasks]
    # empty lanes go first: each starts from the idle lane that read the system prompt
    results = together.generate_many(tasks, max_tokens=16)
    assert [r.tokens for r in results] == expected
    prefix = len(together.target.tokenize(system))
    assert all(r.stats.cached_prompt_tokens >= prefix - 2 for r in results), [r.stats.cached_prompt_tokens
                                                                                 for r in results]


def test_an_idle_conversation_the_prompt_cache_holds_leaves_the_cells_and_comes_back_exact(tiny_dir, pairs):
    from localspec.prompt_cache.cache import PromptCache

    alone = pairs[0]
    a = [{"role": "system", "content": "You are a careful assistant. " * 12}, {"role": "user", "content": "Hi."}]
    b = [{"role": "system", "content": "Another prompt, about cats and mats. " * 12},
         {"role": "user", "content": "Count to ten."}]
    options = dict(max_tokens=12, method="draft")

    def then(conv, reply, ask):
        return [*conv, {"role": "assistant", "content": reply}, {"role": "user", "content": ask}]

    a_alone, b_alone = (alone.chat(c, **options) for c in (a, b))
    with localspec.load(tiny_dir / "target.gguf", tiny_dir / "draft.gguf", n_ctx=2048, history=False,
                        prompt_cache=PromptCache(2**28, weigh=False), parallel=2) as together:
        together.set_profile(GPU)
        first = together.generate_many([a, b], **options)
        assert [r.tokens for r in first] == [a_alone.tokens, b_alone.tokens]
        other = together.lanes.lane(1)
        other.target.eval(other.target.tokenize("A conversation the cache does not hold. " * 8), logits="none")
        a2 = then(a, a_alone.text, "And again.")
        assert together.chat(a2, **options).tokens == alone.chat(a2, **options).tokens  # on lane 0
        assert other.target.n_past > 0  # not in the prompt cache: it stays
        other.target.reset()
        together.generate_many([a, b], **options)  # each lane's conversation saved as it ends
        assert together.chat(a2, **options).tokens == alone.chat(a2, **options).tokens
        # the other lane's conversation is in the prompt cache: its cells were let go, the attention spans a's
        assert (other.target.n_past, other.draft.n_past) == (0, 0)
        b2 = then(b, b_alone.text, "Now to five.")
        again = together.chat(b2, **options)
        assert again.tokens == alone.chat(b2, **options).tokens and again.stats.restored_prompt_tokens > 100


def test_prompts_sent_together_read_their_common_prefix_once(pairs, monkeypatch):
    alone, together = pairs
    system = "You are a careful sub-agent; answer in one line. " * 4 + "\n"
    tasks = [system + f"Task: {t}" for t in ("count to three.", "say hello.", "name a fruit.", "add 2 and 2.")]
    expected = [alone.generate(t, max_tokens=16, method="draft").tokens for t in tasks]
    for i in range(together.lanes.width):
        together.lanes.lane(i).reset()  # nothing held: the first to read the system prompt lends it
    read: collections.Counter[str] = collections.Counter()  # prompt tokens each model's sequences evaluated
    evaluate = Model.eval

    def counted(model, tokens, **kwargs):
        read[model.path.name] += len(tokens) if len(tokens) > 16 else 0  # not a round's few tokens
        return evaluate(model, tokens, **kwargs)

    monkeypatch.setattr(Model, "eval", counted)
    results = together.generate_many(tasks, max_tokens=16, method="draft")
    monkeypatch.undo()
    assert [r.tokens for r in results] == expected
    prefix = len(together.target.tokenize(system))
    shared = sorted(r.stats.cached_prompt_tokens for r in results)
    assert shared[0] < 10 and all(n >= prefix - 2 for n in shared[1:]), shared  # one reads it, three share it
    # the draft model's sequences too: the system prompt read once, not four times
    prompts = sum(len(together.target.tokenize(t)) for t in tasks)
    assert read["target.gguf"] < prompts - 2 * prefix and read["draft.gguf"] < prompts - 2 * prefix, read
    sampled = dict(max_tokens=16, method="draft", temperature=0.8, seed=3)  # auto's choices would vary the draws
    again = together.generate_many(tasks, **sampled)  # the system prompt held by every lane now
    assert [r.tokens for r in again] == [alone.generate(t, **sampled).tokens for t in tasks]


@contextlib.contextmanager
def _sub_agent_lanes(together):
    """The pair's lanes, emptied and attached to a batcher, and two prompts that share a system prompt."""
    from localspec.runtime.batching import StepBatcher

    lanes = together.lanes
    for i in range(lanes.width):
        lanes.lane(i).reset()
    system = together.target.tokenize("You are a careful sub-agent; answer in one line. " * 4)
    mine, theirs = (np.array(system + together.target.tokenize(t), dtype=np.int32) for t in ("Task: a", "Task: b"))
    batcher = StepBatcher()
    lanes.attach(batcher)
    try:
        yield lanes, system, mine, theirs
    finally:
        lanes.attach(None)
        batcher.close()


def test_a_draft_sequence_borrows_what_a_busy_lane_s_draft_read_of_its_prompt(pairs):
    _, together = pairs
    with _sub_agent_lanes(together) as (lanes, system, mine, theirs):
        held = [lanes.acquire(), lanes.acquire()]
        source, borrower = (lanes.lane(s) for s in held)
        lanes.share(source.target, theirs)  # it starts reading: what it reads may be lent
        source.draft.eval(theirs, logits="none")  # its draft has read the prompt; the borrower's has not
        borrower.draft.borrow(mine[:-1])
        common = int(np.flatnonzero(mine[:len(theirs)] != theirs[:len(mine)])[0])
        assert common >= len(system) and borrower.draft.n_past == common
        assert list(borrower.draft.tokens) == list(mine[:common])
        source.draft.truncate(len(theirs) - 1)  # the lender goes on: what was lent stays
        with together.draft.reopen() as fresh:  # the same tokens read by a model of its own
            expected = fresh.eval(mine, logits="last")[0].copy()
        got = borrower.draft.eval(mine[common:], logits="last")[0]
        assert int(got.argmax()) == int(expected.argmax()) and np.allclose(got, expected, atol=1e-3)
        for s in held:
            lanes.release(s)


def test_a_lane_waiting_for_another_s_prompt_stops_waiting_when_its_client_leaves(pairs):
    _, together = pairs
    with _sub_agent_lanes(together) as (lanes, _, mine, theirs):
        reader = lanes.acquire()
        lanes.share(lanes.lane(reader).target, theirs[:-1])  # it reads: never, here
        gone = threading.Event()
        steps: list[int] = []  # how many steps had come when the newcomer was ready

        def newcomer() -> None:
            seq = lanes.acquire(gone)
            lanes.ready(lanes.lane(seq).target, mine, 8)  # waits for the reader's cells
            steps.append(batcher.steps)
            lanes.release(seq)

        def other() -> None:  # the loop steps on: a lane decoding beside them, whose client leaves after 20 steps
            draft = lanes.lane(reader).draft
            draft.eval([5, 6, 7], logits="none")
            for _ in range(40):
                if batcher.steps >= 20:
                    gone.set()
                draft.eval([5], logits="last")

        batcher = lanes._batcher
        members = [batcher.spawn(newcomer), batcher.spawn(other)]
        batcher.drive()
        for m in members:
            m.result()
        assert gone.is_set() and steps and steps[0] >= 20  # it waited for the prefix until its client left
        lanes.release(reader)


def test_results_come_as_they_finish_and_leaving_early_cancels_the_rest(pairs):
    alone, together = pairs
    prompts = ["Short: the", *(f"Long {i}: once upon a time" for i in range(5))]
    options = [together.options(max_tokens=4)] + [together.options(max_tokens=200)] * 5
    expected = alone.generate(prompts[0], max_tokens=4).tokens
    results = together.generate_each(prompts, options)
    i, first = next(results)
    assert (i, first.tokens) == (0, expected)  # the short one is done first
    # while the loop is paused, the lanes are busy: another generation on the pair is refused, not interleaved
    with pytest.raises(InterleavedGenerationError):
        together.generate("The cat", max_tokens=4)
    with pytest.raises(InterleavedGenerationError):
        together.generate_many(["The cat"], max_tokens=4)
    results.close()  # leaving early: the running ones end as interrupted, the waiting ones never start
    # the lanes are free again, and exact
    assert [r.tokens for r in together.generate_many(prompts[:2], max_tokens=8)] == [
        alone.generate(p, max_tokens=8).tokens for p in prompts[:2]]


def test_each_prompt_may_have_its_own_options(pairs):
    alone, together = pairs
    options = [together.options(max_tokens=n, method=m) for n, m in ((6, "plain"), (12, "lookup"), (9, "draft"))]
    got = dict(together.generate_each(PROMPTS[:3], options))
    assert [got[i].tokens for i in range(3)] == [_alone(alone, p, max_tokens=o.max_tokens, method=o.method).tokens
                                                 for p, o in zip(PROMPTS[:3], options, strict=True)]
    with pytest.raises(ConfigError, match="2 options for 3 prompts"):
        together.generate_each(PROMPTS[:3], options[:2])


def test_a_pair_of_one_sequence_runs_them_one_after_another_and_bad_input_is_refused(pairs):
    alone, _ = pairs
    said: list[str] = []
    notify, alone.notify = alone.notify, said.append
    try:
        results = alone.generate_many(PROMPTS[:2], max_tokens=8)
        alone.generate_many(PROMPTS[:2], max_tokens=2)
    finally:
        alone.notify = notify
    assert [r.tokens for r in results] == [alone.generate(p, max_tokens=8).tokens for p in PROMPTS[:2]]
    alone_notes = [line for line in said if "one after another" in line]
    assert len(alone_notes) == 1 and "parallel=4" in alone_notes[0]  # said once
    assert alone.generate_many([]) == []
    with pytest.raises(ConfigError, match="Prompt 1"):
        alone.generate_many(["fine", []])
    with pytest.raises(ConfigError, match="max_tokens"):
        alone.generate_many(["fine"], max_tokens=0)


@pytest.fixture(scope="module")
def arch_pairs(tmp_path_factory):
    from tinyarch import write_tiny_gemma2, write_tiny_lfm2, write_tiny_mamba, write_tiny_qwen35

    d = tmp_path_factory.mktemp("lanes-arch")
    opened = {}
    for name, write in {"mamba": write_tiny_mamba, "qwen35": write_tiny_qwen35, "lfm2": write_tiny_lfm2,
                        "gemma2": write_tiny_gemma2}.items():
        write(d / f"{name}.gguf", seed=0)
        write(d / f"{name}-draft.gguf", seed=0, noise=0.35)
        opened[name] = tuple(localspec.load(d / f"{name}.gguf", d / f"{name}-draft.gguf", n_ctx=1024, history=False,
                                            prompt_cache=False, parallel=n) for n in (1, 3))
    yield opened
    for pair in (p for both in opened.values() for p in both):
        pair.close()


@pytest.mark.parametrize("arch", ["mamba", "qwen35", "lfm2", "gemma2"])
@pytest.mark.parametrize("method", ["plain", "lookup", "draft"])
def test_every_memory_decoded_together_gives_its_tokens_alone(arch_pairs, arch, method):
    alone, together = arch_pairs[arch]
    prompts = [p for p in PROMPTS if isinstance(p, str)][:3]
    expected = [alone.generate(p, max_tokens=32, method=method).tokens for p in prompts]
    results = together.generate_many(prompts, max_tokens=32, method=method)
    assert [r.tokens for r in results] == expected, f"{arch} {method}"
    if method == "draft":
        assert sum(r.stats.rewinds for r in results) >= (1 if arch == "mamba" else 0)  # checkpoints, per sequence


@pytest.mark.parametrize("arch", ["mamba", "qwen35", "lfm2", "gemma2"])
def test_every_memory_under_auto_and_a_grammar_stays_exact_beside_a_prompt_that_overflows(arch_pairs, arch):
    pytest.importorskip("llguidance")
    alone, together = arch_pairs[arch]
    options = dict(max_tokens=24, method="auto", grammar=Constraint.regex(r"([a-z]+ )+[0-9]+"))
    prompts = [p for p in PROMPTS if isinstance(p, str)][:3]
    for pair in (alone, together):
        pair.set_profile(GPU)  # where a draft model pays: auto drafts with it as well as by lookup
    try:
        expected = [alone.generate(p, **options).tokens for p in prompts]
        too_long = " ".join([PROMPTS[2]] * 60)  # more tokens than the context holds
        results = together.generate_many([prompts[0], too_long, *prompts[1:]], return_exceptions=True, **options)
    finally:
        for pair in (alone, together):
            pair.set_profile(None)
    assert isinstance(results[1], ContextOverflowError), results[1]
    assert [r.tokens for r in (results[0], *results[2:])] == expected, arch
    assert {r.stats.method for r in (results[0], *results[2:])} == {"auto"}


# Compute-bound (a 2-core CPU): a prompt beside decoding lanes is read in chunks of 50 tokens.
CPU = CostProfile.synthetic([1.0, 1.7, 2.35, 3.0, 3.6, 4.2, 4.8, 5.4, 6.0], 0.55, name="cpu-like")


def _steps_seen(monkeypatch, longer: int) -> list[tuple[bool, bool, int]]:
    """Each joint decode of a context from now on: whether it held a stream (a round, a token), whether a
    prompt longer than ``longer`` was still being read beside, and how many of its tokens the decode took."""
    from localspec.runtime import batching

    seen: list[tuple[bool, bool, int]] = []
    decode_group = batching.StepBatcher._decode_group

    def watched(self, group, streams, base, shortest):
        long = [call for call in group if (call.model.reading_end or 0) > longer]
        before = sum(call.done for call in long)
        held = decode_group(self, group, streams, base, shortest)
        seen.append((any(streams), bool(long), sum(call.done for call in long) - before))
        return held

    monkeypatch.setattr(batching.StepBatcher, "_decode_group", watched)
    return seen


@pytest.mark.parametrize("arch", ["mamba", "qwen35", "lfm2", "gemma2"])
@pytest.mark.parametrize("reply, repeats", [(2, 16), (150, 6)])
def test_a_long_prompt_read_in_chunks_beside_decoding_lanes_changes_no_token(arch_pairs, arch, reply, repeats,
                                                                              monkeypatch):
    from localspec.drafting.costs import prompt_chunk

    alone, together = arch_pairs[arch]
    assert prompt_chunk(CPU) == 50
    prompts = [PROMPTS[0], " ".join([PROMPTS[2]] * repeats), PROMPTS[1]]
    expected = [alone.generate(p, max_tokens=reply, method="lookup").tokens for p in prompts]
    together.set_profile(CPU)
    seen = _steps_seen(monkeypatch, longer=100)
    try:
        results = together.generate_many(prompts, max_tokens=reply, method="lookup")
    finally:
        together.set_profile(None)
    assert [r.tokens for r in results] == expected, arch
    # beside replies of 150 tokens the long prompt may be read in chunks of 50 as they decode; beside replies of
    # 2, done sooner than its reading would keep them, it waits for them: their steps read at most what
    # lengthens them by a tenth (a token or three on this curve)
    if reply == 2:
        beside = [taken for stream, long, taken in seen if stream and long]
        assert beside and all(taken < 10 for taken in beside), seen


@pytest.fixture(scope="module")
def head_pairs(tmp_path_factory):
    """A qwen35 target whose MTP head often guesses the target's token, from the token and the hidden state it
    is given (so a head given another position's hidden rows guesses otherwise), alone and with 3 sequences."""
    from tinyarch import write_tiny_qwen35

    path = tmp_path_factory.mktemp("lanes-mtp") / "target.gguf"
    write_tiny_qwen35(path, seed=0, trunk=0.2, bigram_head=True, head_hidden=0.5)
    opened = tuple(localspec.load(path, n_ctx=1024, history=False, prompt_cache=False, parallel=n) for n in (1, 3))
    yield opened
    for pair in opened:
        pair.close()


@pytest.mark.parametrize("options", [
    {}, {"grammar": Constraint.regex("(cat|dog|bird)s? (sat|ran) on the [a-z]{1,8}")},
    {"temperature": 0.9, "seed": 7}])
def test_each_sequence_s_mtp_head_drafts_from_its_own_hidden_states(head_pairs, options):
    alone, together = head_pairs
    prompts = [p for p in PROMPTS if isinstance(p, str)][:3]
    opts = {"max_tokens": 32, "method": "mtp", "k": 3, **options}
    expected = [alone.generate(p, **opts) for p in prompts]
    for _ in range(3):  # the steps' makeup varies from run to run (a state rolled back wrong showed in half)
        results = together.generate_many(prompts, **opts)
        assert [r.tokens for r in results] == [e.tokens for e in expected]
    assert max(r.stats.batch_width for r in results) > 1
    # each head guesses what it guesses alone: it reads its own sequence's hidden rows, not another's
    assert [r.stats.accepted_by.get("mtp", 0) for r in results] == [e.stats.accepted_by.get("mtp", 0)
                                                                     for e in expected]
    assert sum(r.stats.accepted_by.get("mtp", 0) for r in results) > 0
    # every lane's target keeps hidden rows, whichever head opened first (a lane that started to would empty
    # its cache, and lanes only share cells with lanes that keep them too)
    assert all(together.lanes.lane(i).target.keeps_hidden for i in range(together.lanes.width))


def test_auto_drafts_with_each_sequence_s_head_where_the_costs_let_it(head_pairs):
    alone, together = head_pairs
    prompts = [p for p in PROMPTS if isinstance(p, str)][:3]
    expected = [alone.generate(p, max_tokens=32, method="plain").tokens for p in prompts]
    flat = CostProfile([0.01 * (1 + 0.02 * n) for n in range(9)], 0.0, 2e-5, "flat", mtp_step=0.001)
    together.set_profile(flat)  # a GPU-like curve: a guess of the head costs a tenth of a step
    try:
        results = together.generate_many(prompts, max_tokens=32, method="auto")
    finally:
        together.set_profile(None)
    assert [r.tokens for r in results] == expected
    assert all(r.stats.rounds_by_method.get("mtp", 0) > 0 for r in results)


def _no_end(pair) -> dict[int, float]:
    """A logit bias that bans every end-of-generation token: each reply runs to its max_tokens (or the context)."""
    return {t: -100.0 for t in range(pair.target.n_vocab) if pair.target.is_eog(t)}


@pytest.mark.parametrize("method", ["plain", "lookup", "draft", "auto"])
def test_requests_that_fit_alone_but_not_together_wait_for_room_and_give_what_they_give_alone(pairs, method):
    # six short prompts of 300 tokens each on four sequences of 1024 cells; then five prompts of ~700 tokens
    alone, together = pairs
    options = dict(max_tokens=300, method=method, logit_bias=_no_end(together))
    short = [f"Request {i}: the cat sat on the" for i in range(6)]
    waits = together.lanes.room_waits
    expected = [alone.generate(p, **options).tokens for p in short]
    assert [r.tokens for r in together.generate_many(short, **options)] == expected
    assert all(len(t) == 300 for t in expected) and together.lanes.room_waits > waits
    options["max_tokens"] = 40
    long = [f"Document {i}: " + "the cat sat on the mat and the dog sat on the log. " * 24 for i in range(5)]
    assert 600 < len(together.target.tokenize(long[0])) < 900
    expected = [alone.generate(p, **options).tokens for p in long]
    assert [r.tokens for r in together.generate_many(long, **options)] == expected


def test_replies_longer_than_the_typical_one_are_set_aside_and_brought_back_exact(tiny_dir):
    # requests that set no max_tokens are counted as typical replies (short here, as the first ones ended at
    # once), all start, and run out of cells: the ones started last are set aside and come back when room does
    with localspec.load(tiny_dir / "target.gguf", tiny_dir / "draft.gguf", n_ctx=1024, history=False,
                        prompt_cache=False) as alone, \
            localspec.load(tiny_dir / "target.gguf", tiny_dir / "draft.gguf", n_ctx=1024, history=False,
                           prompt_cache=False, parallel=4) as together:
        ends = {t: 100.0 for t in _no_end(together)}
        prompts = [f"Request {i}: the cat sat on the" for i in range(4)]
        together.generate_many(prompts, max_tokens=2000, logit_bias=ends)  # each ends at its first token
        assert together.lanes.typical_reply() == 0
        waits = together.lanes.room_waits
        options = dict(max_tokens=2000, method="draft", logit_bias=_no_end(together))
        expected = [alone.generate(p, **options) for p in prompts[:3]]
        results = together.generate_many(prompts[:3], **options)
        assert [r.tokens for r in results] == [e.tokens for e in expected]
        assert {r.finish_reason for r in results} == {"length"}  # each filled the context, as alone
        assert together.lanes.set_aside >= 2 and together.lanes.room_waits == waits  # none waited: all began


def _typical_reply_made_short(together) -> None:
    """Replies that end at once, so that requests setting no max_tokens are counted as short ones and all begin
    (the ones that then run longer are set aside as the cells run out)."""
    ends = {t: 100.0 for t in _no_end(together)}
    for _ in range(30):  # the typical reply is the median of the latest ones: enough short ones outweigh the rest
        together.generate_many(["Hi.", "Hello.", "Hey."], max_tokens=4000, logit_bias=ends)
        if together.lanes.typical_reply() == 0:
            return
    raise AssertionError(f"the typical reply is still {together.lanes.typical_reply()} tokens")


@pytest.mark.parametrize("arch", ["mamba", "qwen35", "lfm2", "gemma2"])
def test_every_memory_set_aside_for_want_of_cells_comes_back_exact(arch_pairs, arch):
    alone, together = arch_pairs[arch]
    _typical_reply_made_short(together)
    prompts = [p for p in PROMPTS if isinstance(p, str)][:3]
    options = dict(max_tokens=4000, method="draft", logit_bias=_no_end(together))
    expected = [alone.generate(p, **options).tokens for p in prompts]
    before = together.lanes.set_aside
    results = together.generate_many(prompts, **options)
    assert [r.tokens for r in results] == expected, arch
    # a recurrent state is one cell a sequence: only the attention of the others runs out of cells
    assert together.lanes.set_aside > before or arch == "mamba"


def test_a_sequence_with_an_mtp_head_set_aside_comes_back_exact(head_pairs):
    alone, together = head_pairs
    _typical_reply_made_short(together)
    prompts = [p for p in PROMPTS if isinstance(p, str)][:3]
    options = dict(max_tokens=4000, method="mtp", k=3, logit_bias=_no_end(together))
    expected = [alone.generate(p, **options) for p in prompts]
    before = together.lanes.set_aside
    results = together.generate_many(prompts, **options)
    assert [r.tokens for r in results] == [e.tokens for e in expected]
    assert [r.stats.accepted_by.get("mtp", 0) for r in results] == [e.stats.accepted_by.get("mtp", 0)
                                                                     for e in expected]
    assert together.lanes.set_aside > before
