"""Several generations of one pair at once: a lane per sequence of its models' contexts, decoded together.

A pair loaded with ``parallel=N`` holds N sequences in each model's context (one unified cache). Lane 0 is the
pair itself; lane i is the same pair over sequence i of each model. ``generate_many`` runs one generation per
lane, each in its own thread, each exactly as it would run alone (its own drafter, acceptance, cut-backs and
prompt-cache restores), while a ``StepBatcher`` gathers their decode calls into one llama.cpp decode per model
and step. The pair's prompt cache, history, cost correction and measured costs are shared by its lanes.
"""

from __future__ import annotations

import copy
import queue
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from .drafting.assembly import Assembly
from .errors import ConfigError
from .methods import get_method
from .options import GenerationOptions
from .results import Result
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
        while len(self._seqs) < i:
            seq = len(self._seqs) + 1
            target = pair.target.sequence(seq)
            draft = pair.draft.sequence(seq) if pair.draft is not None else None
            self._seqs.append((target, draft, Assembly(target, draft)))
        lane = copy.copy(pair)
        lane.target, lane.draft, lane.assembly = self._seqs[i - 1]
        return lane

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
        lanes = [self.lane(i) for i in range(width)]
        free: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for lane in lanes:
            free.put(lane)
            for model in (lane.target, lane.draft):
                if model is not None:
                    model.attach(batcher)

        def run(item: Prompt) -> Any:
            lane = free.get()  # one of ``width`` workers: a lane is always free
            try:
                with batcher.member():
                    return self._one(lane, item, opts, return_exceptions)
            finally:
                free.put(lane)

        try:
            with ThreadPoolExecutor(width, thread_name_prefix="localspec-lane") as pool:
                futures = [pool.submit(run, item) for item in items]
                results = [f.exception() or f.result() for f in futures]
        finally:
            for lane in lanes:
                for model in (lane.target, lane.draft):
                    if model is not None:
                        model.attach(None)
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
    def _one(lane: Any, item: Prompt, opts: GenerationOptions, return_exceptions: bool) -> Any:
        call: Callable[[], Result] = ((lambda: lane.chat(item, opts)) if is_conversation(item)
                                      else (lambda: lane.generate(item, opts)))
        if not return_exceptions:
            return call()
        try:
            return call()
        except Exception as exc:  # the caller asked for it in its place
            return exc

