"""Changing a model's cache other than by a decode: cutting it back, its checkpoints, whole states saved and loaded.

``Model`` gets these methods from ``CacheControl``. Cutting back goes as far
as the memory allows (``localspec.runtime.memory``): llama.cpp's ``seq_rm``
for an attention cache or within a recurrent state's rollback, otherwise a
checkpoint restored, or the start, and the recorded tokens evaluated again.
A whole state (``save_state``) is what the prompt cache keeps, under the
``state_identity`` that says which contexts can load it.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar, Union

import llama_cpp as ll
import numpy as np

from ..errors import BackendError
from . import memory
from .memory import Checkpoint, MemoryInfo
from .process import LlamaLog
from .vocabulary import Tokens

T = TypeVar("T")

#: Checkpoints a model keeps at once (one per round, one at a prompt's end, one spare).
MAX_CHECKPOINTS = 3


class CacheControl:
    """The methods of a loaded model (``model.Model``) that cut back, checkpoint, save and load its cache."""

    path: Path
    verbose: bool
    n_ctx: int
    n_batch: int
    n_gpu_layers: int
    flash_attn: Optional[bool]
    memory: MemoryInfo
    n_swa: int
    hidden: np.ndarray
    rewinds: int
    replayed_tokens: int
    busy_seconds: float
    _settings: dict[str, Any]
    _log: LlamaLog
    _ctx: Any
    _mem: Any
    _ext: Optional[object]
    _tokens: np.ndarray
    _n: int
    _dirty: bool
    _inflight: Optional[np.ndarray]  # the chunk of the decode call under way
    _undo_floor: int
    _checkpoints: list[Checkpoint]
    _file_identity: str
    seq: int
    n_seq: int
    _batcher: Any  # a ``batching.StepBatcher``, or None
    #: Tokens of its prompt the generation under way read itself (not held before, nor shared, nor restored):
    #: how long a step beside it may be while it decodes (see ``StepBatcher``).
    prompt_read: int = 0
    #: Decode steps the generation under way still expects to take (None: no estimate): with the batcher's
    #: ``step_cost``, whether a prompt beside it is read now or once it is done (see ``StepBatcher``).
    steps_left: Optional[int] = None
    #: Where the prompt a generation is reading ends (its length) while it reads it, else None: only such a
    #: reading waits for a shorter request, weighed by what is left of it (see ``StepBatcher``).
    reading_end: Optional[int] = None
    #: Seconds that reading has waited for shorter requests so far (the batcher's count, from 0 at its start).
    reading_waited: float = 0.0
    #: Tokens the generation under way may still add (its max_tokens left, where that fits the context; None:
    #: not known): the cells it claims of a cache shared with other sequences (see ``Lanes``).
    cells_left: Optional[int] = None
    #: Tokens the last generation that ended on this sequence generated (the lanes learn a typical reply).
    last_reply: Optional[int] = None
    #: Changes of the record so far (each decode, cut, load or reset): a generation that finds it as it left
    #: it knows nothing else used the sequence meanwhile.
    writes: int = 0
    #: The event that cancels the generation under way on this sequence (None: none runs): the step loop drops
    #: a generation set aside once it is set.
    cancelled: Optional[threading.Event] = None
    #: Whether the step loop has set this sequence aside (its state saved to RAM, its cells freed): its record
    #: says what it will hold again, not what it holds now.
    held_aside: bool = False
    lender: Optional[Callable[[Any, np.ndarray], None]]

    if TYPE_CHECKING:  # defined by ``Model`` and ``ModelVocabulary``
        def eval(self, tokens: Tokens, *, logits: Any = "last", abort: Optional[threading.Event] = None
                 ) -> np.ndarray: ...

        def check_tokens(self, tokens: Tokens) -> np.ndarray: ...

        def _keep_hidden_rows(self, m: int) -> None: ...

    def _llama(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, a llama.cpp call on this context. Sequences decoded together run on their step loop's
        one thread, between its steps (``batching.StepBatcher``), so no two calls ever touch a context at once."""
        return fn(*args)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` where this sequence's llama.cpp calls run (see ``_llama``): for a context that works
        beside this one, such as an MTP head's."""
        return fn(*args)

    # -- after a decode -----------------------------------------------------------

    def _after_decode(self, m: int) -> None:
        """Where ``truncate`` can go back to by ``seq_rm`` alone after a decode of ``m`` tokens."""
        info = self.memory
        if info.kind == memory.FULL:
            return
        if not info.state_bytes:
            # measurable once the state holds a token
            self.memory = self._llama(memory.with_state_size, info, self._ctx, self.seq)
            if self.verbose:
                sys.stderr.write(f"localspec: {self.path.name}: {self.memory.describe()}\n")
        # A rollback reaches the state after any but the first of the last decode's tokens (llama.cpp
        # snapshots the last n_rs_seq + 1 of them); the state before the decode is gone.
        self._undo_floor = self._n - min(info.rollback_tokens, m - 1) if info.kind == memory.ROLLBACK else self._n

    def _repair(self, failed: bool = False) -> None:
        """After an interrupted or failed decode, make the cache and the record agree again.

        A decode that finished before its bookkeeping was interrupted is kept
        (``failed`` False); otherwise whatever llama.cpp left past the record goes.
        """
        if not self._dirty:
            return
        self._dirty = False
        if self.memory.kind != memory.FULL:
            # A recurrent state cannot tell a finished decode from an aborted one, and llama.cpp's own
            # clean-up after a failure may have "rolled back" to a snapshot that was never written.
            self._rewind(self._n, replay=True)
            return
        held = int(self._llama(ll.llama_memory_seq_pos_max, self._mem, self.seq)) + 1
        chunk, self._inflight = self._inflight, None  # the chunk that was being decoded
        m = len(chunk) if chunk is not None else 0
        if not failed and m and held == self._n + m:
            self._keep_hidden_rows(m)  # it finished (llama.cpp removes a failed chunk itself): adopt it
            self._tokens[self._n : held] = chunk
            self._n = held
            self.writes += 1
        elif held > self._n:
            self._llama(ll.llama_memory_seq_rm, self._mem, self.seq, self._n, -1)

    # -- cutting back -----------------------------------------------------------

    def can_undo(self, removed: int) -> bool:
        """Whether, after evaluating ``removed + 1`` tokens, removing up to ``removed`` needs no checkpoint
        (a batch split into chunks can only roll back within its last chunk)."""
        return self.memory.covers(removed) and (self.memory.kind == memory.FULL or removed < self.n_batch)

    def checkpoint(self, refresh: bool = False) -> None:
        """Save the state at the current length, so a later ``truncate`` to it (or past it) is cheap.

        A no-op for an attention cache, which cuts back anywhere, and where a
        checkpoint at this length exists (``refresh``: save it again). The newest
        ``MAX_CHECKPOINTS`` are kept; truncating below one drops it.
        """
        if self.memory.kind == memory.FULL:
            return
        if any(c.position == self._n for c in self._checkpoints):
            if not refresh:
                return
            self._checkpoints = [c for c in self._checkpoints if c.position != self._n]
        self._repair()
        t0 = time.perf_counter()
        with self._log:
            self._checkpoints.append(self._llama(memory.save, self._ctx, self._n, self.seq))
        del self._checkpoints[:-MAX_CHECKPOINTS]
        self.busy_seconds += time.perf_counter() - t0

    def truncate(self, n: int, *, replay: bool = True) -> None:
        """Drop every cached position from ``n`` on (keep the first n tokens).

        Where the memory cannot remove them (a recurrent state, beyond its
        rollback), the newest checkpoint at or before ``n`` is restored, or the
        cache is emptied, and the recorded tokens up to ``n`` are evaluated
        again. Output never changes; only the time does.

        Args:
            n: tokens to keep.
            replay: False to stop at the checkpoint (or the start) instead of
                evaluating up to ``n`` again: the cache then holds a prefix of
                the first n tokens, for a caller about to evaluate more.

        Raises:
            BackendError: llama.cpp refused to restore the state or to cut the cache back.
        """
        self._repair()
        if n < 0:
            raise ValueError(f"cannot truncate to {n} tokens")
        if n >= self._n:
            return
        if n == 0:
            self.reset()
            return
        self._checkpoints = [c for c in self._checkpoints if c.position <= n]
        cut = n >= self._undo_floor and self._llama(ll.llama_memory_seq_rm, self._mem, self.seq, n, -1)
        if cut and self._window_kept(n):
            self._n = n
            self.writes += 1
            if self.memory.kind == memory.ROLLBACK:
                self._undo_floor = n  # a rollback is single-use until the next decode
            return
        self._rewind(n, replay)

    def _window_kept(self, n: int) -> bool:
        """Whether the sliding-window layers still hold the window before position ``n``. llama.cpp gives the
        cells of positions that have left every window of their sequence to new tokens (of any sequence:
        a unified cache of several does so often), so a cut back past them needs the positions again."""
        if not self.n_swa:
            return True
        first = int(self._llama(ll.llama_memory_seq_pos_min, self._mem, self.seq))  # -1: none of its cells is left
        return 0 <= first <= max(0, n - self.n_swa)

    def _rewind(self, n: int, replay: bool) -> None:
        """Go back to the newest checkpoint at or before ``n`` (or to the start), then evaluate up to n again."""
        t0 = time.perf_counter()
        start = self._checkpoints[-1] if self._checkpoints else None  # every checkpoint is at most n
        with self._log:
            if start is None or not self._llama(memory.restore, self._ctx, start, self.seq):
                self._clear()
                start = None
                self._checkpoints.clear()  # one llama.cpp refused is no use, nor are the older ones it hid
            at = start.position if start is not None else 0
            # the attention part of a hybrid, past the state
            if not self._llama(ll.llama_memory_seq_rm, self._mem, self.seq, at, -1):
                raise BackendError(f"llama.cpp could not cut the cache of {self.path.name} back to position {at}.")
        self._n = self._undo_floor = at
        self.writes += 1
        self.rewinds += 1
        self.busy_seconds += time.perf_counter() - t0
        again = self._tokens[at:n].copy() if replay else self._tokens[:0]
        if self.verbose and start is None and n:  # a checkpoint's restore is routine; a start again is not
            sys.stderr.write(f"localspec: {self.path.name}: its {self.memory.kind} memory cannot cut back to {n} "
                             f"tokens and no checkpoint was at or before that, so it starts again from the "
                             f"beginning" + (f" and evaluates {len(again)} tokens again\n" if replay else "\n"))
        if len(again):
            self.replayed_tokens += len(again)
            self.eval(again, logits="none")

    def reset(self) -> None:
        """Empty the cache (this sequence's part of it, where the context holds several)."""
        self._clear()
        self._n = self._undo_floor = 0
        self.writes += 1
        self._dirty = False
        self._checkpoints.clear()

    def borrow(self, tokens: np.ndarray) -> None:
        """Before reading ``tokens``: the longest prefix of them that another sequence of the context can lend,
        shared with this one, where a lender is set (a pair's lanes set theirs: ``Lanes.lend``)."""
        if self.lender is not None:
            self.lender(self, tokens)

    @property
    def keeps_hidden(self) -> bool:
        """Whether this sequence keeps the hidden state after each position, for an MTP head (``keep_hidden``)."""
        return self._ext is not None

    def copy_prefix(self, src: Any, n: int, tokens: Optional[np.ndarray] = None) -> bool:
        """Hold the first ``n`` tokens that ``src``, another sequence of this context, holds: their cells shared
        with it (llama.cpp's ``seq_cp``), nothing evaluated. What this sequence held goes. Only for a plain
        attention cache (``cuts_after_load``), whose cells serve any sequence that has them.

        Args:
            src: the sequence to share with (it may be generating: see ``Lanes.share``).
            n: how many tokens.
            tokens: what they are, where the caller knows (``src``'s record otherwise).

        Returns:
            True if this sequence holds them now; False if ``src`` no longer does (it holds fewer tokens, only
            one of the two keeps hidden rows, or its cells were replaced when the copy was made: this
            sequence is then empty, unless nothing was tried).

        Raises:
            ValueError: ``src`` is not another sequence of this context, or this is not a plain attention
                cache.
        """
        if src._ctx is not self._ctx or src.seq == self.seq or not self.cuts_after_load:
            raise ValueError(f"sequence {self.seq} cannot share the cells of sequence {src.seq}")
        if n > src.n_past or src.keeps_hidden != self.keeps_hidden:  # it changed since the caller looked
            return False
        held = np.array(src._tokens[:n] if tokens is None else tokens[:n], dtype=np.int32)
        rows = src.hidden[:n].copy() if self.keeps_hidden else None
        self.reset()
        if not self._llama(self._copy_cells, src.seq, n):
            return False
        self._tokens[:n] = held
        if rows is not None:  # the MTP head's input for those positions
            self.hidden[:n] = rows
        self._n, self._undo_floor = n, 0  # an attention cache cuts back anywhere
        self.writes += 1
        return True

    def _copy_cells(self, src: int, n: int) -> bool:
        """``seq_cp`` of positions 0 .. n - 1 from sequence ``src``; whether all came (else none stay)."""
        ll.llama_memory_seq_cp(self._mem, src, self.seq, 0, n)
        if ll.llama_memory_seq_pos_min(self._mem, self.seq) == 0 and \
                ll.llama_memory_seq_pos_max(self._mem, self.seq) == n - 1:
            return True
        ll.llama_memory_seq_rm(self._mem, self.seq, -1, -1)
        return False

    def _clear(self) -> None:
        """Empty llama.cpp's memory of this sequence: all of it where the context holds one."""
        if self.n_seq == 1:
            self._llama(ll.llama_memory_clear, self._mem, True)
        else:
            self._llama(ll.llama_memory_seq_rm, self._mem, self.seq, -1, -1)

    # -- whole states -------------------------------------------------------------

    def state_identity(self) -> str:
        """What a saved state of this context depends on: the model file, llama.cpp's build and the settings
        that shape the state (cache types, flash attention, offload, the rollback snapshots). A state saved
        under another identity is never loaded."""
        return f"{self._file_identity}|nextn={int(self._ext is not None)}"

    def _identity_at_load(self) -> str:
        """The file and settings part of ``state_identity``, read once: a file replaced or moved while it is
        loaded changes nothing about the weights in memory."""
        st = self.path.stat()
        kept = {k: self._settings[k] for k in ("cache_type", "flash_attn", "rollback_tokens")}
        return "|".join([str(self.path.resolve()), str(st.st_size), str(st.st_mtime_ns), ll.__version__,
                         f"ngl={self.n_gpu_layers}", f"fa={self.flash_attn}", "swa_full=1",
                         *(f"{k}={v}" for k, v in sorted(kept.items()))])

    @property
    def cuts_after_load(self) -> bool:
        """Whether a state ``load_state`` put back can be cut to any shorter length in place: a plain attention
        cache can; a recurrent state cannot, and a sliding-window cache is not cut after a load either (each
        shorter length is evaluated again from the start instead)."""
        return self.memory.kind == memory.FULL and not self.n_swa

    def save_state(self) -> bytearray:
        """The whole state of the cache as it stands (``tokens`` says what it holds), for ``load_state``; with
        the hidden rows of its positions once they are kept for an MTP head (the head catches up from them)."""
        self._repair()
        t0 = time.perf_counter()
        with self._log:
            data = self._llama(memory.save_sequence, self._ctx, self.seq)
        if self._ext is not None:
            data += self.hidden[: self._n].data.cast("B")  # the rows' bytes, without a copy of them first
        self.busy_seconds += time.perf_counter() - t0
        return data

    def load_state(self, tokens: np.ndarray, data: Union[bytes, bytearray]) -> bool:
        """Replace the cache with a state ``save_state`` gave when the cache held ``tokens``.

        Returns:
            True if llama.cpp took it; False if it refused (the cache is then empty).
        """
        arr = np.asarray(tokens, dtype=np.int32)
        # a saved state may hold images this process never saw (their placeholders, negative): the record keeps
        # them, and a prompt with the same image matches them; only vocabulary ids are checked
        self.check_tokens(arr[arr >= 0])
        n = len(arr)
        rows = n * self.hidden.shape[1] * 4 if self._ext is not None else 0
        if n > self.n_ctx or rows > len(data):
            return False
        self._repair()
        t0 = time.perf_counter()
        with self._log:
            ok = self._llama(memory.restore_sequence, self._ctx, data, len(data) - rows, self.seq)
        self.busy_seconds += time.perf_counter() - t0
        self._checkpoints.clear()
        if not ok:
            self.reset()
            return False
        if rows:
            self.hidden[:n] = np.frombuffer(data, dtype=np.float32, offset=len(data) - rows).reshape(n, -1)
        self._tokens[:n] = arr
        self._n = n
        self.writes += 1
        # a plain attention cache cuts back anywhere; the rest hold nothing from before the load
        self._undo_floor = 0 if self.cuts_after_load else n
        self._dirty = False
        return True
