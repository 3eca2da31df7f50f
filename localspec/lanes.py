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
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping, Optional, Sequence, Union

from .drafting.assembly import Assembly
from .errors import ConfigError
from .methods import get_method
from .options import GenerationOptions
from .runtime.batching import StepBatcher

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

    def acquire(self) -> int:
        """A lane no generation holds (the one released longest ago), held until ``release``; waits for one."""
        with self._cond:
            while not self._idle:
                self._cond.wait()
            seq = min(self._idle, key=self._idle.__getitem__)
            del self._idle[seq]
            return seq

    def release(self, seq: int) -> None:
        """Lane ``seq`` is free again; what its sequences hold stays until another lane needs the cells."""
        with self._cond:
            self._idle[seq] = time.monotonic()
            self._cond.notify()

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

    def _models(self) -> list[list[Any]]:
        """The target's sequences and the draft's, by lane (None: not opened yet, so holding nothing)."""
        made = [(self.pair.target, self.pair.draft), *((t, d) for t, d, _ in self._seqs)]
        made += [(None, None)] * (self.width - len(made))
        targets, drafts = [t for t, _ in made], [d for _, d in made]
        return [targets] + ([drafts] if self.pair.draft is not None else [])

    def attach(self, batcher: Optional[StepBatcher]) -> None:
        """Send every lane's decode calls (the target's and the draft's) to ``batcher``; None: each alone again."""
        self.lane(self.width - 1)  # every sequence opened
        for models in self._models():
            for model in models:
                model.attach(batcher)

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
        items = list(prompts)
        pair = self.pair
        opts = pair.options(options, **changes)  # a bad option fails before any work
        for i, item in enumerate(items):
            if not isinstance(item, (str, Sequence)) or (not isinstance(item, str) and not len(item)):
                raise ConfigError(f"Prompt {i} of generate_many is {item!r}; give text, token ids or a list of "
                                  "chat messages.")
        width = min(self.width, len(items))
        if width <= 1:  # one sequence: one after another, as generate and chat would
            return [self._one(pair, item, opts, return_exceptions) for item in items]
        self._prepare(opts)
        batcher = StepBatcher()
        self.attach(batcher)

        def run(item: Prompt) -> Any:
            seq = self.acquire()  # one of ``width`` workers: a lane is always free
            try:
                return self._one(self.lane(seq), item, opts, return_exceptions, batcher)
            finally:
                self.release(seq)

        try:
            with ThreadPoolExecutor(width, thread_name_prefix="localspec-lane") as pool:
                futures = [pool.submit(run, item) for item in items]
                results = [f.exception() or f.result() for f in futures]
        finally:
            self.attach(None)
            batcher.close()
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if failed is not None and not return_exceptions:
            raise failed
        return results

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
    def _one(lane: Any, item: Prompt, opts: GenerationOptions, return_exceptions: bool,
             batcher: Optional[StepBatcher] = None) -> Any:
        """``item``'s result on ``lane`` (or its exception, with ``return_exceptions``): set up alone, decoded as
        a member of ``batcher`` (its setup holds none of the other lanes' steps back)."""
        try:
            stream = lane.stream_chat(item, opts) if is_conversation(item) else lane.stream(item, opts)
            with batcher.member() if batcher is not None else contextlib.nullcontext():
                return stream.finish()
        except Exception as exc:
            if not return_exceptions:
                raise
            return exc  # the caller asked for it in its place
