"""A generation set aside: its sequences' cells saved to RAM and freed, put back exact when room comes back.

Several sequences share one unified cache of ``n_ctx`` cells. When the generations running on them need more
cells than are free, the step loop (``batching.StepBatcher``) sets one aside rather than fail it: every
sequence it decodes on (the target's, the draft model's) is saved whole, as the prompt cache saves a state
(attention cells, a recurrent state), and emptied. Its code stays parked in the decode call it was making, its
record of what the cache holds (``Model.tokens``) untouched; once the state is loaded back, that call goes on
as if nothing had happened. A sequence's MTP head keeps its own context and the hidden rows are the sequence's
own arrays, so neither moves.

Saving is a copy of the sequence's cells (tens of kilobytes a token for a 1.5B model), which costs far less
than reading the tokens again, on a CPU and on a GPU alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import llama_cpp as ll

from . import memory


def holds_cells(model: Any) -> bool:
    """Whether ``model``'s sequence holds any cell of its context (those of a call under way included)."""
    return int(ll.llama_memory_seq_pos_max(model._mem, model.seq)) >= 0


@dataclass(eq=False)
class SetAside:
    """One generation set aside: the member (``batching.Member``), its calls waiting for their step, and each of
    its sequences' saved state (those that held nothing are not listed)."""

    member: Any
    calls: list[Any]
    saved: list[tuple[Any, bytearray]] = field(default_factory=list)

    @classmethod
    def take(cls, member: Any, models: list[Any], calls: list[Any]) -> SetAside:
        """Save each of ``models`` (sequences of the member's lane), then free their cells. Nothing is freed if a
        state cannot be saved (MemoryError is raised)."""
        aside = cls(member, calls)
        for model in models:
            if holds_cells(model):
                with model._log:
                    aside.saved.append((model, memory.save_sequence(model._ctx, model.seq)))
        for model, _ in aside.saved:
            with model._log:
                ll.llama_memory_seq_rm(model._mem, model.seq, -1, -1)
            model.held_aside = True
        return aside

    @property
    def cells(self) -> int:
        """The most positions one of its sequences held (what bringing it back needs, per context)."""
        return max((int(model.n_past) for model, _ in self.saved), default=0)

    def load(self) -> bool:
        """Put every saved state back; False (and nothing loaded) if a context has no room for one of them."""
        loaded: list[Any] = []
        for model, data in self.saved:
            with model._log:
                ok = memory.restore_sequence(model._ctx, data, seq=model.seq)
            if not ok:
                for done in [*loaded, model]:  # llama.cpp may have kept part of a refused state
                    ll.llama_memory_seq_rm(done._mem, done.seq, -1, -1)
                return False
            loaded.append(model)
        for model, _ in self.saved:
            model.held_aside = False
        return True

    def drop(self) -> None:
        """Give the saved states up (the generation was cancelled): each sequence's record says it is empty."""
        for model, _ in self.saved:
            model.held_aside = False
            model.reset()
        self.saved.clear()
