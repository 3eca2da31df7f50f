"""The hidden state after each position, kept for an MTP head, and the head's second context.

``Model`` gets these methods from ``HiddenRows``. A model whose GGUF carries next-n (MTP) layers drafts from
its own hidden states: once ``keep_hidden`` is called, every decode copies its rows to ``hidden`` at their
positions, and ``open_context`` makes the head's context over the same weights.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar

import llama_cpp as ll
import numpy as np

from .process import LlamaLog

T = TypeVar("T")


class HiddenRows:
    """The methods of a loaded model (``model.Model``) that keep hidden rows and open an MTP head's context."""

    n_ctx: int
    hidden: np.ndarray
    n_threads: int
    n_threads_batch: int
    _ext: Optional[Any]
    _batcher: Any  # a ``batching.StepBatcher``, or None
    _ctx: Any
    _model: Any
    _cparams: Any
    _log: LlamaLog
    _n: int

    if TYPE_CHECKING:  # defined by ``CacheControl``
        def _llama(self, fn: Callable[..., T], *args: Any) -> T: ...

        def reset(self) -> None: ...

    def _keep_hidden_rows(self, m: int) -> None:
        """Copy the last decode's ``m`` hidden rows to their positions (the MTP head's input), if kept (a
        ``StepBatcher`` copies each sequence's rows of a joint decode itself)."""
        if self._ext is not None and self._batcher is None:
            staged = np.ctypeslib.as_array(self._ext.llama_get_embeddings_nextn(self._ctx),  # type: ignore[attr-defined]
                                           shape=(m, self.hidden.shape[1]))
            self.hidden[self._n : self._n + m] = staged

    def keep_hidden(self) -> None:
        """From now on, keep the hidden state after every position (``hidden``), for an MTP head.

        The cache is emptied: positions evaluated before have no hidden rows. Each sequence of a context keeps
        its own (the context gives a row for every token of a decode, whichever sequence it is of).
        """
        if self._ext is not None:
            return
        from llama_cpp import (
            llama_cpp_ext,  # C++ symbols, not a stable API: localspec.drafting.mtp_head checks for them
        )

        self._llama(llama_cpp_ext.llama_set_embeddings_nextn, self._ctx, True, False)  # a row per batch token
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
