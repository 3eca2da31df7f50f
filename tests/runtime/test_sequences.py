"""Several sequences in one context: each evaluated, cut back, checkpointed, saved and loaded alone, and their
decode calls gathered into joint decodes by a ``StepBatcher``, each giving what it gives alone."""

from __future__ import annotations

import functools
import threading
from pathlib import Path

import llama_cpp as ll
import numpy as np
import pytest
from tinyarch import write_tiny_mamba, write_tiny_qwen35

from localspec.errors import ConfigError, ContextOverflowError, GenerationCancelled
from localspec.runtime import memory
from localspec.runtime.batching import StepBatcher
from localspec.runtime.model import Model

PROMPTS = ["The cat sat on the mat and the dog sat on the", "in the end, in the end, in the end, in the",
           "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n", "Once upon a time there was a"]


@pytest.fixture(scope="module")
def recurrent_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("seqarch")
    write_tiny_mamba(d / "mamba.gguf", seed=0)
    write_tiny_qwen35(d / "qwen35.gguf", seed=0)
    return d


def greedy(model: Model, prompt: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
    """``n`` greedy tokens after ``prompt``, one decode per token, and the rows they were chosen from."""
    row = model.eval(prompt, logits="last")[0]
    out, rows = [], []
    for _ in range(n):
        rows.append(np.array(row))
        out.append(int(np.argmax(row)))
        row = model.eval([out[-1]], logits="last")[0]
    return out, rows


def test_each_sequence_keeps_its_own_cache_and_gives_what_a_model_of_one_gives(tiny_dir):
    with Model(tiny_dir / "target.gguf", n_ctx=1024) as alone, \
            Model(tiny_dir / "target.gguf", n_ctx=1024, n_seq=3) as shared:
        seqs = [shared, shared.sequence(1), shared.sequence(2)]
        prompts = [alone.tokenize(p) for p in PROMPTS[:3]]
        for seq, prompt in zip(seqs, prompts, strict=True):
            seq.eval(prompt, logits="none")
        for seq, prompt in zip(seqs, prompts, strict=True):  # interleaved: each continues from its own cells
            alone.reset()
            expected, expected_rows = greedy(alone, prompt, 12)
            seq.truncate(0)
            got, rows = greedy(seq, prompt, 12)
            assert got == expected
            np.testing.assert_allclose(np.array(rows), np.array(expected_rows), atol=1e-3)
        seqs[1].truncate(5)
        seqs[2].reset()
        assert seqs[1].n_past == 5 and seqs[2].n_past == 0 and seqs[0].n_past == len(prompts[0]) + 12
        alone.reset()  # what sequence 0 still holds continues as it would alone
        held = seqs[0].tokens.tolist()
        np.testing.assert_allclose(seqs[0].eval([7], logits="last")[0], alone.eval([*held, 7], logits="last")[0],
                                   atol=1e-3)


def test_a_sequence_out_of_range_is_refused_with_what_to_do(tiny_dir):
    with Model(tiny_dir / "draft.gguf", n_ctx=256, n_seq=2) as m:
        with pytest.raises(ConfigError, match="n_seq"):
            m.sequence(2)
        with pytest.raises(ConfigError, match="n_seq"):
            m.sequence(1).sequence(1)
    with pytest.raises(ConfigError, match="1 to"):
        Model(tiny_dir / "draft.gguf", n_ctx=256, n_seq=0)


def test_a_state_saved_from_one_sequence_loads_into_another_model(tiny_dir):
    with Model(tiny_dir / "target.gguf", n_ctx=512, n_seq=2) as shared, \
            Model(tiny_dir / "target.gguf", n_ctx=512) as alone:
        other = shared.sequence(1)
        shared.eval(alone.tokenize(PROMPTS[1]), logits="none")
        prompt = alone.tokenize(PROMPTS[0])
        expected = np.array(other.eval(prompt, logits="last")[0])
        data = other.save_state()
        assert alone.load_state(np.array(prompt), data)
        other.reset()
        assert other.load_state(np.array(prompt), data) and other.n_past == len(prompt)
        np.testing.assert_allclose(alone.eval([5], logits="last")[0], other.eval([5], logits="last")[0], atol=1e-3)
        assert shared.n_past == len(alone.tokenize(PROMPTS[1]))  # the other sequence was left alone
        alone.truncate(len(prompt) - 1)
        np.testing.assert_allclose(alone.eval(prompt[-1:], logits="last")[0], expected, atol=1e-3)


def test_a_sequence_takes_another_ones_prefix_without_reading_it(tiny_dir):
    with Model(tiny_dir / "target.gguf", n_ctx=1024) as alone, \
            Model(tiny_dir / "target.gguf", n_ctx=1024, n_seq=2) as shared:
        system = alone.tokenize(PROMPTS[0] + " " + PROMPTS[2])
        mine = system + alone.tokenize(" and then", add_special=False)
        alone.eval(mine, logits="none")
        expected = _continue(alone, 16)
        first, second = shared, shared.sequence(1)
        first.eval(system + alone.tokenize(" elsewhere", add_special=False), logits="none")
        second.eval(alone.tokenize(PROMPTS[1]), logits="none")  # what it held goes
        calls = second.decode_calls
        second.copy_prefix(first, len(system))
        assert second.n_past == len(system) and second.decode_calls == calls  # nothing evaluated
        second.eval(mine[len(system):], logits="none")
        assert _continue(second, 16) == expected
        assert first.n_past == len(system) + len(alone.tokenize(" elsewhere", add_special=False))
        held = list(second.tokens)
        assert not second.copy_prefix(first, first.n_past + 1)  # more than it holds (it may have cut back)
        assert list(second.tokens) == held  # nothing tried, nothing lost
        # its cells gone between a look at its record and the copy (a restore refused): the copy sees it
        ll.llama_memory_seq_rm(first._mem, first.seq, -1, -1)
        assert not second.copy_prefix(first, len(system)) and second.n_past == 0
        assert int(ll.llama_memory_seq_pos_max(second._mem, second.seq)) == -1
        first.reset()
        with pytest.raises(ValueError, match="cannot share"):
            second.copy_prefix(second, 2)


def test_a_recurrent_state_is_never_shared(recurrent_dir):
    with Model(recurrent_dir / "mamba.gguf", n_ctx=512, n_seq=2) as shared:
        shared.eval(shared.tokenize(PROMPTS[0]), logits="none")
        with pytest.raises(ValueError, match="cannot share"):
            shared.sequence(1).copy_prefix(shared, 3)


@pytest.mark.parametrize("arch", ["mamba", "qwen35"])
def test_a_recurrent_sequence_goes_back_through_its_own_checkpoints(recurrent_dir, arch):
    path = recurrent_dir / f"{arch}.gguf"
    with Model(path, n_ctx=512) as alone, Model(path, n_ctx=512, n_seq=2) as shared:
        first, second = shared, shared.sequence(1)
        prompt = alone.tokenize(PROMPTS[0])
        expected, _ = greedy(alone, prompt, 10)
        first.eval(alone.tokenize(PROMPTS[2]), logits="none")
        second.eval(prompt, logits="none")
        second.checkpoint()
        first.eval([3, 4, 5], logits="none")
        second.eval([9] * 12, logits="none")  # a wrong guess, cut back by the checkpoint
        second.truncate(len(prompt))
        assert second.n_past == len(prompt) and first.n_past == len(alone.tokenize(PROMPTS[2])) + 3
        second.truncate(len(prompt) - 1)
        got, _ = greedy(second, prompt[-1:], 10)
        assert got == expected
        assert first.memory.kind == memory.CHECKPOINT  # several sequences: no rollback snapshots


def _run_together(models: list[Model], prompts: list[list[int]], n: int, batcher: StepBatcher,
                  aborts: list[threading.Event] | None = None) -> list[object]:
    results: list[object] = [None] * len(models)

    def work(i: int) -> None:
        try:
            abort = aborts[i] if aborts else None
            models[i].eval(prompts[i], logits="none", abort=abort)
            results[i] = _continue(models[i], n)
        except Exception as exc:  # the test reads it
            results[i] = exc

    _members(batcher, models, *(functools.partial(work, i) for i in range(len(models))))
    return results


def _members(batcher: StepBatcher, seqs: list[Model], *works) -> None:
    """Each of ``works`` as a member of ``batcher``, all started at once and driven to their end (an error in
    one is raised); then ``seqs`` are detached and the batcher closed."""
    members = [batcher.spawn(work) for work in works]
    batcher.drive()
    assert all(m.done for m in members)
    for s in seqs:
        s.attach(None)
    batcher.close()
    for m in members:
        m.result()


def _continue(model: Model, n: int) -> list[int]:
    """``n`` greedy tokens after what the model holds (its last token evaluated again for its row)."""
    last = int(model.tokens[-1])
    model.truncate(model.n_past - 1)
    row = model.eval([last], logits="last")[0]
    out = []
    for _ in range(n):
        out.append(int(np.argmax(row)))
        row = model.eval([out[-1]], logits="last")[0]
    return out


def test_sequences_decoded_together_give_each_its_own_tokens_in_fewer_decodes(tiny_dir):
    with Model(tiny_dir / "target.gguf", n_ctx=2048) as alone, \
            Model(tiny_dir / "target.gguf", n_ctx=2048, n_seq=4) as shared:
        prompts = [alone.tokenize(p) for p in PROMPTS]
        expected = []
        for prompt in prompts:
            alone.reset()
            alone.eval(prompt, logits="none")
            expected.append(_continue(alone, 16))
        seqs = [shared, *(shared.sequence(i) for i in range(1, 4))]
        batcher = StepBatcher()
        for s in seqs:
            s.attach(batcher)
        got = _run_together(seqs, prompts, 16, batcher)
        assert got == expected
        assert batcher.widest == 4
        assert batcher.steps < sum(s.decode_calls for s in seqs)  # the calls shared decodes
        # the last step held a token of every sequence: each saw three streams beside it
        assert [s.beside for s in seqs] == [(3, 3, 3)] * 4


@pytest.mark.parametrize("chunk", [None, 16])
def test_a_long_prompt_is_read_across_steps_while_the_others_decode(tiny_dir, chunk):
    with Model(tiny_dir / "target.gguf", n_ctx=4096, n_batch=64) as alone, \
            Model(tiny_dir / "target.gguf", n_ctx=4096, n_batch=64, n_seq=2) as shared:
        long = alone.tokenize(" ".join(PROMPTS * 12))
        short = alone.tokenize(PROMPTS[0])
        assert len(long) > 4 * 64
        expected = []
        for prompt in (long, short):
            alone.reset()
            alone.eval(prompt, logits="none")
            expected.append(_continue(alone, 40))
        seqs = [shared, shared.sequence(1)]
        batcher = StepBatcher(stream_chunk=chunk)
        for s in seqs:
            s.attach(batcher)
        assert _run_together(seqs, [long, short], 40, batcher) == expected
        assert batcher.widest == 2


@pytest.mark.parametrize("chunk, own", [(None, 6), (16, 6), (16, 40)])
def test_a_stream_decoding_beside_a_prompt_sees_the_prompt_chunk_that_shares_its_step(tiny_dir, chunk, own):
    with Model(tiny_dir / "target.gguf", n_ctx=4096, n_batch=64, n_seq=2) as shared:
        long = shared.tokenize(" ".join(PROMPTS * 12))
        mine = shared.tokenize(" ".join(PROMPTS))[:own]
        seqs = [shared, shared.sequence(1)]
        batcher = StepBatcher(stream_chunk=chunk)
        for s in seqs:
            s.attach(batcher)
        seen: list[tuple[int, int, int]] = []

        def read() -> None:
            seqs[0].eval(long, logits="last")

        def stream() -> None:
            seqs[1].eval(mine, logits="last")
            seqs[1].prompt_read = len(mine)  # as a generation that read its prompt says
            for _ in range(3):
                seqs[1].eval([5], logits="last")
                seen.append(seqs[1].beside)

        _members(batcher, seqs, read, stream)
        # one token of its own and the prompt's part of the step, which gives no token: at most what fills the
        # step, or the chunk, or as many tokens as the stream read of its own prompt where that is more
        most = 63 if chunk is None else min(63, max(chunk, own))
        assert all(tokens <= most and rest == [0, 1] for tokens, *rest in seen), seen
        assert any(tokens == most for tokens, *_ in seen), seen


@pytest.mark.parametrize("left, own, held", [(3, None, True), (None, None, False), (100_000, None, False),
                                             (200, 40, False)])
def test_a_prompt_that_takes_longer_to_read_than_a_short_reply_has_left_waits_for_it(tiny_dir, left, own, held):
    # one unit of cost a token, as on a CPU: the stream has 3 steps of one unit left, less than the long prompt's
    # reading would keep it, so the prompt waits; with no estimate, or a longer reply, it is read beside it. A
    # reply of 200 steps beside a 1.4k-token prompt with 40 steps of its own: waiting more than a tenth of that
    # would make the prompt's request end last, so it is read beside it, as sub-agents of like size are
    with Model(tiny_dir / "target.gguf", n_ctx=4096, n_batch=64) as alone, \
            Model(tiny_dir / "target.gguf", n_ctx=4096, n_batch=64, n_seq=2) as shared:
        long, mine = alone.tokenize(" ".join(PROMPTS * 12)), alone.tokenize(PROMPTS[0])
        expected = []
        for prompt, n in ((long, 4), (mine, 3)):
            alone.reset()
            alone.eval(prompt, logits="none")
            expected.append(_continue(alone, n))
        seqs = [shared, shared.sequence(1)]
        batcher = StepBatcher()
        batcher.step_cost = float
        for s in seqs:
            s.attach(batcher)
        seen: list[tuple[int, int, int]] = []
        got: list[list[int]] = [[], []]

        def read() -> None:
            seqs[0].reading_end, seqs[0].steps_left = len(long), own  # as a generation reading its prompt says
            seqs[0].eval(long, logits="none")
            seqs[0].reading_end = None
            got[0] = _continue(seqs[0], 4)

        def stream() -> None:
            seqs[1].steps_left = left  # as a generation that expects its reply to end says
            seqs[1].eval(mine, logits="none")
            last = int(seqs[1].tokens[-1])  # as _continue, each step's neighbours seen
            seqs[1].truncate(seqs[1].n_past - 1)
            for _ in range(4):
                row = seqs[1].eval([last], logits="last")[0]
                seen.append(seqs[1].beside)
                last = int(np.argmax(row))
                got[1].append(last)
            del got[1][3:]
            seqs[1].steps_left = None

        _members(batcher, seqs, read, stream)
        assert got == expected
        # its steps held none of the long prompt (being read all along), or chunks of it
        assert all(tokens == 0 for tokens, *_ in seen) == held, seen
        assert seqs[0].n_past == len(long) + 4


def test_a_held_prompt_waits_no_longer_than_its_reading_would_have_kept_the_others(tiny_dir):
    # the stream says it has 3 steps left at every step (as a line of short requests would): the long prompt
    # waits, but only until it has waited as long as its reading would have kept the stream (0.1 ms a token)
    with Model(tiny_dir / "target.gguf", n_ctx=8192, n_batch=64, n_seq=2) as shared:
        long, mine = shared.tokenize(" ".join(PROMPTS * 12)), shared.tokenize(PROMPTS[0])
        seqs = [shared, shared.sequence(1)]
        batcher = StepBatcher()
        batcher.step_cost = lambda n: n * 1e-4
        for s in seqs:
            s.attach(batcher)
        seen: list[int] = []
        read = threading.Event()

        def reader() -> None:
            seqs[0].reading_end = len(long)
            seqs[0].eval(long, logits="none")
            read.set()

        def stream() -> None:
            seqs[1].steps_left = 3
            seqs[1].eval(mine, logits="none")
            while not read.is_set() and len(seen) < 3000:
                seqs[1].eval([5], logits="last")
                seen.append(seqs[1].beside[0])

        _members(batcher, seqs, reader, stream)
        assert read.is_set() and seqs[0].n_past == len(long), len(seen)
        assert seen[0] == 0 and any(seen), seen[:20]  # held at first, read beside the stream in the end
        # its waits in all, across its calls of 64 tokens: its reading's cost, give or take a step
        assert 0 < seqs[0].reading_waited <= len(long) * 1e-4 + 0.2, seqs[0].reading_waited


def test_a_cancelled_sequence_stops_and_the_others_go_on(tiny_dir):
    with Model(tiny_dir / "target.gguf", n_ctx=4096, n_batch=32) as alone, \
            Model(tiny_dir / "target.gguf", n_ctx=4096, n_batch=32, n_seq=2) as shared:
        short = alone.tokenize(PROMPTS[1])
        alone.eval(short, logits="none")
        expected = _continue(alone, 20)
        seqs = [shared, shared.sequence(1)]
        batcher = StepBatcher()
        for s in seqs:
            s.attach(batcher)
        aborts = [threading.Event(), threading.Event()]
        aborts[0].set()  # cancelled before its long prompt was read
        got = _run_together(seqs, [alone.tokenize(" ".join(PROMPTS * 10)), short], 20, batcher, aborts)
        assert isinstance(got[0], GenerationCancelled) and shared.n_past == 0
        assert got[1] == expected


def test_sequences_that_overflow_the_shared_cells_get_a_clear_error(tiny_dir):
    with Model(tiny_dir / "target.gguf", n_ctx=256, n_seq=2) as shared:
        other = shared.sequence(1)
        shared.eval(list(range(10, 210)), logits="none")
        with pytest.raises(ContextOverflowError, match="shared by its 2 sequences"):
            other.eval(list(range(10, 150)), logits="none")
        assert other.n_past == 0 and shared.n_past == 200
        assert other.eval([5, 6], logits="last").shape[0] == 1  # what fits still goes


@pytest.mark.parametrize("arch", ["llama", "mamba", "qwen35"])
def test_sequences_that_outgrow_the_shared_cells_are_set_aside_and_give_what_they_give_alone(tiny_dir, recurrent_dir,
                                                                                             arch):
    # three sequences of 20-token prompts and 150 tokens each in 256 cells: the loop sets the one started last
    # aside (its state saved and its cells freed) and brings it back when one ends; each gets its own tokens
    path = tiny_dir / "target.gguf" if arch == "llama" else recurrent_dir / f"{arch}.gguf"
    with Model(path, n_ctx=256) as alone, Model(path, n_ctx=256, n_seq=3) as shared:
        prompts = [alone.tokenize(p)[:20] for p in PROMPTS[:3]]
        expected = []
        for prompt in prompts:
            alone.reset()
            alone.eval(prompt, logits="none")
            expected.append(_continue(alone, 150))
        seqs = [shared, shared.sequence(1), shared.sequence(2)]
        batcher = StepBatcher()
        for seq in seqs:
            seq.attach(batcher)
        batcher.room = _freeing_the_finished(seqs)
        got = _run_together(seqs, prompts, 150, batcher)
        assert got == expected
        # a recurrent state is one cell a sequence, whatever its length: only attention runs out of them
        assert batcher.set_aside >= (0 if arch == "mamba" else 1)


def _freeing_the_finished(seqs: list[Model]):
    """A ``StepBatcher.room`` as a pair's lanes give it: a sequence whose work is done (it holds its prompt and
    150 tokens more) is idle, and its cells go when another needs them."""
    def room(model: Model) -> bool:
        for seq in seqs:
            if seq._ctx is model._ctx and seq.n_past >= 170 and not seq.decoding:
                seq.reset()
                return True
        return False
    return room


def test_a_sequence_set_aside_whose_generation_is_cancelled_ends_empty_and_the_others_go_on(tiny_dir):
    with Model(tiny_dir / "target.gguf", n_ctx=256) as alone, \
            Model(tiny_dir / "target.gguf", n_ctx=256, n_seq=2) as shared:
        prompts = [alone.tokenize(p)[:20] for p in PROMPTS[:2]]
        alone.eval(prompts[0], logits="none")
        expected = _continue(alone, 200)
        seqs = [shared, shared.sequence(1)]
        batcher = StepBatcher()
        for seq in seqs:
            seq.attach(batcher)
        gone = threading.Event()  # the second one's client leaves while it is set aside
        results: list[object] = [None, None]

        def first() -> None:
            seqs[0].eval(prompts[0], logits="none")
            last, out = int(seqs[0].tokens[-1]), []
            seqs[0].truncate(seqs[0].n_past - 1)
            for _ in range(200):
                if batcher.waiting_for_room:
                    gone.set()
                row = seqs[0].eval([last], logits="last")[0]
                last = int(np.argmax(row))
                out.append(last)
            results[0] = out

        def second() -> None:  # started last: set aside once the cells run out
            try:
                seqs[1].eval(prompts[1], logits="none", abort=gone)
                last = int(seqs[1].tokens[-1])
                for _ in range(230):
                    last = int(np.argmax(seqs[1].eval([last], logits="last", abort=gone)[0]))
            except GenerationCancelled as exc:
                results[1] = exc

        _members(batcher, seqs, first, second)
        assert results[0] == expected
        assert isinstance(results[1], GenerationCancelled), results[1]
        assert seqs[1].n_past == 0  # its saved state went, and its record says so
        assert batcher.set_aside == 1


def test_a_hybrid_sequence_cut_back_after_another_sequence_decoded_keeps_its_state(recurrent_dir):
    # llama.cpp's rollback snapshots do not survive other sequences' decodes (seen as wrong tokens when heads of
    # several sequences drafted together): a context of several sequences takes none, its cut backs go by
    # checkpoint, and the state after one is what reading it alone gives
    path = recurrent_dir / "qwen35.gguf"
    with Model(path, n_ctx=512) as alone, Model(path, n_ctx=512, n_seq=2) as shared:
        prompt, other = alone.tokenize(PROMPTS[0]), alone.tokenize(PROMPTS[1])
        guess = alone.tokenize(" and the dog ran off", add_special=False)[:4]
        alone.eval(prompt + guess[:1], logits="none")
        expected = _continue(alone, 12)
        a, b = shared, shared.sequence(1)
        assert a.memory.kind == memory.CHECKPOINT and alone.memory.kind == memory.ROLLBACK
        a.eval(prompt, logits="none")
        b.eval(other, logits="none")
        a.checkpoint()
        rows = a.eval(guess, logits="all").copy()  # a round verifies four tokens (a view: the next decode reuses it)
        b.eval([5], logits="last")  # the other sequence decodes
        a.truncate(len(prompt) + 1)  # one of them is kept
        b.eval([6], logits="last")  # the other decodes again before this one goes on
        out, row = [], rows[0]
        for _ in range(12):
            out.append(int(np.argmax(row)))
            row = a.eval([out[-1]], logits="last")[0]
        assert out == expected
        b.close()


def test_a_prompt_that_finds_no_room_beside_the_only_other_sequence_waits_for_it(tiny_dir):
    # the first sequence holds most of the 256 cells and goes on; the second's prompt does not fit beside it, so
    # it waits (set aside with nothing to save) until the first ends and its cells are free, then reads exact
    with Model(tiny_dir / "target.gguf", n_ctx=256) as alone, \
            Model(tiny_dir / "target.gguf", n_ctx=256, n_seq=2) as shared:
        first, second = alone.tokenize(" ".join(PROMPTS * 4))[:150], alone.tokenize(" ".join(PROMPTS * 2))[:100]
        expected = []
        for prompt in (first, second):
            alone.reset()
            alone.eval(prompt, logits="none")
            expected.append(_continue(alone, 20))
        seqs = [shared, shared.sequence(1)]
        batcher = StepBatcher()
        for seq in seqs:
            seq.attach(batcher)
        done = []

        def room(model: Model) -> bool:  # the first one's cells, once its work is done (as an idle lane's)
            if done and shared.n_past:
                shared.reset()
                return True
            return False

        batcher.room = room
        results: list[object] = [None, None]

        def work_first() -> None:
            shared.eval(first, logits="none")
            results[0] = _continue(shared, 20)
            done.append(True)

        def work_second() -> None:
            while shared.n_past < 150:  # it asks once the first holds its prompt
                batcher.pause(lambda: shared.n_past >= 150)
            seqs[1].eval(second, logits="none")
            results[1] = _continue(seqs[1], 20)

        _members(batcher, seqs, work_first, work_second)
        assert results == expected
        assert batcher.set_aside == 1


def test_a_sequence_set_aside_whose_generation_is_cancelled_by_its_own_event_ends_empty(tiny_dir):
    # the generation's own cancel event (a verification round passes no abort of its own) drops it too
    with Model(tiny_dir / "target.gguf", n_ctx=256, n_seq=2) as shared:
        prompts = [shared.tokenize(p)[:20] for p in PROMPTS[:2]]
        seqs = [shared, shared.sequence(1)]
        batcher = StepBatcher()
        for seq in seqs:
            seq.attach(batcher)
        gone = threading.Event()
        seqs[1].cancelled = gone
        results: list[object] = [None, None]

        def first() -> None:
            seqs[0].eval(prompts[0], logits="none")
            last = int(seqs[0].tokens[-1])
            for _ in range(200):
                if batcher.waiting_for_room:
                    gone.set()
                last = int(np.argmax(seqs[0].eval([last], logits="last")[0]))
            results[0] = seqs[0].n_past

        def second() -> None:
            try:
                seqs[1].eval(prompts[1], logits="none")
                last = int(seqs[1].tokens[-1])
                for _ in range(230):
                    last = int(np.argmax(seqs[1].eval([last], logits="all")[0]))
            except GenerationCancelled as exc:
                results[1] = exc

        _members(batcher, seqs, first, second)
        assert results[0] == 220 and isinstance(results[1], GenerationCancelled)
        assert seqs[1].n_past == 0 and not seqs[1].held_aside
