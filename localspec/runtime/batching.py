"""The step loop: generations decoded together, each one's code written as if it ran alone.

Each generation on a sequence of a shared context (``Model.sequence``) runs as a *member* of a ``StepBatcher``:
a greenlet (a coroutine with a stack of its own) that ``spawn`` starts. Its code calls ``eval`` as it would
alone; a decode call on an attached sequence parks the member, and once every member is parked (in a call, a
``pause`` or set aside) the loop (``drive``) makes one ``llama_decode`` per context (the target's, the draft
model's) of all their tokens, each under its own sequence id, and switches back into each member with its
rows. One thread runs it all: no lock and no thread handoff lies in the path of a step, and llama.cpp's CPU
threads are one team. N generations decode in lockstep, a step costing about what one sequence of their total
tokens costs, and the code of a round (drafting, acceptance, cutting back) is the same as for one stream.

Which calls go into a step is ``step_plan``'s rule (streams first, a prompt beside them in chunks, or held for
a shorter request where that pays); ``joint_decode`` fills and decodes the batch.

When the members need more cells than the shared cache has free, an idle sequence's cells go first (``room``,
which the pair's lanes set), then the member started last is set aside (``aside.SetAside``: its sequences
saved to RAM and emptied) and brought back, exact, once a member ends and its state fits again. No member
fails for want of cells that it would have had alone.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import numpy as np
from greenlet import greenlet

from . import step_plan
from .aside import SetAside, holds_cells
from .joint_decode import DecodeCall, JointDecoder


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
    waits: Any = None  # while paused on work done elsewhere (a future): the loop may wait for it
    woken: bool = True  # what its ``pause`` returns once it is switched back into

    def result(self) -> Any:
        """Its value, or its error raised."""
        if self.error is not None:
            raise self.error
        return self.value


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


class StepBatcher:
    """The loop that runs generations on the sequences attached to it (``Model.attach``) and gathers their decode
    calls into joint decodes.

    ``spawn`` adds a member; ``drive`` runs the members, from the thread that calls it, until a condition holds
    or none is left. A decode call made outside the members (before the loop starts, or between its runs)
    decodes at once, alone. Everything that touches an attached context runs on the thread that drives.

    Attributes:
        set_aside: generations set aside for want of cells (each brought back once room came).
    """

    def __init__(self, stream_chunk: Optional[int] = None) -> None:
        #: In a step that holds a stream (a call asking every token's logits: a round being verified), the most
        #: tokens the prompts being read take (None: all the room there is), so the stream's step stays short;
        #: more where every stream read more of its own prompt (see ``_decode_group``).
        self.stream_chunk = stream_chunk
        #: Seconds one decode of n tokens takes (set from the measured costs; None: unknown). With it, a prompt
        #: whose reading would keep the requests beside it waiting longer than the shortest of them has left
        #: waits for that one instead (see ``step_plan.held``).
        self.step_cost: Optional[Callable[[int], float]] = None
        #: Frees the cells of one idle sequence of a model's context (not a member's), the one that can best
        #: spare them; whether it found one (None: there are none). The pair's lanes set it.
        self.room: Optional[Callable[[Any], bool]] = None
        self._members: list[Member] = []  # live, in start order
        self._ready: deque[Member] = deque()  # to switch into: new, or their call or pause is over
        self._calls: list[DecodeCall] = []  # members' calls waiting for a step
        self._paused: list[Member] = []
        self._aside: list[SetAside] = []  # in the order they were set aside
        self._running: Optional[Member] = None  # the member whose code runs now
        self._hub: Optional[greenlet] = None  # the loop's own greenlet while ``drive`` runs
        self._freed = False  # a member ended or cells were freed since a set-aside member last tried to come back
        self._interrupted = False  # Ctrl-C came during ``drive``: raised at the next point between steps
        self._joint = JointDecoder(self._wake, lambda: self._interrupted)
        self._seen: dict[int, dict[int, Any]] = {}  # id of a context: the sequences members decoded on, by id
        self._closed = False
        self._order = 0
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
    def steps(self) -> int:
        """Joint decodes made."""
        return self._joint.steps

    @property
    def widest(self) -> int:
        """The most calls one decode held."""
        return self._joint.widest

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

    def pause(self, until: Callable[[], bool], waits: Any = None) -> bool:
        """From a member: wait, decoding nothing, until ``until()`` holds (looked at between steps). True when
        it does; False when nothing else could go on (every other member waiting too, none on the future it
        ``waits`` for, work on another thread), so the caller goes on without it. Outside: ``until()`` at once."""
        member = self._running
        if member is None or until():
            return until() if member is None else True
        member.until, member.waits = until, waits
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
                member.until, member.waits, member.woken = None, None, True
                self._ready.append(member)
                woke = True
        return woke

    def _unstick(self) -> None:
        """Every member is paused and no step can come: another thread's work waited for is waited for (0.1 s at a
        time, Ctrl-C taken between); else each goes on without what it waited for."""
        if pending := [m.waits for m in self._paused if m.waits is not None and not m.waits.done()]:
            concurrent.futures.wait(pending, 0.1, concurrent.futures.FIRST_COMPLETED)
            return
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
        call = DecodeCall(model, tokens, start, every, last, abort, member)
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
        self._joint.free()

    def _wake(self, call: DecodeCall) -> None:
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
        by_context: dict[int, list[DecodeCall]] = {}
        for call in sorted(self._calls, key=lambda c: c.m - c.done):
            by_context.setdefault(id(call.model._ctx), []).append(call)
        # per context: its calls, which of them are streams, and the streams' tokens
        groups = []
        for group in by_context.values():
            streams = [call.is_stream() for call in group]
            groups.append((group, streams, sum(c.m - c.done for c, s in zip(group, streams, strict=True) if s)))
        # a step waits for all its contexts' decodes: a prompt is weighed against every generation decoding in
        # it, on any context (a lane drafting with a draft model has its calls there, and so has a draft model
        # reading a prompt after its target)
        lefts = [step_plan.time_left(call, base, self.step_cost) for group, streams, base in groups
                 for call, stream in zip(group, streams, strict=True) if stream or call.model.reading_end is None]
        shortest = min(lefts, default=float("inf"))
        longest = max((x for x in lefts if x < float("inf")), default=0.0)
        t0, held = time.perf_counter(), []
        for group, streams, base in groups:
            held += self._decode_group(group, streams, base, (shortest, longest))
        for call in held:  # a reading's waits count across its calls (one per n_batch tokens)
            call.model.reading_waited += time.perf_counter() - t0
        self._calls = [c for c in self._calls if not c.finished]

    def _decode_group(self, group: list[DecodeCall], streams: list[bool], base: int,
                      ends: tuple[float, float]) -> list[DecodeCall]:
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
        capacity = self._joint.capacity(first)
        if all(streams) and base <= capacity:  # streams alone, all of them fitting: the common step
            self._decode_taken(first, [(call, call.m - call.done) for call in group])
            return []
        taken, held = step_plan.plan(group, streams, base, ends, capacity, self.stream_chunk, self.step_cost)
        if taken:  # else every call here is held for a stream on another context: that one decodes this step
            self._decode_taken(first, taken)
        return [group[i] for i in held]

    def _decode_taken(self, first: Any, taken: list[tuple[DecodeCall, int]]) -> None:
        """Decode ``taken`` on ``first``'s context. Where its cells have no room for them all, an idle sequence's
        cells are freed, then the member started last is set aside, until they fit; a call that still does not
        fit alone fails (llama.cpp's code 1)."""
        while taken and self._joint.decode(first, taken, last_try=False) == 1:
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

    def _one_by_one(self, first: Any, taken: list[tuple[DecodeCall, int]]) -> None:
        """Decode ``taken`` one call at a time, so that only a call that does not fit fails. A finished call's
        rows are copied: the next call's decode overwrites the buffer before its member reads them."""
        for part in taken:
            self._joint.decode(first, [part], last_try=True)
            call = part[0]
            if call.finished and len(taken) > 1:
                call.rows = [np.array(r) for r in call.rows]

    # -- members set aside for want of cells ----------------------------------------------

    def _victim(self, first: Any, taken: list[tuple[DecodeCall, int]]) -> Optional[Member]:
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
