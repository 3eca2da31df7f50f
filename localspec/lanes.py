"""Several generations of one pair at once: a lane per sequence of its models' contexts, decoded together.

A pair loaded with ``parallel=N`` holds N sequences in each model's context (one unified cache). Lane 0 is the
pair itself; lane i is the same pair over sequence i of each model. ``generate_many`` runs one generation per
lane, each in its own thread, each exactly as it would run alone (its own drafter, acceptance, cut-backs and
prompt-cache restores), while a ``StepBatcher`` gathers their decode calls into one llama.cpp decode per model
and step. The pair's prompt cache, history, cost correction and measured costs are shared by its lanes.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

import numpy as np

from .drafting.assembly import Assembly
from .drafting.costs import prompt_chunk
from .drafting.mtp_head import extension
from .errors import ConfigError, GenerationCancelled, InterleavedGenerationError
from .methods import get_method
from .options import GenerationOptions
from .runtime.batching import StepBatcher, uninterrupted
from .runtime.vocabulary import common_prefix as prefix_length

#: The fewest tokens more than its own that a lane takes from another's cells (below, reading them costs little).
MIN_SHARED = 32

#: What ``generate_many`` takes for each generation: a raw prompt (text or token ids) or a conversation.
Prompt = Union[str, Sequence[int], Sequence[Mapping[str, Any]]]


def is_conversation(prompt: Prompt) -> bool:
    """Whether ``prompt`` is chat messages (dicts with role and content) rather than a raw prompt."""
    return not isinstance(prompt, str) and len(prompt) > 0 and all(isinstance(m, Mapping) for m in prompt)


class Lanes:
    """A pair's lanes: its models' other sequences, opened on first use and freed with the pair.

    Args:
        pair: the ``Pair`` (its models loaded with ``n_seq`` sequences).
    """

    def __init__(self, pair: Any):
        self.pair = pair
        self._seqs: list[tuple[Any, Any, Assembly]] = []  # sequences 1..: the target's, the draft's, their assembly
        self._cond = threading.Condition()
        self._idle = {seq: 0.0 for seq in range(self.width)}  # lanes no generation holds: when each was released
        self._holders: dict[int, int] = {}  # the lanes generations hold: the thread that holds each
        self._reading: dict[int, np.ndarray] = {}  # held lanes: the prompt each is reading (see ``share``)
        self._cancelled: dict[int, threading.Event] = {}  # held lanes: set when their generation's client left
        self._active = False  # a generate_many or generate_each is under way

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

    def acquire(self, cancelled: Optional[threading.Event] = None) -> int:
        """A lane no generation holds, held until ``release``; waits for one. An empty one first, so that what
        the others hold stays for a prompt that shares it (see ``share``), then the one released longest ago.
        Once ``cancelled`` is set (its client left), the lane's generation waits for no other's prompt."""
        with self._cond:
            while not self._idle:
                self._cond.wait()
            targets = self._models()[0]
            seq = min(self._idle, key=lambda s: (targets[s] is not None and targets[s].n_past > 0, self._idle[s]))
            del self._idle[seq]
            self._holders[seq] = threading.get_ident()
            if cancelled is not None:
                self._cancelled[seq] = cancelled
            return seq

    def release(self, seq: int) -> None:
        """Lane ``seq`` is free again; what its sequences hold stays until another lane needs the cells."""
        with self._cond:
            self._idle[seq] = time.monotonic()
            self._holders.pop(seq, None)
            self._reading.pop(seq, None)
            self._cancelled.pop(seq, None)
            self._cond.notify_all()  # a lane waiting to share its prompt waits no more (see ``_await_reader``)

    def make_room(self, seq: int, need: int) -> None:
        """Before lane ``seq`` reads a prompt: empty idle lanes' sequences, the one released longest ago first,
        until ``need`` cells (at most the context) are free of what the other lanes hold. A lane that is
        generating is never touched; an idle one's last state is in the prompt cache, if the pair has one."""
        if self.width == 1:
            return
        with self._cond:
            for models in self._models():
                n_ctx = models[seq].n_ctx
                held = sum(m.n_past for i, m in enumerate(models) if i != seq and m is not None)
                for other in sorted(self._idle, key=self._idle.__getitem__):
                    if held + min(need, n_ctx) <= n_ctx:
                        break
                    if other != seq and models[other] is not None and models[other].n_past:
                        held -= models[other].n_past
                        models[other].reset()

    def ready(self, target: Any, prompt: Sequence[int], reply: int) -> None:
        """Before a generation on ``target`` (one of the lanes' target sequences) reads ``prompt``: the longest
        prefix of it another lane holds, shared (see ``share``; where a lane that is reading a prompt will hold
        more of it soon, once it does), then room for it and ``reply`` tokens (see ``make_room``), and the idle
        lanes the prompt cache can bring back emptied (see ``empty_saved``)."""
        if self.width == 1:
            return
        with self._cond:
            if self._holders and self._holders.get(target.seq) != threading.get_ident():
                self._busy_check()  # a generation on a lane this thread does not hold, beside the lanes' own
        wanted = np.asarray(prompt[:-1], dtype=np.int32)
        if not self._await_reader(target, wanted):  # its client left while it waited: it will read nothing
            return
        self.share(target, wanted)
        self.empty_saved(target.seq)  # first: what the prompt cache brings back leaves before what it cannot
        # room for the whole prompt, the shared part too: the prompt cache may still put a longer state in its
        # place, which takes its cells while it loads (lanes that share cells are each counted whole, so this
        # errs toward emptying one idle lane more)
        self.make_room(target.seq, len(prompt) + reply)

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

    def share(self, target: Any, wanted: np.ndarray) -> None:
        """Give ``target``, and its lane's draft sequence, the longest prefix of ``wanted`` that another lane
        holds, its cells shared in the context (nothing read again), where that is at least ``MIN_SHARED``
        tokens more than its own. Sub-agents and follow-ups that land on another lane than their system
        prompt's then start from it; so do sub-agents that arrive together, from the one reading it first.

        A lane that is generating lends only what it holds of the prompt it is reading: it cuts back to no
        less than that part (its cells there are only ever replaced by a saved state of the same tokens)."""
        with self._cond:  # an idle lane is not taken, emptied or changed meanwhile
            for models in self._models():
                self._share_into(models, target.seq, wanted)
            if target.seq in self._holders:  # what this lane reads, another may share as it is read
                self._reading[target.seq] = wanted

    def lend(self, model: Any, wanted: np.ndarray) -> None:
        """``Model.borrow`` for the lanes' sequences: ``share`` for one of them, as it reads (a draft model's
        sequence reads its prompt after the target's)."""
        with self._cond:
            for models in self._models():
                if models[model.seq] is model:
                    self._share_into(models, model.seq, wanted)

    def _share_into(self, models: list[Any], seq: int, wanted: np.ndarray) -> None:
        """``share`` for lane ``seq``'s sequence of one model (``models``: that model's by lane)."""
        mine = models[seq]
        if mine is None or not mine.cuts_after_load:
            return
        best, most = None, mine.common_prefix(wanted) + MIN_SHARED - 1
        for other in range(self.width):
            n = self._lendable(models[other], other, mine, wanted)
            if n > most:
                best, most = models[other], n
        if best is not None:
            mine.copy_prefix(best, most, wanted[:most])

    def _lendable(self, other: Any, seq: int, mine: Any, wanted: np.ndarray) -> int:
        """How much of ``wanted`` lane ``seq``'s sequence ``other`` can lend ``mine`` now (under ``_cond``)."""
        if other is None or other is mine or other.keeps_hidden != mine.keeps_hidden:
            return 0
        if seq in self._idle:
            return int(other.common_prefix(wanted))
        reading = self._reading.get(seq)
        if reading is None:  # a lane taken but not yet reading: its cells may still change anywhere
            return 0
        return min(int(other.common_prefix(wanted)), prefix_length(reading, wanted))

    def _await_reader(self, target: Any, wanted: np.ndarray) -> bool:
        """Where a lane that is reading its prompt shares more of ``wanted`` than any lane holds now (sub-agents
        sent together with one system prompt), wait until it holds that part, or stops: ``share`` then takes it
        instead of this lane reading the same tokens beside it. Waits outside the lanes' steps. False once this
        lane's client has left (see ``acquire``)."""
        gone = self._cancelled.get(target.seq)
        if not target.cuts_after_load:
            return not (gone and gone.is_set())
        targets = self._models()[0]
        with self._cond:
            mine = max(int(target.common_prefix(wanted)),
                       *(self._lendable(targets[s], s, target, wanted) for s in range(self.width)))
            source, most, theirs = None, mine + MIN_SHARED - 1, None
            for seq, reading in self._reading.items():
                if seq != target.seq and targets[seq].keeps_hidden == target.keeps_hidden:
                    n = prefix_length(reading, wanted)
                    if n > most:
                        source, most, theirs = seq, n, reading
            # until it holds that much, or reads something else (its generation ended), or could not lend it,
            # or this lane's client left
            while source is not None and self._reading.get(source) is theirs and \
                    targets[source].keeps_hidden == target.keeps_hidden and not (gone and gone.is_set()) and \
                    self._lendable(targets[source], source, target, wanted) < most:
                self._cond.wait(0.005)  # its reads are not announced: look again soon (a short prompt takes ms)
        return not (gone and gone.is_set())

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
        if batcher is not None:
            batcher.stream_chunk = None if profile is None else prompt_chunk(profile)
            batcher.step_cost = None if profile is None else profile.reading_seconds
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
        stop = threading.Event()

        def started(i: int, stream: Any) -> None:
            running[i] = stream
            if stop.is_set():  # the caller stopped while it was being set up
                stream.cancel()

        def run(i: int) -> Any:
            if stop.is_set():
                return GenerationCancelled(f"Prompt {i} was not started: the caller stopped.")
            seq = self.acquire()  # one of ``width`` workers: a lane is always free
            try:
                return self._one(self.lane(seq), items[i], opts[i], batcher, lambda s: started(i, s))
            finally:
                running.pop(i, None)
                self.release(seq)

        pool = ThreadPoolExecutor(width, thread_name_prefix="localspec-lane")
        try:
            futures = {pool.submit(run, i): i for i in range(len(items))}
            for f in as_completed(futures):
                yield futures[f], f.exception() or f.result()
        finally:  # also when the caller stopped early (Ctrl-C, a break): what runs is cancelled, the rest not started
            stop.set()
            for stream in list(running.values()):
                stream.cancel()
            uninterrupted(pool.shutdown)  # every lane's thread done before the lanes decode alone again
            self.attach(None)
            batcher.close()
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
    def _one(lane: Any, item: Prompt, opts: GenerationOptions, batcher: Optional[StepBatcher] = None,
             started: Optional[Callable[[Any], None]] = None) -> Any:
        """``item``'s result on ``lane``, or its exception: set up alone, decoded as a member of ``batcher`` (its
        setup holds none of the other lanes' steps back); ``started`` is given its stream first."""
        try:
            stream = lane.stream_chat(item, opts) if is_conversation(item) else lane.stream(item, opts)
            if started is not None:
                started(stream)
            with batcher.member() if batcher is not None else contextlib.nullcontext():
                return stream.finish()
        except Exception as exc:
            return exc  # in its place: the caller decides whether to raise it
