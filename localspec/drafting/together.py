"""The multi-sequence curve: what one decode of a token from each of s sequences costs, beside the single one.

On a CPU one decode of s sequences of one token costs about what one sequence of s tokens costs; on a GPU
both are nearly flat. Auto weighs a round in a shared decode by the whole step (``costs.Beside``), and this
curve says how far several sequences' tokens cost more than one sequence's (their attention reads as many
caches). It is measured where the target holds several sequences and none of the others is in use.
"""

from __future__ import annotations

from typing import Callable, Optional

import llama_cpp as ll
import numpy as np

from ..runtime.batching import StepBatcher, uninterrupted
from ..runtime.model import Model

#: The calibration context each sequence holds before its timed steps.
CONTEXT_TOKENS = 64


def measure_together(target: Model, most: int, reps: int = 5) -> list[float]:
    """Seconds of one decode holding one token from each of s sequences, s = 1 .. ``most`` (medians of ``reps``).

    Empty when it cannot be measured: a target of one sequence, or another sequence holding tokens (a
    generation under way must not be disturbed). Leaves every sequence it used empty.
    """
    most = min(most, target.n_seq)
    was = target._batcher  # a server's: between its requests, its loop's steps are these
    if most < 2 or target.seq != 0 or not _others_empty(target, most) or (was is not None and was.members):
        return []
    views = [target] + [target.sequence(s) for s in range(1, most)]
    batcher = was or StepBatcher()
    try:
        for v in views:
            v.attach(batcher)
        base = [int(t) for t in target.tokenize("def merge(a, b):\n    out = []\n", add_special=False)]
        ctx = (base * (CONTEXT_TOKENS // len(base) + 1))[:CONTEXT_TOKENS]

        def fill(v: Model, _: bool) -> None:
            v.eval(ctx, logits="none")

        _together(views, fill)  # every sequence holds the context
        out = []
        for s in range(1, most + 1):
            times: list[float] = []

            def step(v: Model, first: bool, times: list[float] = times) -> None:
                for _ in range(reps + 1):  # the first is a warm-up at this shape
                    before = v.busy_seconds
                    v.eval(base[:1], logits="all")
                    if first:
                        times.append(v.busy_seconds - before)
                    v.truncate(len(ctx))

            _together(views[:s], step)
            out.append(float(np.median(times[1:])))
        return out
    finally:
        for v in views:
            v.reset()
            v.attach(None)
        target.attach(was)
        if was is None:
            batcher.close()
        for v in views[1:]:
            v.close()


def _others_empty(target: Model, most: int) -> bool:
    """Whether sequences 1 .. most - 1 of the target's context hold nothing."""
    return all(int(target.call(ll.llama_memory_seq_pos_max, target._mem, s)) < 0 for s in range(1, most))


def _together(views: list[Model], work: Callable[[Model, bool], None]) -> None:
    """``work(view, is_the_first)`` for each view at once, as members of the views' step loop."""
    batcher: Optional[StepBatcher] = views[0]._batcher
    assert batcher is not None
    members = [batcher.spawn(work, view, i == 0) for i, view in enumerate(views)]
    uninterrupted(batcher.drive)  # the members decode on the target's context: never left running
    for member in members:
        member.result()
