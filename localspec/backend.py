"""One loaded GGUF model over llama-cpp-python's low-level API.

``Model`` is the only place in localspec that touches llama.cpp's KV cache.
It keeps a record of exactly which tokens the cache holds (``tokens``), so
callers reason about the cache as a token list:

* ``eval(tokens)`` appends tokens and returns logits rows only for the
  positions asked for (the last one, or all of them for verification);
* ``truncate(n)`` drops every cached position from n on, whatever the
  memory (see ``localspec.memory``): llama.cpp's ``seq_rm`` where it can
  (an attention cache, or a recurrent state's bounded rollback), else the
  newest checkpoint at or before n is restored (or the cache emptied) and
  the recorded tokens up to n are evaluated again;
* ``checkpoint()`` saves the state a recurrent model cannot cut back, so
  that a later ``truncate`` to this point is cheap (a no-op for attention);
* ``sync(tokens)`` reuses the longest cached prefix of ``tokens`` and
  evaluates only the rest.

If an evaluation is interrupted (Ctrl-C between llama.cpp returning and the
bookkeeping, or a failed decode), the next call first compares what the
cache holds with the record and makes them agree again.
"""

from __future__ import annotations

import codecs
import collections
import contextlib
import ctypes
import functools
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal, Optional, Sequence, Union

import llama_cpp as ll
import numpy as np

from . import memory
from .errors import (
    BackendError,
    ConfigError,
    ContextOverflowError,
    GenerationCancelled,
    ModelFileError,
    TokenIdError,
)
from .hugepages import HugePages

GGUF_MAGIC = b"GGUF"
#: KV cache element types by name (ggml_type values).
CACHE_TYPES = {"f32": 0, "f16": 1, "q8_0": 8}
LogitsWanted = Literal["last", "all", "none"]
#: Token ids as a list or a 1-D integer array.
Tokens = Union[Sequence[int], np.ndarray]
#: Checkpoints a model keeps at once (one per round, one at a prompt's end, one spare).
MAX_CHECKPOINTS = 3

_GGML_WARN, _GGML_ERROR = 3, 4  # ggml_log_level values in the pinned llama.cpp


class LlamaLog:
    """Where llama.cpp's log goes while one model calls into it.

    llama.cpp has one process-wide log callback; each ``Model`` (and each
    vocabulary read) points it at its own ``LlamaLog`` for the length of a
    call (``with log:``), so a quiet draft cannot silence a verbose target
    and a failed load is explained by its own warnings.

    Args:
        verbose: print the log to stderr.
    """

    def __init__(self, verbose: bool = False):
        self.verbose = verbose
        #: The last warnings and errors logged, to explain a failure.
        self.tail: collections.deque[str] = collections.deque(maxlen=8)

    def write(self, level: int, text: bytes) -> None:
        msg = text.decode("utf-8", errors="replace")
        if self.verbose:
            sys.stderr.write(msg)
        if level in (_GGML_WARN, _GGML_ERROR) and msg.strip():
            self.tail.append(msg.strip())

    def last_error(self) -> str:
        """The newest logged line that mentions an error, or ''."""
        return next((m for m in reversed(self.tail) if "error" in m.lower()), "")

    def __enter__(self) -> LlamaLog:
        ll.llama_log_set(_log_callback, ctypes.c_void_p(id(self)))
        return self

    def __exit__(self, *exc: object) -> None:
        ll.llama_log_set(_log_callback, ctypes.c_void_p(0))  # nothing logs into a freed object


@ll.llama_log_callback
def _log_callback(level: int, text: bytes, user_data: Optional[int]) -> None:
    # llama-cpp-python's own callback maps these levels off by one and prints
    # warnings even when asked to be quiet; this one routes each line to the
    # LlamaLog of the model that is calling llama.cpp (none: dropped).
    if user_data:
        ctypes.cast(user_data, ctypes.py_object).value.write(level, text)


def check_gguf(path: Union[str, os.PathLike]) -> Path:
    """Return ``path`` as a Path if it is a readable GGUF file, else raise ModelFileError."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelFileError(f"Model file {p} does not exist; check the path or download it first.")
    if not p.is_file():
        raise ModelFileError(f"Model path {p} is not a file; pass the .gguf file itself.")
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise ModelFileError(f"Model file {p} cannot be read ({exc.strerror}); check its permissions.") from exc
    if magic != GGUF_MAGIC:
        raise ModelFileError(
            f"Model file {p} is not a GGUF file (it starts with {magic!r}, not b'GGUF'); "
            "localspec needs llama.cpp GGUF models."
        )
    return p


def default_threads() -> int:
    """Threads for generation: every core this process may run on.

    llama-cpp-python's high-level ``Llama`` uses half the cores; for a
    single-stream decoder on a small machine all cores are faster, and plain
    and speculative runs must use the same number to be comparable.
    """
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def gpu_offload_supported() -> bool:
    """True when this llama-cpp-python build can put layers on a GPU (CUDA, Metal...)."""
    return bool(ll.llama_supports_gpu_offload())


@dataclass
class VocabInfo:
    """A model's vocabulary: tokenizer type, size, special ids and every token's text."""

    path: Path
    type: int
    bos: int
    eos: int
    texts: list[bytes]

    @property
    def n_tokens(self) -> int:
        return len(self.texts)


def _vocab_info(path: Path, vocab: ll.llama_vocab_p) -> VocabInfo:
    n = int(ll.llama_vocab_n_tokens(vocab))
    texts = [ll.llama_vocab_get_text(vocab, i) or b"" for i in range(n)]
    return VocabInfo(path, int(ll.llama_vocab_type(vocab)), int(ll.llama_vocab_bos(vocab)),
                     int(ll.llama_vocab_eos(vocab)), texts)


def read_vocab(path: Union[str, os.PathLike]) -> VocabInfo:
    """Read only the vocabulary of a GGUF (no weights are loaded; well under a second).

    Raises:
        ModelFileError: missing, not a GGUF, or unreadable by llama.cpp.
    """
    p = check_gguf(path)
    params = ll.llama_model_default_params()
    params.vocab_only = True
    with LlamaLog():
        ll.llama_backend_init()  # idempotent: ggml's timer and tables
        model = ll.llama_model_load_from_file(str(p).encode(), params)
    if not model:
        raise ModelFileError(f"llama.cpp could not read the vocabulary of {p}: the GGUF is truncated or corrupt; "
                             "re-download it.")
    try:
        return _vocab_info(p, ll.llama_model_get_vocab(model))
    finally:
        ll.llama_model_free(model)


class Model:
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
        flash_attn: force flash attention on or off. Default: off when running
            on the CPU (its f16 rounding makes logits depend on batch shape),
            llama.cpp's automatic choice when layers are on a GPU.
        huge_pages: on a CPU build under Linux, ask for transparent huge pages
            for llama.cpp's buffers (see ``localspec.hugepages``); False to leave
            them as llama.cpp allocated them.
        rollback_tokens: for a recurrent model whose architecture can roll its
            state back, how many trailing tokens of a decode it can remove
            (llama.cpp's ``n_rs_seq``; each costs one copy of the state).
            Longer drafts take a checkpoint instead. Ignored for other models.
        verbose: let llama.cpp print its log to stderr, and say when the cache
            had to go back to a checkpoint or to the start.

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
    ):
        self.path = check_gguf(path)
        if n_ctx < 0:
            raise ConfigError(f"Context length must be >= 0 (0 = the model's own), got {n_ctx}.")
        if cache_type not in CACHE_TYPES:
            raise ConfigError(f"Unknown KV cache type {cache_type!r}; choose one of {', '.join(CACHE_TYPES)}.")
        if rollback_tokens < 0:
            raise ConfigError(f"rollback_tokens must be >= 0, got {rollback_tokens}.")
        self._log = LlamaLog(verbose)
        self.verbose = verbose
        #: True when the caller left the thread count to localspec (see ``calibration.choose_threads``).
        self.threads_unset = not n_threads
        self.n_threads = n_threads if n_threads else default_threads()
        #: True when the caller left the batch thread count to localspec.
        self.batch_threads_unset = not n_threads_batch
        self.n_threads_batch = n_threads_batch if n_threads_batch else self.n_threads
        if n_gpu_layers is None:
            n_gpu_layers = -1 if gpu_offload_supported() else 0
        self.n_gpu_layers = n_gpu_layers
        self._model = None
        self._ctx = None
        self._batch: Optional[ll.llama_batch] = None

        # Only on CPU builds: a GPU build's host buffers may be pinned for the device,
        # and their pages are best left where the driver put them.
        pages = HugePages(huge_pages and not gpu_offload_supported())
        self._model = self._load_weights(n_gpu_layers)
        if n_ctx == 0:
            n_ctx = int(ll.llama_model_n_ctx_train(self._model))
        cparams = self._context_params(n_ctx, n_batch, cache_type, flash_attn)
        self._cparams = cparams  # for a second context over the same weights (an MTP head)
        recurrent = ll.llama_model_is_recurrent(self._model) or ll.llama_model_is_hybrid(self._model)
        cparams.n_rs_seq = rollback_tokens if recurrent else 0  # llama.cpp clamps it to 0 where it cannot
        with self._log:
            self._ctx = ll.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            self.close()
            raise BackendError(
                f"llama.cpp could not create a {n_ctx}-token context for {self.path.name}; "
                "try a smaller context length."
            )
        pages.apply()
        #: Bytes of llama.cpp's buffers advised to use huge pages (0: none; see ``hugepages``).
        self.huge_page_bytes = pages.advised
        self.n_ctx = int(ll.llama_n_ctx(self._ctx))
        self.n_batch = min(n_batch, n_ctx)
        self._vocab = ll.llama_model_get_vocab(self._model)
        self._mem = ll.llama_get_memory(self._ctx)
        if not self._mem:
            self.close()
            raise ModelFileError(f"{self.path.name} has no memory llama.cpp can decode with (an encoder or "
                                 "embedding-only model); localspec needs a model that generates text.")
        #: What this model's memory can undo (see ``localspec.memory``); its checkpoint size once measured.
        self.memory = memory.inspect(self._model, self._ctx)
        self.n_vocab = int(ll.llama_vocab_n_tokens(self._vocab))
        #: Next-n (MTP) layers in the GGUF: a head that drafts from this model's own hidden states.
        self.n_nextn = int(ll.llama_model_n_layer_nextn(self._model)) if hasattr(ll, "llama_model_n_layer_nextn") else 0
        #: Hidden state after each position (row p: after token p), kept once ``keep_hidden`` is called.
        self.hidden = np.zeros((0, 0), dtype=np.float32)
        self._ext: Optional[object] = None
        self.bos = int(ll.llama_vocab_bos(self._vocab))
        self.eos = int(ll.llama_vocab_eos(self._vocab))
        self._init_batch()
        self._tokens = np.zeros(self.n_ctx, dtype=np.int32)
        self._n = 0
        self._dirty = False
        #: The shortest length ``truncate`` reaches with llama.cpp's own ``seq_rm`` (lower needs a checkpoint).
        self._undo_floor = 0
        self._checkpoints: list[memory.Checkpoint] = []
        #: Times the cache went back to a checkpoint or to the start, and tokens evaluated again for it.
        self.rewinds = 0
        self.replayed_tokens = 0
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}
        #: Seconds spent inside llama.cpp decode calls (and reading their logits).
        self.busy_seconds = 0.0
        #: Number of decode calls made.
        self.decode_calls = 0

    def _load_weights(self, n_gpu_layers: int) -> ll.llama_model_p:
        mparams = ll.llama_model_default_params()
        mparams.n_gpu_layers = 0x7FFFFFFF if n_gpu_layers < 0 else n_gpu_layers
        if hasattr(mparams, "load_mtp"):
            mparams.load_mtp = True  # a model's MTP head (next-n layers), where its GGUF has one: a free drafter
        with self._log:
            ll.llama_backend_init()  # idempotent: ggml's timer and tables
            model = ll.llama_model_load_from_file(str(self.path).encode(), mparams)
        if not model:
            reason = self._log.last_error()
            raise ModelFileError(
                f"llama.cpp could not load {self.path}" + (f" ({reason})" if reason else "")
                + ": the GGUF is truncated, corrupt, or of an architecture this llama-cpp-python build "
                "does not support; re-download it."
            )
        return model

    def _context_params(self, n_ctx: int, n_batch: int, cache_type: str,
                        flash_attn: Optional[bool]) -> ll.llama_context_params:
        cparams = ll.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = cparams.n_ubatch = min(n_batch, n_ctx)
        cparams.n_seq_max = 1
        cparams.swa_full = True  # sliding-window layers keep every position, so any of them can be cut back
        cparams.n_threads = self.n_threads
        cparams.n_threads_batch = self.n_threads_batch
        cparams.type_k = cparams.type_v = CACHE_TYPES[cache_type]
        if flash_attn is None:
            # On CPU, flash attention rounds through f16 and moves logits by up to ~0.4
            # between batch shapes, enough to flip near-greedy choices between plain
            # decoding and batched verification; GPU builds keep llama.cpp's choice.
            flash_attn = None if self.n_gpu_layers != 0 and gpu_offload_supported() else False
        if flash_attn is not None:
            cparams.flash_attn_type = 1 if flash_attn else 0
        self.flash_attn = flash_attn
        return cparams

    def _init_batch(self) -> None:
        """One batch reused for every decode; numpy views over its arrays make filling it a few vectorised writes."""
        self._batch = ll.llama_batch_init(self.n_batch, 0, 1)
        nb = self.n_batch
        self._b_token = np.ctypeslib.as_array(self._batch.token, shape=(nb,))
        self._b_pos = np.ctypeslib.as_array(self._batch.pos, shape=(nb,))
        self._b_logits = np.ctypeslib.as_array(self._batch.logits, shape=(nb,))
        np.ctypeslib.as_array(self._batch.n_seq_id, shape=(nb,))[:] = 1
        for i in range(nb):
            self._batch.seq_id[i][0] = 0  # every token belongs to sequence 0

    # -- lifetime -----------------------------------------------------------

    def close(self) -> None:
        """Free the context and the model. The object cannot be used afterwards."""
        if self._batch is not None:
            ll.llama_batch_free(self._batch)
            self._batch = None
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
        ll.llama_set_n_threads(self._ctx, n, n_batch)
        self.n_threads, self.n_threads_batch = n, n_batch

    # -- vocabulary ---------------------------------------------------------

    def check_tokens(self, tokens: Tokens) -> np.ndarray:
        """``tokens`` as an int32 array, once every id is known to be in this model's vocabulary.

        llama.cpp aborts the whole process on an id outside the vocabulary, so
        every call that hands ids to it checks them here first.

        Raises:
            TokenIdError: an id is not a whole number from 0 to ``n_vocab - 1``.
        """
        try:
            ids = np.asarray(tokens)
        except (OverflowError, ValueError):  # ragged, or an int too large for any integer dtype
            ids = np.asarray(list(tokens), dtype=object)
        if ids.ndim != 1:
            raise TokenIdError(f"Token ids must be a flat list of whole numbers, got an array of shape {ids.shape}.")
        if not ids.size:
            return ids.astype(np.int32)
        if ids.dtype.kind not in "iu":  # floats, bools, strings or huge Python ints: judged one by one
            ids = np.asarray([self._bad_token(t) for t in tokens], dtype=np.int64)
        if ids.min() < 0 or ids.max() >= self.n_vocab:
            self._bad_token(int(ids[(ids < 0) | (ids >= self.n_vocab)][0]))
        return ids.astype(np.int32)

    def check_token(self, token: int) -> None:
        """Raise TokenIdError unless ``token`` is an id in this model's vocabulary."""
        if not (isinstance(token, (int, np.integer)) and 0 <= token < self.n_vocab):
            self._bad_token(token)

    def _bad_token(self, token: object) -> int:
        """Raise TokenIdError for ``token`` if it is not a valid id; otherwise return it."""
        if isinstance(token, np.generic):
            token = token.item()  # numpy scalars are judged, and named, as the Python values they hold
        whole = isinstance(token, int) and not isinstance(token, bool)
        if whole and 0 <= token < self.n_vocab:  # type: ignore[operator]
            return token  # type: ignore[return-value]
        if not whole:
            raise TokenIdError(f"Token id {token!r} is not a whole number; token ids are integers from 0 to "
                               f"{self.n_vocab - 1} for {self.path.name}.")
        raise TokenIdError(f"Token id {token!r} is outside the vocabulary of {self.path.name}, whose ids run from 0 "
                           f"to {self.n_vocab - 1} ({self.n_vocab} tokens); send ids this model knows, or text.")

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Text to token ids.

        Args:
            text: the text.
            add_special: add BOS (and EOS) if the model is configured to.
            parse_special: turn special-token text such as ``<|im_start|>`` into its id.
        """
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigError(f"The text is not valid Unicode: it has a lone surrogate (U+{ord(text[exc.start]):04X}) "
                              f"at character {exc.start}; send text that encodes as UTF-8.") from None
        cap = len(data) + 8
        while True:
            buf = (ll.llama_token * cap)()
            n = ll.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
            if n >= 0:
                return list(buf[:n])
            cap = -n  # too small: llama.cpp says how many it needs

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token stands for (special tokens give b'')."""
        piece = self._pieces.get(token)
        if piece is None:
            self.check_token(token)
            buf = ctypes.create_string_buffer(64)
            n = ll.llama_token_to_piece(self._vocab, token, buf, 64, 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = ll.llama_token_to_piece(self._vocab, token, buf, -n, 0, False)
            piece = buf.raw[:n]
            self._pieces[token] = piece
        return piece

    def detokenize(self, tokens: Tokens) -> str:
        """Token ids to text (invalid UTF-8 replaced)."""
        return b"".join(self.token_bytes(int(t)) for t in tokens).decode("utf-8", errors="replace")

    def token_text(self, token: int) -> bytes:
        """The vocabulary's stored text of a token (as in the GGUF), for comparisons."""
        self.check_token(token)
        return ll.llama_vocab_get_text(self._vocab, token) or b""

    @property
    def vocab_pointer(self) -> ll.llama_vocab_p:
        """llama.cpp's vocabulary of this model (for a grammar engine that reads it; valid while the model is)."""
        return self._vocab

    def vocab_info(self) -> VocabInfo:
        """This model's vocabulary (for compatibility checks)."""
        return _vocab_info(self.path, self._vocab)

    @functools.cached_property
    def longest_token_bytes(self) -> int:
        """The longest token's stored text in UTF-8 bytes: no token covers more bytes of a prompt."""
        return max(len(t) for t in self.vocab_info().texts)

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, <|im_end|>...)."""
        r = self._eog.get(token)
        if r is None:
            self.check_token(token)
            r = self._eog[token] = bool(ll.llama_vocab_is_eog(self._vocab, token))
        return r

    def chat_template(self) -> Optional[str]:
        """The Jinja2 chat template stored in the GGUF, if any."""
        raw = ll.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8") if raw else None

    def special_text(self, token: int) -> str:
        """A special token's text as templates spell it (e.g. ``<|endoftext|>``)."""
        if token < 0:
            return ""
        return self.token_text(token).decode("utf-8", errors="replace")

    # -- the cache ------------------------------------------------------------

    @property
    def n_past(self) -> int:
        """Number of positions the cache holds."""
        return self._n

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
        earlier: list[np.ndarray] = []
        out = np.zeros((0, self.n_vocab), dtype=np.float32)
        with self._aborting(abort if n > 1 else None):
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
        if earlier:
            return np.concatenate(earlier + [out])
        out.flags.writeable = False
        return out

    def _decode(self, chunk: np.ndarray, logits: LogitsWanted, final: bool,
                abort: Optional[threading.Event]) -> Optional[np.ndarray]:
        """One llama.cpp decode call appending ``chunk``; its logits rows (a view), or None when none were asked."""
        m = len(chunk)
        self._b_token[:m] = chunk
        self._b_pos[:m] = np.arange(self._n, self._n + m, dtype=np.int32)
        self._b_logits[:m] = 1 if logits == "all" else 0
        if logits == "last" and final:
            self._b_logits[m - 1] = 1
        self._batch.n_tokens = m  # type: ignore[union-attr]
        t0 = time.perf_counter()
        self._dirty = True  # until the record below matches the cache again
        with self._log:
            rc = ll.llama_decode(self._ctx, self._batch)
        if rc != 0:
            ll.llama_set_abort_callback(self._ctx, ll.ggml_abort_callback(), None)  # the repair must not abort too
            self._repair(failed=True)
            if rc == 2 and abort is not None and abort.is_set():  # 2: the abort callback said stop
                raise GenerationCancelled(f"Cancelled at position {self._n} of {self.path.name}.")
            raise BackendError(
                f"llama.cpp decode failed with code {rc} on {self.path.name} "
                f"({m} tokens at position {self._n}); that chunk was removed from the cache."
            )
        self._keep_hidden_rows(m)
        self._tokens[self._n : self._n + m] = chunk
        self._n += m
        self._dirty = False
        self._after_decode(m)
        rows = m if logits == "all" else (1 if logits == "last" and final else 0)
        if not rows:  # on a GPU, decode returns before the work is done; reading logits waits for it, so wait here
            ll.llama_synchronize(self._ctx)
        out = np.ctypeslib.as_array(ll.llama_get_logits(self._ctx), shape=(rows, self.n_vocab)) if rows else None
        self.busy_seconds += time.perf_counter() - t0
        self.decode_calls += 1
        return out

    @contextlib.contextmanager
    def _aborting(self, abort: Optional[threading.Event]) -> Iterator[None]:
        """While evaluating, let llama.cpp ask ``abort`` between the nodes of its graph (None: no hook).

        The hook costs a Python call per node, which only a long batch amortises.
        """
        if abort is None:
            yield
            return
        hook = ll.ggml_abort_callback(lambda _data: abort.is_set())  # kept alive until it is removed
        ll.llama_set_abort_callback(self._ctx, hook, None)
        try:
            yield
        finally:
            ll.llama_set_abort_callback(self._ctx, ll.ggml_abort_callback(), None)  # a null pointer: no hook

    def _after_decode(self, m: int) -> None:
        """Where ``truncate`` can go back to by ``seq_rm`` alone after a decode of ``m`` tokens."""
        info = self.memory
        if info.kind == memory.FULL:
            return
        if not info.state_bytes:
            self.memory = memory.with_state_size(info, self._ctx)  # measurable once the state holds a token
            if self.verbose:
                sys.stderr.write(f"localspec: {self.path.name}: {self.memory.describe()}\n")
        # A rollback reaches the state after any but the first of the last decode's tokens (llama.cpp
        # snapshots the last n_rs_seq + 1 of them); the state before the decode is gone.
        self._undo_floor = self._n - min(info.rollback_tokens, m - 1) if info.kind == memory.ROLLBACK else self._n

    def _keep_hidden_rows(self, m: int) -> None:
        """Copy the last decode's ``m`` hidden rows to their positions (the MTP head's input), if kept."""
        if self._ext is not None:
            staged = np.ctypeslib.as_array(self._ext.llama_get_embeddings_nextn(self._ctx),  # type: ignore[attr-defined]
                                           shape=(m, self.hidden.shape[1]))
            self.hidden[self._n : self._n + m] = staged

    def keep_hidden(self) -> None:
        """From now on, keep the hidden state after every position (``hidden``), for an MTP head.

        The cache is emptied: positions evaluated before have no hidden rows.
        """
        if self._ext is not None:
            return
        from llama_cpp import llama_cpp_ext  # C++ symbols, not a stable API: localspec.nextn checks for them

        llama_cpp_ext.llama_set_embeddings_nextn(self._ctx, True, False)  # one row per batch token
        self.hidden = np.zeros((self.n_ctx, int(ll.llama_model_n_embd_out(self._model))), dtype=np.float32)
        self._ext = llama_cpp_ext
        self.reset()

    def open_context(self, ctx_type: int) -> Optional[ll.llama_context_p]:
        """A second llama.cpp context over these weights, with this one's settings (the caller frees it)."""
        cparams = ll.llama_context_params.from_buffer_copy(self._cparams)
        cparams.ctx_type = ctx_type
        cparams.n_rs_seq = 0
        cparams.n_threads, cparams.n_threads_batch = self.n_threads, self.n_threads_batch
        with self._log:
            return ll.llama_init_from_model(self._model, cparams)

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
            self._checkpoints.append(memory.save(self._ctx, self._n))
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
        if n >= self._undo_floor and ll.llama_memory_seq_rm(self._mem, 0, n, -1):
            self._n = n
            if self.memory.kind == memory.ROLLBACK:
                self._undo_floor = n  # a rollback is single-use until the next decode
            return
        self._rewind(n, replay)

    def _rewind(self, n: int, replay: bool) -> None:
        """Go back to the newest checkpoint at or before ``n`` (or to the start), then evaluate up to n again."""
        t0 = time.perf_counter()
        start = self._checkpoints[-1] if self._checkpoints else None  # every checkpoint is at most n
        with self._log:
            if start is None or not memory.restore(self._ctx, start):
                ll.llama_memory_clear(self._mem, True)
                start = None
                self._checkpoints.clear()  # one llama.cpp refused is no use, nor are the older ones it hid
            at = start.position if start is not None else 0
            if not ll.llama_memory_seq_rm(self._mem, 0, at, -1):  # the attention part of a hybrid, past the state
                raise BackendError(f"llama.cpp could not cut the cache of {self.path.name} back to position {at}.")
        self._n = self._undo_floor = at
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
        """Empty the cache."""
        ll.llama_memory_clear(self._mem, True)
        self._n = self._undo_floor = 0
        self._dirty = False
        self._checkpoints.clear()

    def common_prefix(self, tokens: np.ndarray) -> int:
        """Length of the longest common prefix of the cache and ``tokens``."""
        return common_prefix(self._tokens[: self._n], tokens)

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
        held = int(ll.llama_memory_seq_pos_max(self._mem, 0)) + 1
        m = int(self._batch.n_tokens) if self._batch is not None else 0  # the chunk that was being decoded
        if not failed and m and held == self._n + m and self._b_pos[0] == self._n:
            self._keep_hidden_rows(m)  # it finished (llama.cpp removes a failed chunk itself): adopt it
            self._tokens[self._n : held] = self._b_token[:m]
            self._n = held
        elif held > self._n:
            ll.llama_memory_seq_rm(self._mem, 0, self._n, -1)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two token arrays."""
    m = min(len(a), len(b))
    diff = np.flatnonzero(a[:m] != b[:m])
    return int(diff[0]) if diff.size else m


class Detokenizer:
    """Turns a stream of token ids into text, holding back split UTF-8 sequences.

    A multi-byte character can be spread over several byte-level tokens; the
    incremental decoder emits it only once it is complete.
    """

    def __init__(self, model: Model):
        self._model = model
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token: int) -> str:
        """Text completed by this token (may be empty)."""
        return self._decoder.decode(self._model.token_bytes(token))

    def flush(self) -> str:
        """Whatever is still held back (an incomplete sequence becomes U+FFFD)."""
        return self._decoder.decode(b"", final=True)
