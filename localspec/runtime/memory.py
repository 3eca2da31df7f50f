"""What a context's memory can undo, and checkpoints of the part that cannot be cut back.

llama.cpp keeps three kinds of memory, and ``model.Model`` treats each as
what it can do:

* ``FULL``: attention KV caches (sliding-window layers too, since localspec
  keeps their cache whole): any trailing positions can be removed.
* ``ROLLBACK``: a recurrent or hybrid model whose architecture keeps a
  snapshot of its state after each of the last ``n_rs_seq`` tokens of a
  decode (Qwen3.5/3.6, LFM2, Nemotron-H...): the last decode's trailing
  positions can be removed, at most ``n_rs_seq`` of them, once per decode.
  Only in a context of one sequence: llama.cpp's snapshots do not survive
  another sequence's decode between a sequence's own and its cut back (its
  state then comes back wrong), so a context of several takes no snapshots
  and its states go back by checkpoints, as ``CHECKPOINT``.
* ``CHECKPOINT``: a recurrent state that cannot be cut back at all (Mamba,
  RWKV, Jamba, Falcon-H1, Granite hybrids...): going back means restoring a
  saved copy of that state (``Checkpoint``) and evaluating again what came
  after it, or evaluating everything again from the start.

A checkpoint holds only the part that cannot be cut back (llama.cpp's
``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``: the recurrent state, or all of a
purely recurrent model's memory); the attention part is cut back as usual.
"""

from __future__ import annotations

import ctypes
import dataclasses
from dataclasses import dataclass
from typing import Any, Optional, Union

import llama_cpp as ll

FULL = "full"
ROLLBACK = "rollback"
CHECKPOINT = "checkpoint"

#: Only the part of a sequence's memory that removing positions cannot undo.
_PARTIAL = ll.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY


@dataclass(frozen=True)
class MemoryInfo:
    """What one context's memory can undo.

    Attributes:
        kind: ``FULL``, ``ROLLBACK`` or ``CHECKPOINT``.
        rollback_tokens: for ``ROLLBACK``, the most trailing positions of a decode that can be removed.
        hybrid: attention layers and recurrent layers (not ``FULL``: some recurrent state).
        state_bytes: bytes of one checkpoint (0 for ``FULL``, which needs none).
    """

    kind: str
    rollback_tokens: int = 0
    hybrid: bool = False
    state_bytes: int = 0

    @property
    def snapshot_bytes(self) -> int:
        """Bytes llama.cpp holds for the ``rollback_tokens`` snapshots (0 without them)."""
        return self.state_bytes * self.rollback_tokens

    def covers(self, removed: int) -> bool:
        """Whether removing up to ``removed`` of a decode's trailing positions needs no checkpoint."""
        return self.kind == FULL or (self.kind == ROLLBACK and removed <= self.rollback_tokens)

    def describe(self) -> str:
        """One phrase for a person: what this memory is and how localspec goes back in it."""
        if self.kind == FULL:
            return "attention cache (any position can be cut back)"
        what = "hybrid (attention + recurrent state)" if self.hybrid else "recurrent state"
        if self.kind == ROLLBACK:
            return (f"{what}, rolls back up to {self.rollback_tokens} tokens "
                    f"({_mib(self.snapshot_bytes)} of snapshots), checkpoints of {_mib(self.state_bytes)} beyond")
        return f"{what}, no rollback: checkpoints of {_mib(self.state_bytes)} before each drafted round"


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def inspect(model: Any, ctx: Any) -> MemoryInfo:
    """Classify a freshly created (empty) context's memory (llama.cpp model and context pointers)."""
    recurrent = bool(ll.llama_model_is_recurrent(model))
    hybrid = bool(ll.llama_model_is_hybrid(model))
    if not (recurrent or hybrid):
        return MemoryInfo(FULL)
    n_rs = int(ll.llama_n_rs_seq(ctx))
    kind = ROLLBACK if n_rs > 0 else CHECKPOINT
    return MemoryInfo(kind, n_rs, hybrid)


def with_state_size(info: MemoryInfo, ctx: Any, seq: int = 0) -> MemoryInfo:
    """``info`` with the size of a checkpoint of sequence ``seq``'s state filled in (once it holds a token)."""
    if info.kind == FULL:
        return info
    return dataclasses.replace(info, state_bytes=int(ll.llama_state_seq_get_size_ext(ctx, seq, _PARTIAL)))


@dataclass
class Checkpoint:
    """A saved copy of the part of a sequence's memory that cannot be cut back, at ``position`` tokens."""

    position: int
    data: ctypes.Array


def save(ctx: Any, position: int, seq: int = 0) -> Checkpoint:
    """Copy the state of sequence ``seq`` (which holds ``position`` tokens) out of the context."""
    size = int(ll.llama_state_seq_get_size_ext(ctx, seq, _PARTIAL))
    buf = (ctypes.c_uint8 * size)()
    written = int(ll.llama_state_seq_get_data_ext(ctx, buf, size, seq, _PARTIAL))
    return Checkpoint(position, buf if written == size else (ctypes.c_uint8 * written).from_buffer_copy(buf))


def restore(ctx: Any, checkpoint: Checkpoint, seq: int = 0) -> bool:
    """Put a checkpoint's state back into sequence ``seq``; False if llama.cpp refused it."""
    n = len(checkpoint.data)
    return int(ll.llama_state_seq_set_data_ext(ctx, checkpoint.data, n, seq, _PARTIAL)) == n




def save_sequence(ctx: Any, seq: int = 0) -> bytearray:
    """The whole state of sequence ``seq`` (attention cache and recurrent state), as llama.cpp serializes it."""
    size = int(ll.llama_state_seq_get_size_ext(ctx, seq, 0))
    buf = bytearray(size)
    view = (ctypes.c_uint8 * size).from_buffer(buf)  # llama.cpp writes straight into the bytes kept
    written = int(ll.llama_state_seq_get_data_ext(ctx, view, size, seq, 0))
    del view  # a bytearray cannot be resized while a ctypes view holds it
    del buf[written:]
    return buf


def restore_sequence(ctx: Any, data: Union[bytes, bytearray], size: Optional[int] = None, seq: int = 0) -> bool:
    """Replace sequence ``seq``'s whole state with the first ``size`` bytes of ``data`` (default: all of it, as
    ``save_sequence`` gave it); False if llama.cpp refused it. ``data`` is read in place, not copied."""
    size = len(data) if size is None else size
    if isinstance(data, bytearray):
        src: Any = (ctypes.c_uint8 * size).from_buffer(data)
    else:  # read-only bytes (from disk): a pointer to them
        src = ctypes.cast(ctypes.c_char_p(data), ctypes.POINTER(ctypes.c_uint8))
    return int(ll.llama_state_seq_set_data_ext(ctx, src, size, seq, 0)) == size
