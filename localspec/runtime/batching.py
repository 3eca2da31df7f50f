"""Decode calls of several sequences, gathered into one llama.cpp decode per context and step.

Each generation runs in its own thread on its own sequence of a shared context (``Model.sequence``) and calls
``eval`` as it would alone. A ``StepBatcher`` its sequences are attached to holds each decode call until every
member thread is waiting in one, then its own thread decodes them together: one ``llama_decode`` per context
(the target's, the draft model's), each call's tokens under its own sequence id. So N streams decode in lockstep, a step
costing about what one sequence of their total tokens costs, and the code of a round (drafting, acceptance,
cutting back) is the same as for one stream.

Short calls go first and a long one (a prompt) fills what is left of the context's ``n_batch``, across as
many steps as it needs; beside streams that are decoding, prompts take at most ``stream_chunk`` tokens of a
step, or as many as each of those streams read of its own prompt, so that a prompt being read does not hold
back a short request for more than a small share of a step. With the costs known (``step_cost``), a prompt
whose reading would keep the requests beside it waiting longer than the shortest of them has left waits for
that one: a title request beside a long prompt, or the first of several sub-agents, is done before the next
long prompt is read.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, TypeVar

import llama_cpp as ll
import numpy as np

from .process import abort_hook

#: Steps of more tokens than this can be stopped inside llama.cpp (the hook costs a Python call per graph node,
#: which only a long step amortises).
ABORTABLE_STEP = 64

#: A prompt held back behind shorter requests still takes as many tokens as lengthen their step by at most
#: this share of it: none beside a lone stream on a CPU, where every token costs.
QUIET_SHARE = 0.1

T = TypeVar("T")


@dataclass(eq=False)
class _Op:
    """Another llama.cpp call on an attached context (a cut, a checkpoint, a state saved), and its outcome."""

    fn: Callable[[], Any]
    value: Any = None
    error: Optional[BaseException] = None
    done: bool = False


@dataclass(eq=False)
class _Call:
    """One sequence's decode call: the ``m`` tokens its model's batch holds, and what came of them."""

    model: Any  # the sequence's ``Model``: its batch arrays hold the call's tokens, positions and logits flags
    m: int
    abort: Optional[threading.Event]
    done: int = 0  # tokens decoded so far (a long call takes several steps)
    rows: list[np.ndarray] = field(default_factory=list)
    rc: int = 0
    seconds: float = 0.0
    width: int = 1  # the most calls a decode that served it held
    beside: tuple[int, int, int] = (0, 0, 0)  # the other calls in its last decode: tokens, streams, calls
    finished: bool = False

    def result(self, n_vocab: int) -> np.ndarray:
        if not self.rows:
            return np.zeros((0, n_vocab), dtype=np.float32)
        return self.rows[0] if len(self.rows) == 1 else np.concatenate(self.rows)


def uninterrupted(wait: Callable[[], Any]) -> None:
    """``wait()`` to its end even if Ctrl-C interrupts it, the interrupt raised afterwards: threads decoding on a
    context must be waited for before it is detached or freed."""
    interrupted: Optional[BaseException] = None
    while True:
        try:
            wait()
            break
        except KeyboardInterrupt as exc:
            interrupted = exc
    if interrupted is not None:
        raise interrupted


def _is_stream(call: _Call) -> bool:
    """Whether the call asks for every token's logits (a round being verified, a token decoded), unlike a prompt
    being read (logits for its last token at most)."""
    return bool(call.model._b_logits[call.done:call.m].all())


class _All:
    """An event that is set when all of ``events`` are (what ``abort_hook`` asks)."""

    def __init__(self, events: list[Optional[threading.Event]]):
        self.events = events

    def is_set(self) -> bool:
        return all(e is not None and e.is_set() for e in self.events)


class StepBatcher:
    """Gathers the decode calls of the sequences attached to it (``Model.attach``) into joint decodes.

    A thread takes part with ``with batcher.member():``; while it is a member, its sequences' decode calls wait
    until every member is waiting in one (or has left), and then go together. A thread that is not a member
    takes part for the length of its call. Every thread that uses an attached sequence's context must take
    part: a joint decode runs only while all of them wait, so no two touch a context at once.

    Attributes:
        steps: joint decodes made.
        widest: the most calls one decode held.
    """

    def __init__(self, stream_chunk: Optional[int] = None) -> None:
        #: In a step that holds a stream (a call asking every token's logits: a round being verified), the most
        #: tokens the prompts being read take (None: all the room there is), so the stream's step stays short;
        #: more where every stream read more of its own prompt (see ``_decode_group``).
        self.stream_chunk = stream_chunk
        #: Seconds one decode of n tokens takes (set from the measured costs; None: unknown). With it, a prompt
        #: whose reading would keep the requests beside it waiting longer than the shortest of them has left
        #: waits for that one instead (see ``_held``).
        self.step_cost: Optional[Callable[[int], float]] = None
        self._cond = threading.Condition()
        self._members: set[int] = set()
        self._calls: list[_Call] = []
        self._ops: list[_Op] = []
        self._batches: dict[int, tuple[Any, int]] = {}  # id of a context: its llama_batch and capacity
        self._driver: Optional[threading.Thread] = None
        self._closed = False
        self.steps = 0
        self.widest = 0

    @contextlib.contextmanager
    def member(self) -> Iterator[None]:
        """The calling thread takes part until the block ends."""
        me = threading.get_ident()
        with self._cond:
            self._members.add(me)
        try:
            yield
        finally:
            with self._cond:
                self._members.discard(me)
                self._cond.notify_all()  # the others may have been waiting for this one alone

    def decode(self, model: Any, m: int,
               abort: Optional[threading.Event]) -> tuple[int, np.ndarray, float, int, tuple[int, int, int]]:
        """Decode the ``m`` tokens ``model``'s batch holds, with the other members' calls.

        Returns:
            llama.cpp's code (0: decoded; 2: ``abort`` was set first; -1: the step failed), the rows of the tokens
            whose logits were asked for (those finished in the last step are a view of llama.cpp's buffer, valid
            until this thread's next call), the seconds of the decodes that served it, the most calls one of
            them held, and what the other calls put in the last one: their tokens, how many of them asked for
            every token's logits (streams verifying, where a prompt being read asks for one row or none), and
            how many calls they were.
        """
        call, me = _Call(model, m, abort), threading.get_ident()
        with self._cond:
            if self._closed:
                raise RuntimeError("This StepBatcher is closed.")
            self._start_driver()
            joined = me not in self._members
            self._members.add(me)
            self._calls.append(call)
            self._cond.notify_all()
            try:
                while not call.finished:
                    self._cond.wait()
            finally:
                if not call.finished:  # interrupted while waiting: the step must not count it, nor decode it
                    self._calls.remove(call)
                if joined:  # a copy of its rows: the steps that go on without it overwrite llama.cpp's buffer
                    call.rows = [np.array(r) for r in call.rows]
                    self._members.discard(me)
                    self._cond.notify_all()
        return call.rc, call.result(model.n_vocab), call.seconds, call.width, call.beside

    def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the batcher's thread, between steps: every llama.cpp call on an attached context goes there
        (``Model`` sends its cuts, checkpoints and states), so no two threads touch a context at once."""
        op = _Op(fn)
        with self._cond:
            if self._closed:
                raise RuntimeError("This StepBatcher is closed.")
            self._start_driver()
            self._ops.append(op)
            self._cond.notify_all()
            while not op.done:
                self._cond.wait()
        if op.error is not None:
            raise op.error
        return op.value  # type: ignore[no-any-return]

    def close(self) -> None:
        """Stop the decoding thread and free the batches (the batcher cannot be used afterwards); a call or op
        still waiting fails."""
        with self._cond:
            self._closed = True
            for call in self._calls:
                call.rc, call.finished = -1, True
            for op in self._ops:
                op.error, op.done = RuntimeError("This StepBatcher was closed."), True
            self._calls, self._ops = [], []
            self._cond.notify_all()
        if self._driver is not None:
            self._driver.join()
        for batch, _ in self._batches.values():
            ll.llama_batch_free(batch)
        self._batches.clear()

    def _start_driver(self) -> None:
        if self._driver is None:
            self._driver = threading.Thread(target=self._drive, name="localspec-batch", daemon=True)
            self._driver.start()

    def _drive(self) -> None:
        """The one thread that decodes: while every member waits in a call, a step (each finishes at least one
        call unless a long one needs more), then the threads whose calls finished are woken. Always the same
        thread, so that llama.cpp's CPU threads (an OpenMP team per calling thread) are one team, not one
        per member spinning beside the others."""
        with self._cond:
            while not self._closed:
                if self._ops:
                    self._run_ops()
                    continue
                if not (self._calls and len(self._calls) >= len(self._members)):  # one call per waiting member
                    self._cond.wait()
                    continue
                try:
                    self._step()
                except BaseException:
                    for call in self._calls:  # nobody may wait for a step that will not come
                        call.rc, call.finished = -1, True
                    self._calls = []
                self._cond.notify_all()

    def _run_ops(self) -> None:
        ops, self._ops = self._ops, []
        for op in ops:
            try:
                op.value = op.fn()
            except BaseException as exc:  # the caller's to raise
                op.error = exc
            op.done = True
        self._cond.notify_all()

    def _step(self) -> None:
        """One decode per context over the calls: the shortest first, a long one filling the rest."""
        calls = self._calls
        for call in calls:
            if call.abort is not None and call.abort.is_set():
                call.rc, call.finished = 2, True
        by_context: dict[int, list[_Call]] = {}
        for call in sorted((c for c in calls if not c.finished), key=lambda c: c.m - c.done):
            by_context.setdefault(id(call.model._ctx), []).append(call)
        # per context: its calls, which of them are streams, and the streams' tokens
        groups = []
        for group in by_context.values():
            streams = [_is_stream(call) for call in group]
            groups.append((group, streams, sum(c.m - c.done for c, s in zip(group, streams, strict=True) if s)))
        # a step waits for all its contexts' decodes: a prompt is weighed against every generation decoding in
        # it, on any context (a lane drafting with a draft model has its calls there, and so has a draft model
        # reading a prompt after its target)
        shortest = min((self._left(call, base) for group, streams, base in groups
                        for call, stream in zip(group, streams, strict=True)
                        if stream or call.model.reading_end is None), default=float("inf"))
        t0, held = time.perf_counter(), []
        for group, streams, base in groups:
            held += self._decode_group(group, streams, base, shortest)
        for call in held:  # a reading's waits count across its calls (one per n_batch tokens)
            call.model.reading_waited += time.perf_counter() - t0
        self._calls = [c for c in self._calls if not c.finished]

    def _decode_group(self, group: list[_Call], streams: list[bool], base: int, shortest: float) -> list[_Call]:
        """One llama.cpp decode of as much of ``group``'s calls (on one context; ``streams``: which of them are
        streams, ``base``: their tokens) as its ``n_batch`` takes; where the cells have no room for all of them,
        each alone, so that only a call that does not fit fails. The calls held back for shorter requests
        (``shortest``: the least time a generation decoding in the step has left)."""
        first = group[0].model
        capacity = self._batch(first)[1]
        taken: list[tuple[_Call, int]] = []  # a call, and how many of its tokens go in this step
        n = 0
        # beside streams, the prompts take no more than stream_chunk tokens in all, or as many as each stream
        # read of its own prompt: a request waits per step at most about what reading its prompt took, so a
        # short one beside a long prompt keeps going, and requests of like prompts sent together are read in
        # a few large steps, at the batch's rate, not in many small ones
        read = [call.model.prompt_read for call, stream in zip(group, streams, strict=True) if stream]
        reading = max(self.stream_chunk, min(read)) if self.stream_chunk and read else capacity
        held = self._held(group, streams, base, shortest)
        quiet: Optional[int] = None  # what the held ones share: set once the others have their tokens
        for i in sorted(range(len(group)), key=lambda i: i in held):  # the held ones take what room is left
            call, stream = group[i], streams[i]
            limit = call.m if stream else reading
            if i in held:
                quiet = self._quiet(n, capacity) if quiet is None else quiet
                limit = min(limit, quiet)
            take = min(call.m - call.done, capacity - n, limit)
            if take <= 0:
                continue
            taken.append((call, take))
            n += take
            reading -= 0 if stream else take
            quiet = None if quiet is None else quiet - take
        if not taken:  # every call here held for a stream on another context: that one decodes this step
            return [group[i] for i in held]
        if self._decode(first, taken, last_try=len(taken) == 1) == 1 and len(taken) > 1:  # 1: no free cells
            for part in taken:
                self._decode(first, [part], last_try=True)
        return [group[i] for i in held]

    def _left(self, call: _Call, base: int) -> float:
        """The seconds ``call``'s generation still expects to keep the steps: its ``steps_left`` at the cost of a
        step of its context's streams (``base`` tokens; no end without an estimate, or without the costs, or for
        a call of no generation)."""
        cost, steps = self.step_cost, call.model.steps_left
        if cost is None or steps is None:
            return float("inf")
        return steps * cost(max(1, base))

    def _held(self, group: list[_Call], streams: list[bool], base: int, shortest: float) -> set[int]:
        """The prompts being read (their indices in ``group``) that wait for a shorter request.

        Reading a prompt keeps every request decoding beside it waiting about as long as the reading takes;
        waiting keeps the prompt's request waiting as long as the shortest of those has left (``shortest``:
        the least time a generation decoding in the step has left; a prompt let in counts its reading and
        its ``steps_left``). The smaller wait wins, the shortest request first: a title request beside a
        long prompt, or the first of several sub-agents, is done before the next long prompt is read, while
        a prompt shorter than the replies beside it is read at once and decodes with them. A prompt waits
        in all (``reading_waited``) no longer than its reading would have kept the others, so a line of
        short requests cannot hold it forever.
        """
        cost = self.step_cost
        if cost is None:
            return set()
        step = cost(max(1, base))
        reads: dict[int, float] = {}  # what reading the rest of each prompt costs the step, in seconds
        owns: dict[int, float] = {}  # and what its request has left to do: that reading, then its reply
        for i, (call, stream) in enumerate(zip(group, streams, strict=True)):
            end, steps = call.model.reading_end, call.model.steps_left
            if stream or end is None:  # only a generation's prompt waits (not a replay inside a round)
                continue
            left = end - call.model.n_past - call.done  # the rest of its prompt, across calls
            reads[i] = cost(base + left) - (cost(base) if base else 0.0)
            owns[i] = reads[i] + (steps or 0) * step
        held: set[int] = set()
        for i in sorted(owns, key=owns.__getitem__):  # the shortest request first, not the shortest call
            if reads[i] > shortest and group[i].model.reading_waited < reads[i]:
                held.add(i)
            else:
                shortest = min(shortest, owns[i])
        return held

    def _quiet(self, n: int, capacity: int) -> int:
        """The most tokens a step of ``n`` tokens takes on for the held prompts while lengthening by at most
        ``QUIET_SHARE`` (a bisection over the cost, which never falls as tokens are added)."""
        cost = self.step_cost
        if cost is None or n == 0:
            return 0
        most, lo, hi = (1 + QUIET_SHARE) * cost(n), 0, capacity - n
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if cost(n + mid) <= most else (lo, mid - 1)
        return lo

    def _decode(self, first: Any, taken: list[tuple[_Call, int]], last_try: bool) -> int:
        """Decode ``taken`` (calls on ``first``'s context and how many of their tokens) and hand each its rows
        and outcome; llama.cpp's code. A failure for want of cells is left to the caller unless ``last_try``
        (llama.cpp then leaves the memory as it was)."""
        batch, capacity = self._batch(first)
        tokens, pos, flags = (np.ctypeslib.as_array(a, shape=(capacity,)) for a in (batch.token, batch.pos,
                                                                                    batch.logits))
        n, counts = 0, []
        for call, take in taken:
            src = slice(call.done, call.done + take)
            tokens[n:n + take] = call.model._b_token[src]
            pos[n:n + take] = call.model._b_pos[src]
            flags[n:n + take] = call.model._b_logits[src]
            for i in range(n, n + take):
                batch.seq_id[i][0] = call.model.seq
            counts.append(int(np.count_nonzero(call.model._b_logits[src])))  # the rows its tokens give
            n += take
        batch.n_tokens = n
        t0 = time.perf_counter()
        # a long step stops within milliseconds once every call in it is cancelled (a server shutting down);
        # one call cancelled among others waits for the step's end, which the others need
        events = [c.abort for c, _ in taken]
        stoppable = n > ABORTABLE_STEP and all(e is not None for e in events)
        with first._log, abort_hook(first._ctx, _All(events) if stoppable else None):
            rc = int(ll.llama_decode(first._ctx, batch))
        if rc == 1 and not last_try:
            return rc
        n_rows = sum(counts)
        if rc == 0:
            self._keep_hidden(taken, pos, n)
        logits = None
        if rc == 0 and n_rows:
            logits = np.ctypeslib.as_array(ll.llama_get_logits(first._ctx), shape=(n_rows, first.n_vocab))
        elif rc == 0:
            ll.llama_synchronize(first._ctx)  # on a GPU the decode returns before the work is done
        spent = time.perf_counter() - t0
        self.steps += 1
        self.widest = max(self.widest, len(taken))
        row = 0
        streams = sum(r == take for (_, take), r in zip(taken, counts, strict=True))
        for (call, take), r in zip(taken, counts, strict=True):
            call.seconds += spent
            call.width = max(call.width, len(taken))
            call.beside = (n - take, streams - (r == take), len(taken) - 1)
            if rc != 0:
                call.rc, call.finished = rc, True
                continue
            call.done += take
            call.finished = call.done == call.m
            if r and logits is not None:
                rows = logits[row:row + r]
                # a call that spans steps keeps copies: the next step overwrites the buffer
                call.rows.append(rows if call.finished and not call.rows else np.array(rows))
            row += r
        return rc

    @staticmethod
    def _keep_hidden(taken: list[tuple[_Call, int]], pos: np.ndarray, n_tokens: int) -> None:
        """Each sequence that keeps hidden rows for an MTP head (``Model.keep_hidden``) gets its tokens' rows of
        the decode of ``n_tokens`` (the context gives one per token, in the batch's order) at their positions."""
        staged, n = None, 0
        for call, take in taken:
            model = call.model
            if model.keeps_hidden:
                if staged is None:
                    staged = np.ctypeslib.as_array(model._ext.llama_get_embeddings_nextn(model._ctx),
                                                   shape=(n_tokens, model.hidden.shape[1]))
                model.hidden[pos[n:n + take]] = staged[n:n + take]
            n += take

    def _batch(self, model: Any) -> tuple[Any, int]:
        """The batch for ``model``'s context, made on first use (as many tokens as the context's ``n_batch``)."""
        key = id(model._ctx)
        if key not in self._batches:
            capacity = model.n_batch
            batch = ll.llama_batch_init(capacity, 0, 1)
            np.ctypeslib.as_array(batch.n_seq_id, shape=(capacity,))[:] = 1
            self._batches[key] = (batch, capacity)
        return self._batches[key]
