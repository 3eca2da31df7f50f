"""One loaded GGUF model over llama-cpp-python's low-level API.

``Model`` is the only place in localspec that touches llama.cpp's KV cache.
It keeps a record of exactly which tokens the cache holds (``tokens``), so
callers reason about the cache as a token list: ``eval`` appends tokens and
returns the logits rows asked for, ``truncate`` drops positions whatever the
memory (``localspec.runtime.memory``: llama.cpp's ``seq_rm``, a recurrent state's
bounded rollback, or a checkpoint and a replay), ``checkpoint`` saves a state
a recurrent model cannot cut back, and ``sync`` reuses the longest cached
prefix. If an evaluation is interrupted (Ctrl-C between llama.cpp returning
and the bookkeeping, or a failed decode), the next call first makes the cache
and the record agree again. Cutting back, checkpoints and whole saved states
are ``CacheControl``'s methods (``localspec.runtime.cache_control``).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Literal, Optional, Union

import llama_cpp as ll
import numpy as np

from ..errors import BackendError, ConfigError, ContextOverflowError, GenerationCancelled, ModelFileError
from . import memory
from .batching import StepBatcher
from .cache_control import CacheControl
from .gguf_metadata import check_gguf
from .hidden_rows import HiddenRows
from .hugepages import HugePages
from .image_runs import ImageRuns
from .process import (
    CACHE_TYPES,
    POSITIONS,
    LlamaLog,
    LogitsView,
    abort_hook,
    context_params,
    default_threads,
    gpu_offload_supported,
    load_weights,
    one_sequence_batch,
)
from .vocabulary import ModelVocabulary, Tokens
from .vocabulary import common_prefix as prefix_length

#: The most sequences one context holds (llama.cpp's own limit is 256).
MAX_SEQUENCES = 64

LogitsWanted = Literal["last", "all", "none"]
#: On the CPU, contexts of this many tokens or more get flash attention unless told otherwise: they are
#: made for long prompts (``serve`` fits the largest trained context), which it processes faster.
FLASH_ATTN_CONTEXT = 16384


class Model(CacheControl, HiddenRows, ImageRuns, ModelVocabulary):
    """A GGUF model with one context and one sequence, and a record of its cache.

    Args:
        path: the .gguf file.
        n_ctx: context length in tokens (0: the model's training context).
        n_threads: CPU threads for single-token steps
            (default: all available cores, see ``default_threads``).
        n_threads_batch: CPU threads for batches (verification, prompts); default: ``n_threads``.
            Steps are memory-bound and batches compute-bound, so their best counts can differ.
        n_gpu_layers: layers to offload; -1 for all. Default: all on a GPU
            build, none on a CPU-only build.
        n_batch: most tokens sent to llama.cpp in one decode call.
        cache_type: KV cache element type, "f16" (llama.cpp's default), "f32" or "q8_0".
        flash_attn: force flash attention on or off. Default on the CPU: on
            for contexts of ``FLASH_ATTN_CONTEXT`` tokens or more, made for long
            prompts, which it processes faster; off below (its f16 rounding makes
            logits depend on batch shape, for little gain on short contexts).
            llama.cpp's automatic choice when layers are on a GPU.
        huge_pages: on a CPU build under Linux, ask for transparent huge pages
            for llama.cpp's buffers (see ``localspec.runtime.hugepages``); False to leave
            them as llama.cpp allocated them.
        rollback_tokens: for a recurrent model whose architecture can roll its
            state back, how many trailing tokens of a decode it can remove
            (llama.cpp's ``n_rs_seq``; each costs one copy of the state).
            Longer drafts take a checkpoint instead. Ignored for other models.
        verbose: let llama.cpp print its log to stderr, and say when the cache
            had to go back to a checkpoint or to the start.
        n_seq: sequences the context holds, in one unified cache of ``n_ctx``
            cells: this object is sequence 0, ``sequence(i)`` gives the others.

    Raises:
        ModelFileError: the file is missing, not a GGUF, or llama.cpp cannot load it.
        BackendError: the context cannot be created (e.g. too large for memory).
    """

    def __init__(
        self,
        path: Union[str, os.PathLike],
        *,
        n_ctx: int = 4096,
        n_threads: Optional[int] = None,
        n_threads_batch: Optional[int] = None,
        n_gpu_layers: Optional[int] = None,
        n_batch: int = 512,
        cache_type: str = "f16",
        flash_attn: Optional[bool] = None,
        huge_pages: bool = True,
        rollback_tokens: int = 8,
        verbose: bool = False,
        n_seq: int = 1,
    ):
        self.path = check_gguf(path)
        if n_ctx < 0:
            raise ConfigError(f"Context length must be >= 0 (0 = the model's own), got {n_ctx}.")
        if cache_type not in CACHE_TYPES:
            raise ConfigError(f"Unknown KV cache type {cache_type!r}; choose one of {', '.join(CACHE_TYPES)}.")
        if rollback_tokens < 0:
            raise ConfigError(f"rollback_tokens must be >= 0, got {rollback_tokens}.")
        if not 1 <= n_seq <= MAX_SEQUENCES:
            raise ConfigError(f"A context holds 1 to {MAX_SEQUENCES} sequences, got {n_seq}.")
        self._log = LlamaLog(verbose)
        self.verbose = verbose
        # what ``reopen`` loads again (the thread counts are read when it is called: they may have been set since)
        self._settings: dict[str, Any] = dict(n_ctx=n_ctx, n_gpu_layers=n_gpu_layers, n_batch=n_batch,
                                              cache_type=cache_type, flash_attn=flash_attn, huge_pages=huge_pages,
                                              rollback_tokens=rollback_tokens, verbose=verbose, n_seq=n_seq)
        #: Which of the context's sequences this object reads and writes, and how many the context holds.
        self.seq, self.n_seq = 0, n_seq
        self._owner = True  # False for another sequence's view of the same context (see ``sequence``)
        self._batcher: Optional[StepBatcher] = None  # where decode calls go to be batched with other sequences'
        self.lender: Optional[Callable[[Model, np.ndarray], None]] = None  # see ``borrow``
        #: True when the caller left the thread count to localspec (see ``calibration.choose_threads``).
        self.threads_unset = not n_threads
        # the context's thread counts, one list its sequences (``sequence``) share, as they share the context
        self._threads = [n_threads if n_threads else default_threads(), 0]
        #: True when the caller left the batch thread count to localspec.
        self.batch_threads_unset = not n_threads_batch
        self._threads[1] = n_threads_batch if n_threads_batch else self.n_threads
        if n_gpu_layers is None:
            n_gpu_layers = -1 if gpu_offload_supported() else 0
        self.n_gpu_layers = n_gpu_layers
        self._model = None
        self._ctx = None
        self._batch: Optional[ll.llama_batch] = None
        # Only on CPU builds: a GPU build's host buffers may be pinned for the device,
        # and their pages are best left where the driver put them.
        pages = HugePages(huge_pages and not gpu_offload_supported())
        self._model = load_weights(self.path, n_gpu_layers, self._log)
        self._create_context(n_ctx, n_batch, cache_type, flash_attn, rollback_tokens, n_seq)
        pages.apply()
        #: Bytes of llama.cpp's buffers advised to use huge pages (0: none; see ``hugepages``).
        self.huge_page_bytes = pages.advised
        self._init_vocabulary()
        self._init_memory()
        self._file_identity = self._identity_at_load()
        # One batch reused for every decode, filled through numpy views of its arrays.
        self._batch, self._b_token, self._b_pos, self._b_logits = one_sequence_batch(self.n_batch, self.seq)
        self._logits = LogitsView(self.n_vocab, self.n_batch)

    def _create_context(self, n_ctx: int, n_batch: int, cache_type: str, flash_attn: Optional[bool],
                        rollback_tokens: int, n_seq: int) -> None:
        if n_ctx == 0:
            n_ctx = int(ll.llama_model_n_ctx_train(self._model))
        if flash_attn is None and not (self.n_gpu_layers != 0 and gpu_offload_supported()):
            # On CPU, flash attention rounds through f16 and moves logits between batch
            # shapes, which can flip near-ties between plain decoding and batched
            # verification, for 1-2% on short contexts; a long context is for long
            # prompts, which it processes about a tenth faster. GPU builds keep llama.cpp's choice.
            flash_attn = n_ctx >= FLASH_ATTN_CONTEXT
        self.flash_attn = flash_attn
        n_batch = min(n_batch, n_ctx, len(POSITIONS))
        cparams = context_params(n_ctx, n_batch, self.n_threads, self.n_threads_batch, cache_type,
                                 flash_attn, n_seq)
        self._cparams = cparams  # for a second context over the same weights (an MTP head)
        recurrent = ll.llama_model_is_recurrent(self._model) or ll.llama_model_is_hybrid(self._model)
        cparams.n_rs_seq = rollback_tokens if recurrent and n_seq == 1 else 0  # one sequence only: see memory.py
        with self._log:
            self._ctx = ll.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            self.close()
            raise BackendError(
                f"llama.cpp could not create a {n_ctx}-token context for {self.path.name}; "
                "try a smaller context length."
            )
        self.n_ctx: int = int(ll.llama_n_ctx(self._ctx))
        self.n_batch: int = n_batch

    def _init_memory(self) -> None:
        """The context's memory, what it can undo, and the record of what it holds (empty)."""
        self._mem = ll.llama_get_memory(self._ctx)
        if not self._mem:
            self.close()
            raise ModelFileError(f"{self.path.name} has no memory llama.cpp can decode with (an encoder or "
                                 "embedding-only model); localspec needs a model that generates text.")
        #: What this model's memory can undo (see ``localspec.runtime.memory``); its checkpoint size once measured.
        self.memory = memory.inspect(self._model, self._ctx)
        #: Sliding-window size of its windowed attention layers (0: none).
        self.n_swa = int(ll.llama_model_n_swa(self._model))
        #: Next-n (MTP) layers in the GGUF: a head that drafts from this model's own hidden states.
        self.n_nextn = int(ll.llama_model_n_layer_nextn(self._model)) if hasattr(ll, "llama_model_n_layer_nextn") else 0
        #: Hidden state after each position (row p: after token p), kept once ``keep_hidden`` is called.
        self.hidden = np.zeros((0, 0), dtype=np.float32)
        self._ext: Optional[object] = None
        self._tokens = np.zeros(self.n_ctx, dtype=np.int32)
        self._n = 0
        self._dirty = False
        self._inflight: Optional[np.ndarray] = None  # the chunk of the decode call under way
        #: The shortest length ``truncate`` reaches with llama.cpp's own ``seq_rm`` (lower needs a checkpoint).
        self._undo_floor = 0
        self._checkpoints: list[memory.Checkpoint] = []
        #: Times the cache went back to a checkpoint or to the start, and tokens evaluated again for it.
        self.rewinds = 0
        self.replayed_tokens = 0
        #: Seconds spent inside llama.cpp decode calls (and reading their logits).
        self.busy_seconds = 0.0
        #: Number of decode calls made.
        self.decode_calls = 0
        #: The most sequences one of its decodes held since this was last set to 1 (a generation does at its
        #: start): more than 1 when a ``StepBatcher`` decoded it with other sequences.
        self.widest_batch = 1
        #: The other sequences in its last decode: their tokens, how many of them were all logits rows (streams
        #: verifying, not prompts being read), and how many sequences they were ((0, 0, 0): alone).
        self.beside = (0, 0, 0)

    # -- lifetime -----------------------------------------------------------

    def reopen(self) -> Model:
        """The same file loaded again with the same settings and thread counts: a second model with a cache of
        its own, so that two generations can run side by side (the bench's lockstep mode)."""
        return Model(self.path, n_threads=self.n_threads, n_threads_batch=self.n_threads_batch, **self._settings)

    def sequence(self, seq: int) -> Model:
        """Sequence ``seq`` of this context: a model of its own record and cache over the same weights and cells
        (``n_seq`` at load). Each is evaluated, cut back, checkpointed, saved and loaded alone; decoded through
        one ``StepBatcher``, sequences that evaluate at the same time share one llama.cpp decode. Closing a
        sequence frees only its own batch; the context goes with the model that loaded it."""
        if not 0 < seq < self.n_seq or self.seq != 0:
            raise ConfigError(f"{self.path.name} was loaded with {self.n_seq} sequence(s); sequence {seq} is not one "
                              "of the others (load it with n_seq larger).")
        view = object.__new__(Model)
        view.__dict__.update(self.__dict__)
        view.seq, view._owner, view._batcher, view.lender = seq, False, None, None
        view._tokens = np.zeros(self.n_ctx, dtype=np.int32)
        view._n = view._undo_floor = 0
        view._dirty = False
        view._inflight = None
        view._checkpoints = []
        view.rewinds = view.replayed_tokens = view.decode_calls = 0
        view.widest_batch, view.beside = 1, (0, 0, 0)
        view.prompt_read, view.steps_left, view.reading_end, view.reading_waited = 0, None, None, 0.0  # none yet
        view.cells_left = view.last_reply = view.cancelled = None
        view.held_aside = False
        view.busy_seconds = 0.0
        if self._ext is not None:  # hidden rows of its own positions (zero pages until written)
            view.hidden = np.zeros(self.hidden.shape, dtype=np.float32)
        view._batch, view._b_token, view._b_pos, view._b_logits = one_sequence_batch(self.n_batch, seq)
        view._logits = LogitsView(self.n_vocab, self.n_batch)
        return view

    def attach(self, batcher: Optional[StepBatcher]) -> None:
        """Send this sequence's decode calls to ``batcher`` (None: decode alone again)."""
        self._batcher = batcher

    def close(self) -> None:
        """Free the context and the model (a sequence's view: its batch). The object cannot be used afterwards."""
        if self._batch is not None:
            ll.llama_batch_free(self._batch)
            self._batch = None
        if not self._owner:
            return
        if self.projector is not None:  # before the weights it was made over
            self.projector.close()
            self.projector = None
        if self._ctx:
            ll.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            ll.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def set_threads(self, n: int, n_batch: Optional[int] = None) -> None:
        """Use ``n`` threads for single-token steps and ``n_batch`` (default: ``n``) for batches from now on."""
        n_batch = n if n_batch is None else n_batch
        if n < 1 or n_batch < 1:
            raise ConfigError(f"Thread counts must be at least 1, got {n} and {n_batch} for batches.")
        self._llama(ll.llama_set_n_threads, self._ctx, n, n_batch)
        self._threads[:] = [n, n_batch]

    n_threads = property(lambda self: self._threads[0], doc="CPU threads for single-token steps (the context's).")
    n_threads_batch = property(lambda self: self._threads[1], doc="CPU threads for batches (the context's).")

    # -- the cache ------------------------------------------------------------

    @property
    def n_past(self) -> int:
        """Number of positions the cache holds."""
        return self._n

    @property
    def decoding(self) -> bool:
        """Whether a decode call of this sequence is under way (waiting for its step, where several decode
        together; not while the sequence is set aside)."""
        return self._dirty and not self.held_aside

    @property
    def tokens(self) -> np.ndarray:
        """The tokens the cache holds, in order (a read-only view)."""
        view = self._tokens[: self._n]
        view.flags.writeable = False
        return view

    def eval(self, tokens: Tokens, *, logits: LogitsWanted = "last",
             abort: Optional[threading.Event] = None) -> np.ndarray:
        """Append ``tokens`` to the cache and return logits rows.

        Args:
            tokens: token ids to evaluate after what the cache holds.
            logits: "last" for the row after the last token, "all" for one
                row per token (row i predicts the token after tokens[i]),
                "none" for no rows.
            abort: an event another thread may set to stop a long batch
                (a prompt) within milliseconds, between or inside llama.cpp's
                decode calls; single tokens are not worth the hook's cost.

        Returns:
            float32 array of shape (rows, n_vocab). Rows from the final decode
            call are a read-only view of llama.cpp's buffer, valid until the
            next call on this model; copy them to keep them.

        Raises:
            ContextOverflowError: the tokens do not fit in the context.
            TokenIdError: a token id is outside the vocabulary (nothing is evaluated).
            GenerationCancelled: ``abort`` was set; the chunks evaluated before it stay, as for BackendError.
            BackendError: llama.cpp failed to decode. The chunks of ``n_batch``
                tokens before the failing one stay in the cache (and in
                ``tokens``); the failing chunk is removed.
        """
        n = len(tokens)
        if n == 0:
            return np.zeros((0, self.n_vocab), dtype=np.float32)
        arr = self.check_tokens(tokens)
        self._repair()
        if self._n + n > self.n_ctx:
            raise ContextOverflowError(
                f"{self._n + n} tokens do not fit in the {self.n_ctx}-token context of {self.path.name}; "
                "shorten the input or raise the context length."
            )
        hooked = abort is not None and (abort.is_set() or (n > 1 and self._batcher is None))
        if self.sees_images and arr.min() < 0:  # ids of images: placeholders, decoded as images or stand-ins
            out = self._eval_images(arr, logits, abort)
        elif n <= self.n_batch and not hooked:
            out = self._decode(arr, logits, True, abort)  # one call and no hook to set: a round's few tokens
        else:
            out = self._eval_chunks(arr, logits, abort)
        if out is None:
            return np.zeros((0, self.n_vocab), dtype=np.float32)
        out.flags.writeable = False
        return out

    def _eval_chunks(self, arr: np.ndarray, logits: LogitsWanted,
                     abort: Optional[threading.Event]) -> Optional[np.ndarray]:
        """``eval`` of ``arr`` in decode calls of at most ``n_batch`` tokens, stopping where ``abort`` is set."""
        n = len(arr)
        earlier: list[np.ndarray] = []
        out: Optional[np.ndarray] = None
        # the hook is the context's: a batcher's decode serves other sequences too, so it checks abort itself
        with abort_hook(self._ctx, abort if n > 1 and self._batcher is None else None):
            for start in range(0, n, self.n_batch):
                if abort is not None and abort.is_set():
                    raise GenerationCancelled(f"Cancelled before position {self._n} of {self.path.name}.")
                chunk = arr[start : start + self.n_batch]
                final = start + len(chunk) == n
                rows = self._decode(chunk, logits, final, abort)
                if rows is not None:
                    out = rows
                    if not final:
                        earlier.append(out.copy())  # the next decode overwrites the buffer
        if earlier and out is not None:
            return np.concatenate(earlier + [out])
        return out

    def _decode(self, chunk: np.ndarray, logits: LogitsWanted, final: bool,
                abort: Optional[threading.Event]) -> Optional[np.ndarray]:
        """One llama.cpp decode call appending ``chunk``; its logits rows (a view), or None when none were asked."""
        m = len(chunk)
        every, last = logits == "all", logits == "last" and final
        t0 = time.perf_counter()
        self._inflight = chunk  # until the record below matches the cache again (see ``_repair``)
        self._dirty = True
        batched: Optional[np.ndarray] = None
        if self._batcher is not None:  # with other sequences' tokens, in one decode: the loop fills its batch
            rc, batched, spent, width, self.beside = self._batcher.decode(self, chunk, self._n, every, last, abort)
            self.widest_batch = max(self.widest_batch, width)
            t0 = time.perf_counter() - spent  # llama.cpp's time, not the wait for the other sequences
        else:
            self._fill_batch(chunk, every, last)
            with self._log:
                rc = ll.llama_decode(self._ctx, self._batch)
            self.beside = (0, 0, 0)
        if rc != 0:
            if self._batcher is None:  # the repair must not abort too (a batcher's steps remove their own hook)
                ll.llama_set_abort_callback(self._ctx, ll.ggml_abort_callback(), None)
            self._repair(failed=True)
            if rc == 2 and any(e is not None and e.is_set() for e in (abort, self.cancelled)):  # 2: stopped
                raise GenerationCancelled(f"Cancelled at position {self._n} of {self.path.name}.")
            if rc == 1 and self.n_seq > 1:  # no free cells: the sequences together fill the unified cache
                raise ContextOverflowError(
                    f"The {self.n_ctx}-token context of {self.path.name}, shared by its {self.n_seq} sequences, "
                    f"has no room for {m} more tokens of sequence {self.seq}; shorten the input or raise the "
                    "context length.")
            raise BackendError(
                f"llama.cpp decode failed with code {rc} on {self.path.name} "
                f"({m} tokens at position {self._n}); that chunk was removed from the cache."
            )
        self._keep_hidden_rows(m)
        if m == 1:
            self._tokens[self._n] = chunk[0]
        else:
            self._tokens[self._n : self._n + m] = chunk
        self._n += m
        self.writes += 1
        self._dirty = False
        if self.memory.kind != memory.FULL:
            self._after_decode(m)
        rows = m if logits == "all" else (1 if logits == "last" and final else 0)
        if not rows and batched is None:  # on a GPU, decode returns before the work is done; reading logits waits
            ll.llama_synchronize(self._ctx)  # for it, so wait here (a batcher has waited)
        if batched is not None:
            out: Optional[np.ndarray] = batched if rows else None
        else:
            out = self._logits.rows(self._ctx, rows) if rows else None
        self.busy_seconds += time.perf_counter() - t0
        self.decode_calls += 1
        return out

    def _fill_batch(self, chunk: np.ndarray, every: bool, last: bool) -> None:
        """This sequence's own batch holds ``chunk`` at the next positions (``every``: logits for each token;
        ``last``: for the last one)."""
        m = len(chunk)
        self._b_token[:m] = chunk
        np.add(POSITIONS[:m], self._n, out=self._b_pos[:m])  # positions n .. n + m - 1, nothing allocated
        self._b_logits[:m] = 1 if every else 0
        if last:
            self._b_logits[m - 1] = 1
        self._batch.n_tokens = m  # type: ignore[union-attr]

    def common_prefix(self, tokens: np.ndarray) -> int:
        """Length of the longest common prefix of the cache and ``tokens``."""
        n = prefix_length(self._tokens[: self._n], tokens)
        return self.image_start(tokens, n) if self.projector is not None else n

    def sync(self, tokens: Tokens, abort: Optional[threading.Event] = None) -> np.ndarray:
        """Make the cache hold exactly ``tokens`` and return the last token's logits.

        The longest cached prefix is kept; only the rest is evaluated. At
        least the last token is evaluated again, since its logits are needed.
        ``abort`` stops the evaluation early, as in ``eval``.

        Returns:
            the logits row after the last token (a view, see ``eval``).
        """
        arr = self.check_tokens(tokens)
        if len(arr) == 0:
            raise ValueError("cannot sync to an empty token list")
        self._repair()
        self.truncate(min(self.common_prefix(arr), len(arr) - 1), replay=False)
        return self.eval(arr[self._n:], logits="last", abort=abort)[0]
