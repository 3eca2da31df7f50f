"""llama.cpp's process-wide pieces: its log, a vocabulary read alone, the thread count, GPU support."""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import sys
from pathlib import Path
from typing import Iterator, Optional, Protocol, Union

import llama_cpp as ll
import numpy as np

from ..errors import ModelFileError
from .gguf_metadata import check_gguf
from .vocab_match import VocabInfo

#: KV cache element types by name (ggml_type values).
CACHE_TYPES = {"f32": 0, "f16": 1, "q8_0": 8}

_GGML_WARN, _GGML_ERROR = 3, 4  # ggml_log_level values in the pinned llama.cpp

#: 0, 1, 2 ...: a decode's positions are these plus where its tokens start (read-only, shared by every model;
#: more than any n_batch).
POSITIONS = np.arange(1 << 16, dtype=np.int32)
POSITIONS.flags.writeable = False


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
        ll.llama_log_set(log_callback, ctypes.c_void_p(id(self)))
        return self

    def __exit__(self, *exc: object) -> None:
        ll.llama_log_set(log_callback, ctypes.c_void_p(0))  # nothing logs into a freed object


@ll.llama_log_callback
def log_callback(level: int, text: bytes, user_data: Optional[int]) -> None:
    # llama-cpp-python's own callback maps these levels off by one and prints
    # warnings even when asked to be quiet; this one routes each line to the
    # LlamaLog of the model that is calling llama.cpp (none: dropped).
    if user_data:
        ctypes.cast(user_data, ctypes.py_object).value.write(level, text)


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


def vocab_of_model(path: Path, vocab: ll.llama_vocab_p) -> VocabInfo:
    """The vocabulary of a loaded model (or of a vocabulary-only load), with the file it came from."""
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
        return vocab_of_model(p, ll.llama_model_get_vocab(model))
    finally:
        ll.llama_model_free(model)


def load_weights(path: Path, n_gpu_layers: int, log: LlamaLog) -> ll.llama_model_p:
    """Load a GGUF's weights (and its MTP head, where it has one), ``n_gpu_layers`` of them on the GPU (-1: all).

    Raises:
        ModelFileError: llama.cpp cannot load the file (the message gives its reason where it logged one).
    """
    mparams = ll.llama_model_default_params()
    mparams.n_gpu_layers = 0x7FFFFFFF if n_gpu_layers < 0 else n_gpu_layers
    if hasattr(mparams, "load_mtp"):
        mparams.load_mtp = True  # a model's MTP head (next-n layers), where its GGUF has one: a free drafter
    with log:
        ll.llama_backend_init()  # idempotent: ggml's timer and tables
        model = ll.llama_model_load_from_file(str(path).encode(), mparams)
    if not model:
        reason = log.last_error()
        raise ModelFileError(
            f"llama.cpp could not load {path}" + (f" ({reason})" if reason else "")
            + ": the GGUF is truncated, corrupt, or of an architecture this llama-cpp-python build "
            "does not support; re-download it."
        )
    return model


def context_params(n_ctx: int, n_batch: int, n_threads: int, n_threads_batch: int, cache_type: str,
                   flash_attn: Optional[bool], n_seq: int = 1) -> ll.llama_context_params:
    """Settings for a context of ``n_seq`` sequences (``flash_attn`` None: llama.cpp's choice). Several share one
    unified cache of ``n_ctx`` cells, so each may use all of them that the others leave free."""
    cparams = ll.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = cparams.n_ubatch = n_batch
    cparams.n_seq_max = n_seq
    cparams.kv_unified = n_seq > 1
    cparams.swa_full = True  # sliding-window layers keep every position, so any of them can be cut back
    cparams.n_threads = n_threads
    cparams.n_threads_batch = n_threads_batch
    cparams.type_k = cparams.type_v = CACHE_TYPES[cache_type]
    if flash_attn is not None:
        cparams.flash_attn_type = 1 if flash_attn else 0
    return cparams


class Flag(Protocol):
    """What ``abort_hook`` asks: a ``threading.Event``, or anything else that says whether it is set."""

    def is_set(self) -> bool: ...


@contextlib.contextmanager
def abort_hook(ctx: Optional[ll.llama_context_p], abort: Optional[Flag]) -> Iterator[None]:
    """While in the block, llama.cpp asks ``abort`` between the nodes of its graph (None: no hook).

    The hook costs a Python call per node, which only a long batch amortises.
    """
    if abort is None:
        yield
        return
    hook = ll.ggml_abort_callback(lambda _data: abort.is_set())  # kept alive until it is removed
    ll.llama_set_abort_callback(ctx, hook, None)
    try:
        yield
    finally:
        ll.llama_set_abort_callback(ctx, ll.ggml_abort_callback(), None)  # a null pointer: no hook


class LogitsView:
    """The first rows of a context's logits buffer as a numpy view, made again only when llama.cpp moves the
    buffer (it does so only to make it larger): reading a decode's rows costs no array construction."""

    def __init__(self, n_vocab: int, most: int):
        self.n_vocab, self.most = n_vocab, most
        self._address: Optional[int] = None
        self._view = np.zeros((0, n_vocab), dtype=np.float32)

    def rows(self, ctx: ll.llama_context_p, n: int) -> np.ndarray:
        """The first ``n`` rows of the logits the last decode on ``ctx`` gave (a view, valid until its next)."""
        address = ctypes.cast(ll.llama_get_logits(ctx), ctypes.c_void_p).value
        if address != self._address or self._view.shape[0] < n:
            size = max(n, self.most) * self.n_vocab  # a bound on what is read: never more than the decode's rows
            buffer = memoryview((ctypes.c_float * size).from_address(address or 0))
            self._view = np.frombuffer(buffer, dtype=np.float32).reshape(-1, self.n_vocab)
            self._address = address
        return self._view[:n]


def one_sequence_batch(n: int, seq: int = 0) -> tuple[ll.llama_batch, np.ndarray, np.ndarray, np.ndarray]:
    """A batch of up to ``n`` tokens of sequence ``seq``, and numpy views of its token, position and
    logits-wanted arrays, so that filling it is a few vectorised writes."""
    batch = ll.llama_batch_init(n, 0, 1)
    views = [np.ctypeslib.as_array(a, shape=(n,)) for a in (batch.token, batch.pos, batch.logits)]
    np.ctypeslib.as_array(batch.n_seq_id, shape=(n,))[:] = 1
    for i in range(n):
        batch.seq_id[i][0] = seq  # every token belongs to the one sequence
    return batch, views[0], views[1], views[2]
