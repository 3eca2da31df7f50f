"""The lanes themselves: opened on first use, held and released, admitted by cells, and run by ``generate_many``."""

from __future__ import annotations

import copy
import statistics
import threading
import time
from collections import deque
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

import numpy as np

from ..drafting.assembly import Assembly
from ..drafting.costs import prompt_chunk
from ..drafting.mtp_head import extension
from ..errors import ConfigError, InterleavedGenerationError
from ..methods import get_method
from ..options import GenerationOptions
from ..runtime.batching import Member, StepBatcher, uninterrupted
from .sharing import SharedPrefixes

#: The reply a generation that set no max_tokens is counted to need, until the lanes have seen replies end:
#: the replies agents wait for are short, and counting the most a request may generate would run one at a time.
TYPICAL_REPLY = 1024

#: How many of the latest replies' lengths give the typical reply (their median).
REPLIES_KEPT = 64

#: What ``generate_many`` takes for each generation: a raw prompt (text or token ids) or a conversation.
Prompt = Union[str, Sequence[int], Sequence[Mapping[str, Any]]]


def is_conversation(prompt: Prompt) -> bool:
    """Whether ``prompt`` is chat messages (dicts with role and content) rather than a raw prompt."""
    return not isinstance(prompt, str) and len(prompt) > 0 and all(isinstance(m, Mapping) for m in prompt)


class Lanes(SharedPrefixes):
    """A pair's lanes: its models' other sequences, opened on first use and freed with the pair.

    Args:
        pair: the ``Pair`` (its models loaded with ``n_seq`` sequences).
    """

    def __init__(self, pair: Any):
        self.pair = pair
        self._seqs: list[tuple[Any, Any, Assembly]] = []  # sequences 1..: the target's, the draft's, their assembly
        self._cond = threading.Condition()
        self._idle = {seq: 0.0 for seq in range(self.width)}  # lanes no generation holds: when each was released
        self._holders: dict[int, Any] = {}  # the lanes generations hold: who holds each (see ``_who``)
        self._reading: dict[int, np.ndarray] = {}  # held lanes: the prompt each is reading (see ``share``)
        self._cancelled: dict[int, threading.Event] = {}  # held lanes: set when their generation's client left
        self._notices: dict[int, Callable[[str, int], None]] = {}  # held lanes: told when their generation waits
        self._admitted: dict[int, int] = {}  # held lanes whose generation has its room: the cells it needed
        self._waiting: set[int] = set()  # held lanes whose generation waits for room
        self._shared: dict[int, int] = {}  # held lanes: the prompt prefix their target shares with another lane
        self._replies: deque[int] = deque(maxlen=REPLIES_KEPT)  # the lengths of the latest replies
        self._batcher: Optional[StepBatcher] = None  # the loop the lanes decode on, once attached
        self._active = False  # a generate_many or generate_each is under way
        self._said_alone = False  # the pair said that it runs prompts one after another (see ``_each``)
        #: Generations that waited for room in the shared cells before they began.
        self.room_waits = 0
        #: Generations set aside for want of cells (and brought back when room came) by ``generate_many``'s
        #: loops; a server's loop counts its own.
        self.set_aside = 0

    @property
    def width(self) -> int:
        """How many generations the pair can decode together: its models' sequences."""
        return int(self.pair.target.n_seq)

    def lane(self, i: int) -> Any:
        """Lane ``i``: the pair itself for 0, else a shallow copy of it over sequence ``i`` of each model, made
        now, so that it shares what the pair holds now (prompt cache, history, measured costs, options)."""
        pair = self.pair
        if i == 0:
            return pair
        with self._cond:  # made once, whichever thread asks first
            while len(self._seqs) < i:
                seq = len(self._seqs) + 1
                target = pair.target.sequence(seq)
                draft = pair.draft.sequence(seq) if pair.draft is not None else None
                self._seqs.append((target, draft, Assembly(target, draft)))
        lane = copy.copy(pair)
        lane.target, lane.draft, lane.assembly = self._seqs[i - 1]
        # what the pair measures (thread counts, the cost profile) is measured once, on it, and kept there
        lane.choose_threads, lane.calibrate = pair.choose_threads, pair.calibrate
        return lane

    def acquire(self, cancelled: Optional[threading.Event] = None,
                notice: Optional[Callable[[str, int], None]] = None) -> int:
        """A lane no generation holds, held until ``release``. An empty one first, so that what the others hold
        stays for a prompt that shares it (see ``share``), then the one released longest ago. Once ``cancelled``
        is set (its client left), the lane's generation waits for nothing more; ``notice`` is told, in a
        sentence and with the prompt's length, when it waits for room.

        Raises:
            RuntimeError: every lane is held (a caller starts at most ``width`` generations at once).
        """
        with self._cond:
            if not self._idle:
                raise RuntimeError("Every lane is held; start a generation only when one is free.")
            targets = self._models()[0]
            seq = min(self._idle, key=lambda s: (targets[s] is not None and targets[s].n_past > 0, self._idle[s]))
            del self._idle[seq]
            self._holders[seq] = self._who()
            if cancelled is not None:
                self._cancelled[seq] = cancelled
            if notice is not None:
                self._notices[seq] = notice
            return seq

    def _who(self) -> Any:
        """Who is calling: the loop's member that runs now, else the thread."""
        batcher = self._batcher
        member = batcher.current if batcher is not None else None
        return member if member is not None else threading.get_ident()

    @property
    def free(self) -> int:
        """Lanes no generation holds."""
        return len(self._idle)

    def release(self, seq: int) -> None:
        """Lane ``seq`` is free again; what its sequences hold stays until another lane needs the cells."""
        with self._cond:
            self._idle[seq] = time.monotonic()
            self._holders.pop(seq, None)
            self._reading.pop(seq, None)
            self._cancelled.pop(seq, None)
            self._notices.pop(seq, None)
            self._admitted.pop(seq, None)
            self._shared.pop(seq, None)
            target = self._models()[0][seq]
            if target is not None and target.last_reply is not None:
                self._replies.append(target.last_reply)
                target.last_reply = None

    def typical_reply(self) -> int:
        """The reply a generation that set no max_tokens is counted to need: the median of the latest replies
        (``TYPICAL_REPLY`` before any ended)."""
        return int(statistics.median(self._replies)) if self._replies else TYPICAL_REPLY

    def free_idle(self, model: Any) -> bool:
        """``StepBatcher.room``: empty the sequence of ``model``'s context of the idle lane released longest ago
        that holds cells there, else of a lane whose generation waits for room (it has read nothing yet);
        whether there was one. What an idle lane held is in the prompt cache, if the pair has one."""
        with self._cond:
            for models in self._models():
                if models[0]._ctx is not model._ctx:
                    continue
                for other in [*sorted(self._idle, key=self._idle.__getitem__), *sorted(self._waiting)]:
                    if models[other] is not None and models[other].n_past:
                        models[other].reset()
                        return True
        return False

    def make_room(self, seq: int, need: int) -> None:
        """Before lane ``seq`` reads a prompt: empty idle lanes' sequences, the one released longest ago first,
        until ``need`` cells (at most the context) are free of what the other lanes hold. A lane that is
        generating is never touched; an idle one's last state is in the prompt cache, if the pair has one."""
        if self.width == 1:
            return
        with self._cond:
            for models in self._models():
                n_ctx = models[seq].n_ctx
                held = sum(m.cells for i, m in enumerate(models) if i != seq and m is not None)
                for other in sorted(self._idle, key=self._idle.__getitem__):
                    if held + min(need, n_ctx) <= n_ctx:
                        break
                    if other != seq and models[other] is not None and models[other].n_past:
                        held -= models[other].cells
                        models[other].reset()

    def ready(self, target: Any, prompt: Sequence[int], max_tokens: int) -> None:
        """Before a generation on ``target`` (one of the lanes' target sequences) reads ``prompt``: the longest
        prefix of it another lane holds, shared (see ``share``; where a lane that is reading a prompt will hold
        more of it soon, once it does), then a wait until its cells fit beside what the running generations
        claim (see ``_await_room``), room for it (see ``make_room``), and the idle lanes the prompt cache can
        bring back emptied (see ``empty_saved``)."""
        if self.width == 1:
            return
        with self._cond:
            if self._holders and self._holders.get(target.seq) != self._who():
                self._busy_check()  # a generation on a lane this caller does not hold, beside the lanes' own
        wanted = np.asarray(prompt[:-1], dtype=np.int32)
        if not self._await_reader(target, wanted):  # its client left while it waited: it will read nothing
            return
        self.share(target, wanted)
        cells = target.prompt_cells(prompt)  # a position a token; more for an image under M-RoPE
        reply = self._reply_room(target, cells, max_tokens)
        self._await_room(target, cells, reply)
        self.empty_saved(target.seq)  # first: what the prompt cache brings back leaves before what it cannot
        # room for the whole prompt, the shared part too: the prompt cache may still put a longer state in its
        # place, which takes its cells while it loads (lanes that share cells are each counted whole, so this
        # errs toward emptying one idle lane more); for the reply, no more than a typical one's (the loop
        # frees idle lanes' cells as they are needed)
        self.make_room(target.seq, cells + min(reply, TYPICAL_REPLY))

    def _reply_room(self, target: Any, prompt: int, max_tokens: int) -> int:
        """The cells a generation counts on for its reply: its ``max_tokens``, or a typical reply where that
        reaches past the context's room (a request that set none)."""
        room = target.n_ctx - prompt
        return max_tokens if max_tokens < room else min(room, self.typical_reply())

    def _claimed(self, seq: int) -> int:
        """What the generations admitted on lanes other than ``seq`` claim of the target's cells: what each needed
        when it began (its prompt and reply), or what it holds and may still add, where that is more (a typical
        reply's worth where it set no max_tokens)."""
        targets = self._models()[0]
        claimed = 0
        for other, need in self._admitted.items():
            t = targets[other]
            if other != seq and t is not None:
                left = t.cells_left if t.cells_left is not None else self.typical_reply()
                claimed += max(need, t.cells - self._shared.get(other, 0) + left)
        return claimed

    def _await_room(self, target: Any, prompt: int, reply: int) -> None:
        """Wait until the cells ``target``'s generation needs (its prompt, less what it already holds, and
        ``reply``) fit beside what the others claim, and no generation is set aside (those come back first);
        then it counts as admitted. It goes on at once when it is the only one, when its client has left, or
        when nothing else could go on."""
        seq, batcher = target.seq, self._batcher
        # its prompt and reply, less the prefix it shares with another lane (those cells are counted there);
        # what the lane held before beyond its prompt goes when the prompt is read
        need = prompt - self._shared.get(seq, 0) + reply

        def fits() -> bool:
            gone = self._cancelled.get(seq)
            if gone is not None and gone.is_set():
                return True
            if batcher is not None and batcher.waiting_for_room:
                return False
            return not self._admitted.keys() - {seq} or self._claimed(seq) + min(need, target.n_ctx) <= target.n_ctx

        if batcher is not None and batcher.inside() and not fits():
            self.room_waits += 1
            notice = self._notices.get(seq)
            if notice is not None:
                notice(f"waiting for room: the running requests claim {self._claimed(seq)} of the "
                       f"{target.n_ctx} cells the context holds, and this one needs {need}", prompt)
            self._waiting.add(seq)
            try:
                batcher.pause(fits)
            finally:
                self._waiting.discard(seq)
        with self._cond:
            if seq in self._holders:
                self._admitted[seq] = min(need, target.n_ctx)

    def empty_saved(self, seq: int) -> None:
        """Before lane ``seq`` reads a prompt: empty the idle lanes' sequences whose contents the pair's prompt
        cache holds in RAM. One unified cache attends over every cell up to the highest in use, so an idle
        conversation's cells make every step of the others longer; a restore brings it back when it returns.
        Cells it shares with a lane that is generating stay that lane's. Only plain attention caches leave
        (a recurrent or windowed state comes back only whole), and none while another generation is still
        setting up (it may be about to share an idle lane's cells)."""
        cache = self.pair.cache
        if cache is None:
            return
        with self._cond:
            if any(s != seq and s not in self._reading for s in self._holders):
                return
            for models in self._models():
                for other in self._idle:
                    model = models[other]
                    if other != seq and model is not None and model.n_past and model.cuts_after_load and \
                            cache.holds(model):
                        model.reset()

    def _models(self) -> list[list[Any]]:
        """The target's sequences and the draft's, by lane (None: not opened yet, so holding nothing)."""
        made = [(self.pair.target, self.pair.draft), *((t, d) for t, d, _ in self._seqs)]
        made += [(None, None)] * (self.width - len(made))
        targets, drafts = [t for t, _ in made], [d for _, d in made]
        return [targets] + ([drafts] if self.pair.draft is not None else [])

    def attach(self, batcher: Optional[StepBatcher]) -> None:
        """Send every lane's decode calls (the target's and the draft's) to ``batcher``; None: each alone again.
        Where the pair's costs are known, a prompt beside decoding lanes is read in chunks sized from them (see
        ``costs.prompt_chunk``), or after a shorter request, as they weigh the two (``StepBatcher.step_cost``)."""
        profile = self.pair.cost_profile
        self._batcher = batcher
        if batcher is not None:
            batcher.stream_chunk = None if profile is None else prompt_chunk(profile)
            batcher.step_cost = None if profile is None else profile.reading_seconds
            batcher.room = self.free_idle
        self.lane(self.width - 1)  # every sequence opened
        if batcher is not None and self.pair.target.n_nextn:
            self._keep_hidden()
        for models in self._models():
            for model in models:
                model.attach(batcher)
                model.lender = self.lend if batcher is not None else None

    def _keep_hidden(self) -> None:
        """Every lane's target keeps hidden rows for an MTP head from now on, whichever lane's head opens first:
        a lane only shares cells with lanes that keep them too, and a lane that starts keeping them empties its
        cache (which would drop what it had just shared)."""
        try:
            extension()
        except ConfigError:  # a build without it runs no head: nothing to keep
            return
        for target in self._models()[0]:
            target.keep_hidden()

    def close(self) -> None:
        """Free the lanes' sequences (their batches; the contexts go with the pair's models)."""
        for target, draft, assembly in self._seqs:
            assembly.close()
            target.close()
            if draft is not None:
                draft.close()
        self._seqs.clear()

    def generate_many(self, prompts: Sequence[Prompt], options: Optional[GenerationOptions],
                      changes: Mapping[str, Any], return_exceptions: bool) -> list[Any]:
        """See ``Pair.generate_many``."""
        results: list[Any] = [None] * len(prompts)
        for i, result in self.each(prompts, options, changes):
            results[i] = result
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if failed is not None and not return_exceptions:
            raise failed
        return results

    def each(self, prompts: Sequence[Prompt], options: Union[None, GenerationOptions, Sequence[GenerationOptions]],
             changes: Mapping[str, Any]) -> Iterator[tuple[int, Any]]:
        """See ``Pair.generate_each``."""
        items = list(prompts)
        pair = self.pair
        each = list(options) if isinstance(options, Sequence) else [options] * len(items)
        if len(each) != len(items):
            raise ConfigError(f"generate_each was given {len(each)} options for {len(items)} prompts; give one "
                              "GenerationOptions for all, or one per prompt.")
        opts = [pair.options(o, **changes) for o in each]  # a bad option fails before any work
        for i, item in enumerate(items):
            if not isinstance(item, (str, Sequence)) or (not isinstance(item, str) and not len(item)):
                raise ConfigError(f"Prompt {i} is {item!r}; give text, token ids or a list of chat messages.")
        with self._cond:
            self._busy_check()
        return self._each(items, opts)

    def _busy_check(self) -> None:
        """Raise if the lanes are already in use (another ``generate_many`` or ``generate_each``, a server)."""
        if self._active or self._holders:
            raise InterleavedGenerationError(
                "This pair's sequences are already generating (generate_many or generate_each under way, or a "
                "server); finish that, or leave its loop, before starting more on the pair.")

    def _each(self, items: list[Prompt], opts: list[GenerationOptions]) -> Iterator[tuple[int, Any]]:
        pair = self.pair
        width = min(self.width, len(items))
        if width <= 1:  # one sequence: one after another, as generate and chat would
            if len(items) > 1 and not self._said_alone:  # once a pair: the caller may have expected them together
                self._said_alone = True
                pair.notify("localspec: this pair holds one sequence, so its prompts run one after another; load "
                            "it with parallel=4 (or more) to decode several together.")
            for i, item in enumerate(items):
                yield i, self._one(pair, item, opts[i])
            return
        with self._cond:
            self._busy_check()
            self._active = True
        for o in {id(o): o for o in opts}.values():
            self._prepare(o)
        batcher = StepBatcher()
        self.attach(batcher)
        running: dict[int, Any] = {}  # the streams under way, by prompt: cancelled if the caller stops early
        waiting = deque(range(len(items)))  # the prompts not started, in order
        members: dict[int, Member] = {}  # the ones started and not yet handed to the caller
        stop = threading.Event()

        def started(i: int, stream: Any) -> None:
            running[i] = stream
            if stop.is_set():  # the caller stopped while it was being set up
                stream.cancel()

        def run(i: int) -> Any:
            seq = self.acquire()  # started only while a lane is free
            try:
                return self._one(self.lane(seq), items[i], opts[i], lambda s: started(i, s))
            finally:
                running.pop(i, None)
                self.release(seq)

        try:
            while waiting or members:
                while waiting and len(members) < width:  # a lane for each, as one ends
                    i = waiting.popleft()
                    members[i] = batcher.spawn(run, i)
                batcher.drive(until=lambda: any(m.done for m in members.values()))
                for i in [i for i, m in members.items() if m.done]:
                    member = members.pop(i)
                    if member.error is not None:  # not the generation's own (it comes back as its value)
                        raise member.error
                    yield i, member.value
        finally:  # also when the caller stopped early (Ctrl-C, a break): what runs is cancelled, the rest not started
            waiting.clear()
            stop.set()
            for stream in list(running.values()):
                stream.cancel()
            try:
                uninterrupted(batcher.drive)  # every member done before the lanes decode alone again
            finally:  # (close runs any that a failed loop left parked to their end)
                batcher.close()
                self.attach(None)
                self.set_aside += batcher.set_aside
                with self._cond:
                    self._active = False

    def _prepare(self, opts: GenerationOptions) -> None:
        """What every lane would otherwise do first, done once on sequence 0 before the lanes are made: the
        thread counts, the cost profile (for a method that decides by it), and the history store opened."""
        pair = self.pair
        pair.choose_threads()
        method = get_method(opts.method)
        if method.adaptive and method.build is not None and opts.draft_length(pair.draft_k) > 0:
            pair.calibrate()
        if opts.history:
            _ = pair.history

    @staticmethod
    def _one(lane: Any, item: Prompt, opts: GenerationOptions,
             started: Optional[Callable[[Any], None]] = None) -> Any:
        """``item``'s result on ``lane``, or its exception; ``started`` is given its stream first."""
        try:
            stream = lane.stream_chat(item, opts) if is_conversation(item) else lane.stream(item, opts)
            if started is not None:
                started(stream)
            return stream.finish()
        except Exception as exc:
            return exc  # in its place: the caller decides whether to raise it
