"""The step loop: generations decoded together, each one's code written as if it ran alone.

Each generation on a sequence of a shared context (``Model.sequence``) runs as a *member* of a ``StepBatcher``:
a greenlet (a coroutine with a stack of its own) that ``spawn`` starts. Its code calls ``eval`` as it would
alone; a decode call on an attached sequence parks the member, and once every member is parked (in a call, a
``pause`` or set aside) the loop (``drive``) makes one ``llama_decode`` per context (the target's, the draft
model's) of all their tokens, each under its own sequence id, and switches back into each member with its
rows. One thread runs it all: no lock and no thread handoff lies in the path of a step, and llama.cpp's CPU
threads are one team. N generations decode in lockstep, a step costing about what one sequence of their total
tokens costs, and the code of a round (drafting, acceptance, cutting back) is the same as for one stream.

Short calls go first and a long one (a prompt) fills what is left of the context's ``n_batch``, across as
many steps as it needs; beside streams that are decoding, prompts take at most ``stream_chunk`` tokens of a
step, or as many as each of those streams read of its own prompt, so that a prompt being read does not hold
back a short request for more than a small share of a step. With the costs known (``step_cost``), a prompt
whose reading would keep the requests beside it waiting longer than the shortest of them has left waits for
that one: a title request beside a long prompt, or the first of several sub-agents, is done before the next
long prompt is read.

When the members need more cells than the shared cache has free, an idle sequence's cells go first (``room``,
which the pair's lanes set), then the member started last is set aside (``aside.SetAside``: its sequences
saved to RAM and emptied) and brought back, exact, once a member ends and its state fits again. No member
fails for want of cells that it would have had alone.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import llama_cpp as ll
import numpy as np
from greenlet import greenlet

from .aside import SetAside, holds_cells
from .process import POSITIONS, LogitsView, abort_hook

#: Steps of more tokens than this can be stopped inside llama.cpp (the hook costs a Python call per graph node,
#: which only a long step amortises).
ABORTABLE_STEP = 64

#: A prompt held back behind shorter requests still takes as many tokens as lengthen their step by at most
#: this share of it: none beside a lone stream on a CPU, where every token costs.
QUIET_SHARE = 0.1

#: A prompt waits for a shorter request only where the wait is at most this share of what its own request has
#: left (or where, held, it still ends no later than the requests beside it): see ``StepBatcher._held``.
HOLD_SHARE = 0.1


@dataclass(eq=False)
class Member:
    """One piece of work on the loop (a generation, or anything that decodes on attached sequences): its
    greenlet, its start order and, once ``done``, its value or error (``result``)."""

    fn: Callable[[], Any]
    order: int
    glet: Optional[greenlet] = None
    value: Any = None
    error: Optional[BaseException] = None
    done: bool = False
    seqs: set[int] = field(default_factory=set)  # the sequence ids it decoded on (set aside together)
    until: Optional[Callable[[], bool]] = None  # while paused: what it waits for
    woken: bool = True  # what its ``pause`` returns once it is switched back into

    def result(self) -> Any:
        """Its value, or its error raised."""
        if self.error is not None:
            raise self.error
        return self.value


@dataclass(eq=False, slots=True)
class _Call:
    """One sequence's decode call: the ``m`` tokens its model's batch holds, and what came of them."""

    model: Any  # the sequence's ``Model``
    tokens: np.ndarray  # what it decodes, at positions start, start + 1 ...
    start: int
    every: bool  # each of its tokens asks for logits (a round being verified, a token decoded)
    last: bool  # its last token asks for logits (a prompt's end)
    abort: Optional[threading.Event]
    member: Optional[Member] = None  # None: a call made outside the loop's members, decoded at once
    m: int = 0  # how many tokens (set from ``tokens``)
    done: int = 0  # tokens decoded so far (a long call takes several steps)
    rows: list[np.ndarray] = field(default_factory=list)
    rc: int = 0
    seconds: float = 0.0
    width: int = 1  # the most calls a decode that served it held
    beside: tuple[int, int, int] = (0, 0, 0)  # the other calls in its last decode: tokens, streams, calls
    finished: bool = False
    aside: bool = False  # its member is set aside: not decoded until it is brought back

    def __post_init__(self) -> None:
        self.m = len(self.tokens)

    def wanted(self, done: int, take: int) -> int:
        """How many logits rows ``take`` of its tokens from ``done`` on give."""
        return take if self.every else int(self.last and done + take == self.m)

    def result(self, n_vocab: int) -> np.ndarray:
        if not self.rows:
            return np.zeros((0, n_vocab), dtype=np.float32)
        return self.rows[0] if len(self.rows) == 1 else np.concatenate(self.rows)


def uninterrupted(wait: Callable[[], Any]) -> None:
    """``wait()`` to its end even if Ctrl-C interrupts it, the interrupt raised afterwards: generations decoding
    on a context must be finished before it is detached or freed."""
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
    """Whether the rest of the call asks for every token's logits (a round being verified, a token decoded),
    unlike a prompt being read (logits for its last token at most)."""
    return call.every or (call.m - call.done == 1 and call.last)


class _Stop:
    """What ``abort_hook`` asks during a long step: stop once every call in it is cancelled; Ctrl-C cancels them
    all (each generation then ends as cancelled)."""

    def __init__(self, events: list[threading.Event], batcher: StepBatcher):
        self.events, self.batcher = events, batcher

    def is_set(self) -> bool:
        if self.batcher._interrupted:
            for e in self.events:
                e.set()
        return all(e.is_set() for e in self.events)


class StepBatcher:
    """The loop that runs generations on the sequences attached to it (``Model.attach``) and gathers their decode
    calls into joint decodes.

    ``spawn`` adds a member; ``drive`` runs the members, from the thread that calls it, until a condition holds
    or none is left. A decode call made outside the members (before the loop starts, or between its runs)
    decodes at once, alone. Everything that touches an attached context runs on the thread that drives.

    Attributes:
        steps: joint decodes made.
        widest: the most calls one decode held.
        set_aside: generations set aside for want of cells (each brought back once room came).
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
        #: Frees the cells of one idle sequence of a model's context (not a member's), the one that can best
        #: spare them; whether it found one (None: there are none). The pair's lanes set it.
        self.room: Optional[Callable[[Any], bool]] = None
        self._members: list[Member] = []  # live, in start order
        self._ready: deque[Member] = deque()  # to switch into: new, or their call or pause is over
        self._calls: list[_Call] = []  # members' calls waiting for a step
        self._paused: list[Member] = []
        self._aside: list[SetAside] = []  # in the order they were set aside
        self._running: Optional[Member] = None  # the member whose code runs now
        self._hub: Optional[greenlet] = None  # the loop's own greenlet while ``drive`` runs
        self._freed = False  # a member ended or cells were freed since a set-aside member last tried to come back
        self._interrupted = False  # Ctrl-C came during ``drive``: raised at the next point between steps
        self._batches: dict[int, tuple[Any, int, np.ndarray, np.ndarray, np.ndarray, list[int]]] = {}  # see _batch
        self._views: dict[int, LogitsView] = {}  # by context: its logits buffer's view
        self._seen: dict[int, dict[int, Any]] = {}  # id of a context: the sequences members decoded on, by id
        self._closed = False
        self._order = 0
        self.steps = 0
        self.widest = 0
        self.set_aside = 0

    # -- members --------------------------------------------------------------------

    def spawn(self, fn: Callable[..., Any], *args: Any) -> Member:
        """Start ``fn(*args)`` as a member; it runs at the next ``drive``. Its value or error is its ``result``."""
        if self._closed:
            raise RuntimeError("This StepBatcher is closed.")
        self._order += 1
        member = Member(functools.partial(fn, *args), self._order)
        self._members.append(member)
        self._ready.append(member)
        return member

    @property
    def members(self) -> int:
        """Members not yet done."""
        return len(self._members)

    @property
    def waiting_for_room(self) -> int:
        """Members set aside now, until their cells fit again."""
        return len(self._aside)

    @property
    def current(self) -> Optional[Member]:
        """The member whose code is running now (None: the caller is not one)."""
        return self._running

    def inside(self) -> bool:
        """Whether the calling code runs as one of the members."""
        return self._running is not None

    def drive(self, until: Optional[Callable[[], bool]] = None) -> None:
        """Run the members, from this thread, until ``until()`` holds between two steps or none is left.

        Ctrl-C (on the main thread) is taken between steps, or stops a long step whose calls can all be
        cancelled (cancelling them): ``drive`` then raises KeyboardInterrupt with the members parked, and the
        caller cancels them and drives again until they are done.
        """
        if self._hub is not None:
            raise RuntimeError("This StepBatcher is already being driven; a member cannot drive it.")
        self._hub = greenlet.getcurrent()
        try:
            with self._interrupts_deferred():
                self._loop(until)
        finally:
            self._hub = None

    def _loop(self, until: Optional[Callable[[], bool]]) -> None:
        while True:
            self._run_ready()
            if self._interrupted:  # every member is parked: a safe point
                self._interrupted = False
                raise KeyboardInterrupt
            if until is not None and until():
                return
            if not self._members:
                return
            if self._wake_paused():
                continue
            self._drop_cancelled()
            self._bring_back(force=not self._calls)
            if self._calls:
                try:
                    self._step()
                except Exception:  # a bug or llama.cpp gone wrong: the calls fail, their members go on
                    self._fail_calls()
            elif self._paused:  # every member paused, waiting for something no step will bring
                self._unstick()
            elif self._aside:  # set aside, with nothing else left that holds cells it could wait for
                self._fail_aside()

    def pause(self, until: Callable[[], bool]) -> bool:
        """From a member: wait, decoding nothing, until ``until()`` holds (looked at between steps). True when
        it does; False when nothing else could go on (every other member waiting too), so the caller goes on
        without it. Outside the members: ``until()`` at once."""
        member = self._running
        if member is None or until():
            return until() if member is None else True
        member.until = until
        self._paused.append(member)
        self._park(member)
        return member.woken

    def _park(self, member: Member) -> None:
        """Hand the thread back to the loop until ``member`` is made ready again."""
        assert self._hub is not None
        self._running = None
        self._hub.switch()
        self._running = member

    def _run_ready(self) -> None:
        """Switch into each ready member until it parks again or ends."""
        while self._ready:
            member = self._ready.popleft()
            if member.glet is None:
                member.glet = greenlet(functools.partial(self._body, member))
            self._running = member
            try:
                member.glet.switch()
            finally:
                self._running = None
            if member.done:
                self._members.remove(member)
                self._freed = True  # its cells may serve a member set aside

    @staticmethod
    def _body(member: Member) -> None:
        try:
            member.value = member.fn()
        except BaseException as exc:  # the caller's, through ``result``
            member.error = exc
        finally:
            member.done = True

    def _wake_paused(self) -> bool:
        """Make ready the paused members whose condition holds; whether there were any."""
        woke = False
        for member in list(self._paused):
            assert member.until is not None
            if member.until():
                self._paused.remove(member)
                member.until, member.woken = None, True
                self._ready.append(member)
                woke = True
        return woke

    def _unstick(self) -> None:
        """Every member is paused and no step can come: each goes on without what it waited for."""
        for member in self._paused:
            member.until, member.woken = None, False
            self._ready.append(member)
        self._paused.clear()

    @contextlib.contextmanager
    def _interrupts_deferred(self) -> Iterator[None]:
        """On the main thread with Python's own Ctrl-C handler: Ctrl-C only sets ``_interrupted``, so that it never
        lands inside a member's bookkeeping or between a decode and its record."""
        if threading.current_thread() is not threading.main_thread() or \
                signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            yield
            return

        def defer(_signum: int, _frame: Any) -> None:
            self._interrupted = True

        previous = signal.signal(signal.SIGINT, defer)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)
        if self._interrupted:  # it came after the last look between steps: the caller hears of it now
            self._interrupted = False
            raise KeyboardInterrupt

    # -- decode calls ------------------------------------------------------------------

    def decode(self, model: Any, tokens: np.ndarray, start: int, every: bool, last: bool,
               abort: Optional[threading.Event]) -> tuple[int, np.ndarray, float, int, tuple[int, int, int]]:
        """Decode ``tokens`` at positions ``start`` on of ``model``'s sequence (``every``: each asks for its
        logits; ``last``: the last one does): from a member, with the other members' calls in the loop's next
        step; from outside, at once.

        Returns:
            llama.cpp's code (0: decoded; 2: ``abort`` was set first; -1: the step failed), the rows of the tokens
            whose logits were asked for (those finished in the last step are a view of llama.cpp's buffer, valid
            until the next step), the seconds of the decodes that served it, the most calls one of them held,
            and what the other calls put in the last one: their tokens, how many of them asked for every
            token's logits (streams verifying, where a prompt being read asks for one row or none), and how
            many calls they were.
        """
        if self._closed:
            raise RuntimeError("This StepBatcher is closed.")
        member = self._running
        call = _Call(model, tokens, start, every, last, abort, member)
        if member is None:  # alone, now: nothing else decodes while this thread is here
            self._decode_taken(model, [(call, call.m)])
        else:
            member.seqs.add(model.seq)
            self._seen.setdefault(id(model._ctx), {})[model.seq] = model
            self._calls.append(call)
            self._park(member)
        return call.rc, call.result(model.n_vocab), call.seconds, call.width, call.beside

    def run(self, fn: Callable[[], Any]) -> Any:
        """``fn()``: a llama.cpp call on an attached context other than a decode (a cut, a checkpoint, a state).
        Members run one at a time on the loop's thread, between steps, so it runs at once."""
        return fn()

    def close(self) -> None:
        """Free the batches (the batcher cannot be used afterwards). Members still parked are failed, again at
        each call they make, until they have run to their end and left their caches consistent."""
        for _ in range(1000):  # each round fails what they wait in; their clean-up may decode once or twice more
            if not self._members or self._hub is not None:
                break
            self._fail_calls()
            while self._aside:
                self._fail_aside()
            self._unstick()
            with contextlib.suppress(Exception):
                self._hub = greenlet.getcurrent()
                try:
                    self._run_ready()
                finally:
                    self._hub = None
        self._closed = True
        for made in self._batches.values():
            ll.llama_batch_free(made[0])
        self._batches.clear()
        self._views.clear()

    def _wake(self, call: _Call) -> None:
        if call.member is not None:
            self._ready.append(call.member)

    # -- a step ---------------------------------------------------------------------------

    def _step(self) -> None:
        """One decode per context over the calls: the shortest first, a long one filling the rest."""
        for call in self._calls:
            if call.abort is not None and call.abort.is_set():
                call.rc, call.finished = 2, True
                self._wake(call)
        self._calls = [c for c in self._calls if not c.finished]
        by_context: dict[int, list[_Call]] = {}
        for call in sorted(self._calls, key=lambda c: c.m - c.done):
            by_context.setdefault(id(call.model._ctx), []).append(call)
        # per context: its calls, which of them are streams, and the streams' tokens
        groups = []
        for group in by_context.values():
            streams = [_is_stream(call) for call in group]
            groups.append((group, streams, sum(c.m - c.done for c, s in zip(group, streams, strict=True) if s)))
        # a step waits for all its contexts' decodes: a prompt is weighed against every generation decoding in
        # it, on any context (a lane drafting with a draft model has its calls there, and so has a draft model
        # reading a prompt after its target)
        lefts = [self._left(call, base) for group, streams, base in groups
                 for call, stream in zip(group, streams, strict=True) if stream or call.model.reading_end is None]
        shortest = min(lefts, default=float("inf"))
        longest = max((x for x in lefts if x < float("inf")), default=0.0)
        t0, held = time.perf_counter(), []
        for group, streams, base in groups:
            held += self._decode_group(group, streams, base, (shortest, longest))
        for call in held:  # a reading's waits count across its calls (one per n_batch tokens)
            call.model.reading_waited += time.perf_counter() - t0
        self._calls = [c for c in self._calls if not c.finished]

    def _decode_group(self, group: list[_Call], streams: list[bool], base: int,
                      ends: tuple[float, float]) -> list[_Call]:
        """One llama.cpp decode of as much of ``group``'s calls (on one context; ``streams``: which of them are
        streams, ``base``: their tokens) as its ``n_batch`` takes. The calls held back for shorter requests
        (``ends``: the least and the most time a generation decoding in the step has left)."""
        if any(call.aside for call in group):  # set aside earlier in this step, for another context's cells
            kept = [i for i, call in enumerate(group) if not call.aside]
            group, streams = [group[i] for i in kept], [streams[i] for i in kept]
            if not group:
                return []
            base = sum(c.m - c.done for c, s in zip(group, streams, strict=True) if s)
        first = group[0].model
        capacity = self._batch(first)[1]
        taken: list[tuple[_Call, int]] = []  # a call, and how many of its tokens go in this step
        n = 0
        # beside streams, the prompts take no more than stream_chunk tokens in all, or as many as each stream
        # read of its own prompt: a request waits per step at most about what reading its prompt took, so a
        # short one beside a long prompt keeps going, and requests of like prompts sent together are read in
        # a few large steps, at the batch's rate, not in many small ones
        if all(streams) and base <= capacity:  # streams alone, all of them fitting: the common step
            self._decode_taken(first, [(call, call.m - call.done) for call in group])
            return []
        read = [call.model.prompt_read for call, stream in zip(group, streams, strict=True) if stream]
        reading = max(self.stream_chunk, min(read)) if self.stream_chunk and read else capacity
        held = self._held(group, streams, base, *ends)
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
        if taken:  # else every call here is held for a stream on another context: that one decodes this step
            self._decode_taken(first, taken)
        return [group[i] for i in held]

    def _decode_taken(self, first: Any, taken: list[tuple[_Call, int]]) -> None:
        """Decode ``taken`` on ``first``'s context. Where its cells have no room for them all, an idle sequence's
        cells are freed, then the member started last is set aside, until they fit; a call that still does not
        fit alone fails (llama.cpp's code 1)."""
        while taken and self._decode(first, taken, last_try=False) == 1:
            if self.room is not None and self.room(first):
                self._freed = True
                continue
            victim = self._victim(first, taken)
            try:
                if victim is None:
                    raise MemoryError
                self._put_aside(victim)
            except MemoryError:  # nothing to set aside, or no memory to save it in
                self._one_by_one(first, taken)
                return
            taken = [(call, take) for call, take in taken if call.member is not victim]

    def _one_by_one(self, first: Any, taken: list[tuple[_Call, int]]) -> None:
        """Decode ``taken`` one call at a time, so that only a call that does not fit fails. A finished call's
        rows are copied: the next call's decode overwrites the buffer before its member reads them."""
        for part in taken:
            self._decode(first, [part], last_try=True)
            call = part[0]
            if call.finished and len(taken) > 1:
                call.rows = [np.array(r) for r in call.rows]

    def _left(self, call: _Call, base: int) -> float:
        """The seconds ``call``'s generation still expects to keep the steps: its ``steps_left`` at the cost of a
        step of its context's streams (``base`` tokens; no end without an estimate, or without the costs, or for
        a call of no generation)."""
        cost, steps = self.step_cost, call.model.steps_left
        if cost is None or steps is None:
            return float("inf")
        return steps * cost(max(1, base))

    def _held(self, group: list[_Call], streams: list[bool], base: int, shortest: float,
              longest: float = 0.0) -> set[int]:
        """The prompts being read (their indices in ``group``) that wait for a shorter request.

        Reading a prompt keeps every request decoding beside it waiting about as long as the reading takes;
        waiting keeps the prompt's request waiting as long as the shortest of those has left (``shortest``:
        the least time a generation decoding in the step has left; a prompt let in counts its reading and
        its ``steps_left``). The smaller wait wins, the shortest request first: a title request beside a
        long prompt is done before the long prompt is read, while a prompt shorter than the replies beside
        it is read at once and decodes with them.

        A wait must not make the whole later, though: a held request that then decodes alone ends after the
        others, where read beside them it would have shared their steps. So a prompt waits only where the
        wait is a small part (``HOLD_SHARE``) of what its own request has left, or where, held, its request
        still ends no later than the longest one beside it (``longest``): sub-agents of like size are read
        together, as llama-server reads them, and done when it is done. A prompt waits in all
        (``reading_waited``) no longer than its reading would have kept the others, so a line of short
        requests cannot hold it forever.
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
            own = owns[i] if group[i].model.steps_left is not None else float("inf")  # no known end: long
            pays = shortest <= HOLD_SHARE * own or shortest + own <= longest
            if reads[i] > shortest and pays and group[i].model.reading_waited < reads[i]:
                held.add(i)
            else:
                shortest, longest = min(shortest, owns[i]), max(longest, owns[i])
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
        batch, capacity, tokens, pos, flags, slots = self._batch(first)
        n, counts = 0, []
        for call, take in taken:
            done, wanted = call.done, call.wanted(call.done, take)
            if take == 1:  # a stream's token: scalars cost less than slices
                tokens[n], pos[n], flags[n] = call.tokens[done], call.start + done, wanted
            else:
                tokens[n:n + take] = call.tokens[done:done + take]
                np.add(POSITIONS[:take], call.start + done, out=pos[n:n + take])
                flags[n:n + take] = call.every
                flags[n + take - 1] = call.every or wanted
            seq = call.model.seq
            for i in range(n, n + take):
                if slots[i] != seq:  # llama.cpp's array of the slot's sequence, written only when it changes
                    batch.seq_id[i][0] = slots[i] = seq
            counts.append(wanted)
            n += take
        batch.n_tokens = n
        t0 = time.perf_counter()
        # a long step stops within milliseconds once every call in it is cancelled (a server shutting down, or
        # Ctrl-C); one call cancelled among others waits for the step's end, which the others need
        events = [c.abort for c, _ in taken] if n > ABORTABLE_STEP else []
        if events and all(e is not None for e in events):
            with first._log, abort_hook(first._ctx, _Stop(events, self)):  # type: ignore[arg-type]
                rc = int(ll.llama_decode(first._ctx, batch))
        else:
            with first._log:
                rc = int(ll.llama_decode(first._ctx, batch))
        if rc == 1 and not last_try:
            return rc
        n_rows = sum(counts)
        if rc == 0:
            self._keep_hidden(taken, pos, n)
        logits = None
        if rc == 0 and n_rows:
            logits = self._logits(first, n_rows)
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
                self._wake(call)
                continue
            call.done += take
            call.finished = call.done == call.m
            if r and logits is not None:
                got = logits[row:row + r]
                # a call that spans steps keeps copies: the next step overwrites the buffer
                call.rows.append(got if call.finished and not call.rows else np.array(got))
            row += r
            if call.finished:
                self._wake(call)
        return rc

    @staticmethod
    def _keep_hidden(taken: list[tuple[_Call, int]], pos: np.ndarray, n_tokens: int) -> None:
        """Each sequence that keeps hidden rows for an MTP head (``Model.keep_hidden``) gets its tokens' rows of
        the decode of ``n_tokens`` (the context gives one per token, in the batch's order) at their positions."""
        staged, n = None, 0
        if taken[0][0].model._ext is None and all(call.model._ext is None for call, _ in taken):
            return  # none keeps them (the sequences of a context keep them all or none)
        for call, take in taken:
            model = call.model
            if model.keeps_hidden:
                if staged is None:
                    staged = np.ctypeslib.as_array(model._ext.llama_get_embeddings_nextn(model._ctx),
                                                   shape=(n_tokens, model.hidden.shape[1]))
                model.hidden[pos[n:n + take]] = staged[n:n + take]
            n += take

    def _batch(self, model: Any) -> tuple[Any, int, np.ndarray, np.ndarray, np.ndarray, list[int]]:
        """The batch for ``model``'s context, made on first use (as many tokens as the context's ``n_batch``):
        it, its capacity, numpy views of its token, position and logits-wanted arrays, and the sequence each
        slot holds."""
        key = id(model._ctx)
        made = self._batches.get(key)
        if made is None:
            capacity = model.n_batch
            batch = ll.llama_batch_init(capacity, 0, 1)
            np.ctypeslib.as_array(batch.n_seq_id, shape=(capacity,))[:] = 1
            views = [np.ctypeslib.as_array(a, shape=(capacity,)) for a in (batch.token, batch.pos, batch.logits)]
            slots = [0] * capacity
            for i in range(capacity):
                batch.seq_id[i][0] = 0
            made = self._batches[key] = (batch, capacity, views[0], views[1], views[2], slots)
        return made

    def _logits(self, model: Any, rows: int) -> np.ndarray:
        """The first ``rows`` rows of ``model``'s context's logits buffer (a view)."""
        key = id(model._ctx)
        view = self._views.get(key)
        if view is None:
            view = self._views[key] = LogitsView(model.n_vocab, model.n_batch)
        return view.rows(model._ctx, rows)

    # -- members set aside for want of cells ----------------------------------------------

    def _victim(self, first: Any, taken: list[tuple[_Call, int]]) -> Optional[Member]:
        """The member to set aside so that ``first``'s context has cells again: the one started last among those
        waiting in a call that hold cells there, or whose call in ``taken`` needs them, where another member
        holds cells there that it may give back (a member alone gains nothing by waiting)."""
        holders = {id(m) for m in self._members
                   if any(v._ctx is first._ctx and holds_cells(v) for v in self._models(m))}
        # only a member still waiting in its call: one whose call ended in this step (on another context) runs
        # on with its cells as soon as the step is over
        ready = {id(m) for m in self._ready}
        waiting = {id(c.member) for c in self._calls if not c.finished and id(c.member) not in ready}
        needing = {id(c.member) for c, _ in taken if c.member is not None}
        candidates = [m for m in self._members if id(m) in waiting and (id(m) in holders or id(m) in needing)
                      and holders - {id(m)}]
        return max(candidates, key=lambda m: m.order) if candidates else None

    def _models(self, member: Member) -> list[Any]:
        """The sequences, of every context, that ``member`` has decoded on."""
        return [views[seq] for views in self._seen.values() for seq in member.seqs if seq in views]

    def _put_aside(self, member: Member) -> None:
        """Save and empty every sequence ``member`` decodes on; its calls wait until ``_bring_back``. Nothing
        changes if a state cannot be saved (no memory for it)."""
        calls = [c for c in self._calls if c.member is member]
        aside = SetAside.take(member, self._models(member), calls)
        self._calls = [c for c in self._calls if c.member is not member]
        for call in calls:
            call.aside = True
        self._aside.append(aside)
        self.set_aside += 1

    def _bring_back(self, force: bool) -> None:
        """Load the states of members set aside, the one started first first, while they fit (idle sequences'
        cells freed for them first): after a member ended or cells were freed, or when ``force`` says nothing
        else is left to decode."""
        if not self._aside or not (self._freed or force):
            return
        self._freed = False
        while self._aside:
            aside = min(self._aside, key=lambda a: a.member.order)
            while not aside.load():
                if not any(self.room is not None and self.room(model) for model, _ in aside.saved):
                    return
            self._aside.remove(aside)
            for call in aside.calls:
                call.aside = False
            self._calls.extend(aside.calls)

    def _fail_calls(self) -> None:
        """Every call waiting for a step fails (llama.cpp's code -1): nobody may wait for a step that will not
        come. Their models repair their records from what the cells hold (see ``Model._repair``)."""
        for call in self._calls:
            if not call.finished:
                call.rc, call.finished = -1, True
                self._wake(call)
        self._calls = []

    def _fail_aside(self) -> None:
        """The member set aside first cannot come back though nothing else is left: its calls fail for want of
        cells (a state that no longer fits its context alone)."""
        aside = min(self._aside, key=lambda a: a.member.order)
        self._aside.remove(aside)
        aside.drop()
        for call in aside.calls:
            call.rc, call.finished = 1, True
            self._wake(call)

    def _drop_cancelled(self) -> None:
        """Members set aside whose generation was cancelled (a call's own event, or its sequence's generation's):
        their states go, their calls end as cancelled."""
        for aside in list(self._aside):
            events = [c.abort for c in aside.calls] + [m.cancelled for m in (*(c.model for c in aside.calls),
                                                                            *(m for m, _ in aside.saved))]
            if any(e is not None and e.is_set() for e in events):
                self._aside.remove(aside)
                aside.drop()
                for call in aside.calls:
                    call.rc, call.finished = 2, True
                    self._wake(call)
