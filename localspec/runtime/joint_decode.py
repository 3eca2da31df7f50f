"""One llama.cpp decode of several sequences' calls: the batch filled, decoded, and each call handed its rows.

A ``DecodeCall`` is one sequence's wish to decode some tokens (a prompt being read, a round being verified, a
token decoded); ``JointDecoder.decode`` puts as many of their tokens as a step takes into the context's batch,
each under its sequence id, makes one ``llama_decode`` and hands each call the logits rows it asked for. What
goes into a step and when is the step loop's business (``batching``); this module only fills and reads the
batch.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import llama_cpp as ll
import numpy as np

from .process import POSITIONS, LogitsView, abort_hook

#: Steps of more tokens than this can be stopped inside llama.cpp (the hook costs a Python call per graph node,
#: which only a long step amortises).
ABORTABLE_STEP = 64


@dataclass(eq=False, slots=True)
class DecodeCall:
    """One sequence's decode call: the ``m`` tokens its model's batch holds, and what came of them."""

    model: Any  # the sequence's ``Model``
    tokens: np.ndarray  # what it decodes, at positions start, start + 1 ...
    start: int
    every: bool  # each of its tokens asks for logits (a round being verified, a token decoded)
    last: bool  # its last token asks for logits (a prompt's end)
    abort: Optional[threading.Event]
    member: Any = None  # the step loop's member that waits in it; None: a call decoded at once, alone
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

    def is_stream(self) -> bool:
        """Whether the rest of the call asks for every token's logits (a round being verified, a token decoded),
        unlike a prompt being read (logits for its last token at most)."""
        return self.every or (self.m - self.done == 1 and self.last)

    def result(self, n_vocab: int) -> np.ndarray:
        """Its rows, in one array."""
        if not self.rows:
            return np.zeros((0, n_vocab), dtype=np.float32)
        return self.rows[0] if len(self.rows) == 1 else np.concatenate(self.rows)


class _Stop:
    """What ``abort_hook`` asks during a long step: stop once every call in it is cancelled; Ctrl-C cancels them
    all (each generation then ends as cancelled)."""

    def __init__(self, events: list[threading.Event], interrupted: Callable[[], bool]):
        self.events, self.interrupted = events, interrupted

    def is_set(self) -> bool:
        if self.interrupted():
            for e in self.events:
                e.set()
        return all(e.is_set() for e in self.events)


_Batch = tuple[Any, int, np.ndarray, np.ndarray, np.ndarray, list[int]]


class JointDecoder:
    """The batches of the contexts a step loop decodes on (one each, made on first use), and the decode itself.

    Attributes:
        steps: decodes made.
        widest: the most calls one decode held.
    """

    def __init__(self, wake: Callable[[DecodeCall], None], interrupted: Callable[[], bool]) -> None:
        self._wake = wake  # called for each call that finished (decoded, or failed)
        self._interrupted = interrupted  # whether Ctrl-C came: a long step then stops
        self._batches: dict[int, _Batch] = {}  # by context: see ``_batch``
        self._views: dict[int, LogitsView] = {}  # by context: its logits buffer's view
        self.steps = 0
        self.widest = 0

    def capacity(self, model: Any) -> int:
        """How many tokens one decode on ``model``'s context takes (its ``n_batch``)."""
        return self._batch(model)[1]

    def free(self) -> None:
        """Free the batches."""
        for made in self._batches.values():
            ll.llama_batch_free(made[0])
        self._batches.clear()
        self._views.clear()

    def decode(self, first: Any, taken: list[tuple[DecodeCall, int]], last_try: bool) -> int:
        """Decode ``taken`` (calls on ``first``'s context and how many of their tokens) and hand each its rows
        and outcome; llama.cpp's code. A failure for want of cells is left to the caller unless ``last_try``
        (llama.cpp then leaves the memory as it was)."""
        batch, n, counts, pos = self._fill(first, taken)
        t0 = time.perf_counter()
        # a long step stops within milliseconds once every call in it is cancelled (a server shutting down, or
        # Ctrl-C); one call cancelled among others waits for the step's end, which the others need
        events = [c.abort for c, _ in taken] if n > ABORTABLE_STEP else []
        if events and all(e is not None for e in events):
            with first._log, abort_hook(first._ctx, _Stop(events, self._interrupted)):  # type: ignore[arg-type]
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
        self.steps += 1
        self.widest = max(self.widest, len(taken))
        self._hand_out(taken, counts, n, rc, logits, time.perf_counter() - t0)
        return rc

    def _fill(self, first: Any, taken: list[tuple[DecodeCall, int]]) -> tuple[Any, int, list[int], np.ndarray]:
        """Write ``taken``'s tokens into ``first``'s context's batch: it, its tokens, each call's rows wanted,
        and the positions."""
        batch, _, tokens, pos, flags, slots = self._batch(first)
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
        return batch, n, counts, pos

    def _hand_out(self, taken: list[tuple[DecodeCall, int]], counts: list[int], n: int, rc: int,
                  logits: Optional[np.ndarray], spent: float) -> None:
        """Give each call of a decode of ``n`` tokens its outcome, its rows of ``logits`` and its seconds; wake
        those that finished."""
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

    @staticmethod
    def _keep_hidden(taken: list[tuple[DecodeCall, int]], pos: np.ndarray, n_tokens: int) -> None:
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

    def _batch(self, model: Any) -> _Batch:
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
