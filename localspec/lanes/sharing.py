"""Prefixes shared between lanes: a lane starts from the cells another lane holds of its prompt, read once.

Sub-agents and follow-ups that land on another lane than their system prompt's start from it; sub-agents
sent together wait for the one reading it first, then share its cells instead of reading them beside it.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from ..runtime.batching import StepBatcher
from ..runtime.vocabulary import common_prefix as prefix_length

#: The fewest tokens more than its own that a lane takes from another's cells (below, reading them costs little).
MIN_SHARED = 32


class SharedPrefixes:
    """The methods of ``Lanes`` that share prompt prefixes between lanes."""

    pair: Any
    _cond: threading.Condition
    _idle: dict[int, float]
    _holders: dict[int, Any]
    _reading: dict[int, np.ndarray]
    _cancelled: dict[int, threading.Event]
    _shared: dict[int, int]
    _batcher: Optional[StepBatcher]

    if TYPE_CHECKING:  # defined by ``Lanes``
        @property
        def width(self) -> int: ...

        def _models(self) -> list[list[Any]]: ...

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
        sequence reads its prompt after the target's). Where another lane's sequence of the same model is
        reading a prompt that shares more of ``wanted`` (sub-agents' drafts start reading in one step), it
        waits for that reading to end first, so the shared part is read once."""
        for models in self._models():
            if models[model.seq] is model:
                self._await_lender(models, model, wanted)
                with self._cond:
                    self._share_into(models, model.seq, wanted)

    def _await_lender(self, models: list[Any], mine: Any, wanted: np.ndarray) -> None:
        """Pause ``mine`` (one model's sequence; ``models``: that model's by lane) while a sequence of another
        lane is in a decode call (``Model.decoding``) and will hold at least ``MIN_SHARED`` more of ``wanted``
        than ``mine`` can borrow now, its lane reading a prompt that begins so."""
        batcher = self._batcher
        if batcher is None or not batcher.inside() or not mine.cuts_after_load:
            return
        with self._cond:
            now = max(int(mine.common_prefix(wanted)),
                      *(self._lendable(models[s], s, mine, wanted) for s in range(self.width)))
            lenders = [models[s] for s, reading in self._reading.items()
                       if s != mine.seq and models[s] is not None and models[s].keeps_hidden == mine.keeps_hidden
                       and prefix_length(reading, wanted) >= now + MIN_SHARED]
        if lenders:
            batcher.pause(lambda: not any(m.decoding for m in lenders))

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
        if best is not None and mine.copy_prefix(best, most, wanted[:most]) and models[0] is self.pair.target:
            self._shared[seq] = most  # cells it shares with another lane's target (see ``_await_room``)

    def _lendable(self, other: Any, seq: int, mine: Any, wanted: np.ndarray) -> int:
        """How much of ``wanted`` lane ``seq``'s sequence ``other`` can lend ``mine`` now (under ``_cond``; a
        sequence set aside holds no cells to lend)."""
        if other is None or other is mine or other.keeps_hidden != mine.keeps_hidden or other.held_aside:
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
        batcher = self._batcher
        if not target.cuts_after_load or batcher is None or not batcher.inside():
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

        def done() -> bool:  # it holds that much, or reads something else (its generation ended), or could not
            # lend it (set aside for want of cells, too), or this lane's client left
            return source is None or self._reading.get(source) is not theirs or \
                targets[source].keeps_hidden != target.keeps_hidden or bool(gone and gone.is_set()) or \
                targets[source].held_aside or self._lendable(targets[source], source, target, wanted) >= most

        batcher.pause(done)  # looked at between the loop's steps
        return not (gone and gone.is_set())
