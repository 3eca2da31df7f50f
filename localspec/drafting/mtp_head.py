"""A model's own MTP head (next-n layers) as a second llama.cpp context over the target.

Qwen3.5/3.6 and other 2026 models ship one extra transformer block that
predicts the token after next from the target's last hidden state. llama.cpp
runs it as a context of type ``LLAMA_CONTEXT_TYPE_MTP`` over the same model.
Its cache holds one row per target position p: the token at p with the
target's hidden state after p - 1 (``Model.hidden``). To draft, the head
decodes (last token, hidden state before it), samples a token, and feeds that
token back with its own output hidden state, one row at a time.

``MtpHead`` mirrors the target lazily: a plain round costs the target only a
copy of its hidden rows; the head catches up, in one batch, when it drafts.
The calls that stage hidden states are llama.cpp's C++ extension functions
(``llama_cpp.llama_cpp_ext``, not a stable API); this module is the one
place that uses them.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any, Callable, Optional

import llama_cpp as ll
import numpy as np

from ..errors import BackendError, ConfigError
from ..runtime.model import Model
from ..runtime.vocabulary import common_prefix


def extension() -> Any:
    """llama-cpp-python's MTP extension module, or ConfigError naming what this build lacks."""
    try:
        from llama_cpp import llama_cpp_ext
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"This llama-cpp-python build cannot run MTP heads ({exc}); install llama-cpp-python "
                          "0.3.36 or newer (bash scripts/install.sh), or draft with another method.") from None
    return llama_cpp_ext


class MtpHead:
    """The target's MTP head, drafting from the target's own hidden states.

    Args:
        target: a target whose GGUF has next-n layers; its hidden rows are kept from now on.

    Raises:
        ConfigError: the model has no MTP head, or this build lacks the functions.
        BackendError: llama.cpp could not create the head's context.
    """

    def __init__(self, target: Model):
        if not target.n_nextn:
            raise ConfigError(f"{target.path.name} has no MTP head (no next-n layers in its GGUF); draft with "
                              "'lookup', 'draft' or 'auto' instead.")
        self._ext = extension()
        self.target = target
        self.path = target.path
        self.n_vocab = target.n_vocab
        target.keep_hidden()
        self.n_embd = target.hidden.shape[1]
        self.n_batch = target.n_batch
        self._ctx = target.open_context(ctx_type=ll.LLAMA_CONTEXT_TYPE_MTP)
        if not self._ctx:
            raise BackendError(f"llama.cpp could not create the MTP context of {self.path.name}.")
        self._ext.llama_set_embeddings_nextn(self._ctx, True, True)  # hidden rows of output rows only
        self._mem = ll.llama_get_memory(self._ctx)
        self._batch = ll.llama_batch_init(self.n_batch, self.n_embd, 1)
        self._b_tokens = (ll.llama_token * self.n_batch)()
        self._batch.token = self._b_tokens  # a batch of tokens and hidden states: llama.cpp reads both
        for i in range(self.n_batch):
            self._batch.n_seq_id[i] = 1
            self._batch.seq_id[i][0] = 0
        self._b_embd = np.ctypeslib.as_array(self._batch.embd, shape=(self.n_batch, self.n_embd))
        self._tokens = np.zeros(target.n_ctx, dtype=np.int32)  # the token at each position the head's cache holds
        self._n = 0
        #: Seconds inside llama.cpp for the head (its decode time is not Python overhead).
        self.busy_seconds = 0.0
        self.rewinds = 0
        self.replayed_tokens = 0

    def describe(self) -> str:
        """One phrase for a person: the head and the memory it holds."""
        hidden = self.target.hidden.nbytes
        return (f"MTP head ({self.target.n_nextn} next-n layer), the target's hidden rows "
                f"{hidden / 2**20:.1f} MiB, its own one-layer cache")

    def close(self) -> None:
        """Free the head's context (the target stays)."""
        if self._batch is not None:
            self._batch.token = ctypes.POINTER(ll.llama_token)()  # ours, not llama_batch_init's: not freed by it
            ll.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            ll.llama_free(self._ctx)
            self._ctx = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def _decode(self, tokens: np.ndarray, start: int, hidden: np.ndarray, last_logits: bool) -> None:
        """One decode of rows (tokens[i] at start + i, with hidden[i]); logits for the last row if asked."""
        m = len(tokens)
        b = self._batch
        np.ctypeslib.as_array(self._b_tokens, shape=(self.n_batch,))[:m] = tokens
        self._b_embd[:m] = hidden
        for i in range(m):
            b.pos[i] = start + i
            b.logits[i] = 0
        b.logits[m - 1] = 1 if last_logits else 0
        b.n_tokens = m
        t0 = time.perf_counter()
        # on the thread that decodes the target's sequences together, if it has one (one team of CPU threads)
        rc = self.target.call(self._decode_now, last_logits)
        self.busy_seconds += time.perf_counter() - t0
        if rc != 0:  # whatever llama.cpp kept of the failed rows goes
            ll.llama_memory_seq_rm(self._mem, 0, start, -1)
            self._n = min(self._n, start)
            raise BackendError(f"llama.cpp failed ({rc}) to decode the MTP head of {self.path.name}.")
        self._tokens[start : start + m] = tokens
        self._n = start + m

    def _decode_now(self, last_logits: bool) -> int:
        rc = int(ll.llama_decode(self._ctx, self._batch))
        if not last_logits:
            ll.llama_synchronize(self._ctx)
        return rc

    def _cut(self, n: int) -> None:
        """Keep the head's first ``n`` rows (an attention cache: it cuts back anywhere)."""
        if n < self._n:
            ll.llama_memory_seq_rm(self._mem, 0, n, -1)
            self._n = n

    def _hidden_before(self, positions: np.ndarray) -> np.ndarray:
        """The target's hidden state after position p - 1 for each p (zeros before the first)."""
        rows = self.target.hidden[np.maximum(positions - 1, 0)].copy()
        rows[positions == 0] = 0.0
        return rows

    def catch_up(self) -> None:
        """Give the head a row for every position the target holds that it lacks (in batches)."""
        held = self.target.tokens
        n = len(held)
        same = common_prefix(self._tokens[: self._n], held)
        self._cut(same)
        for start in range(same, n, self.n_batch):
            end = min(n, start + self.n_batch)
            pos = np.arange(start, end)
            ids = np.asarray(held[start:end])
            if self.target.projector is not None:  # an image's positions: its stand-in token (the draft model's too)
                ids = np.where(ids < 0, self.target.projector.stand_in, ids)
            self._decode(ids, start, self._hidden_before(pos), False)

    def draft(self, last: int, k: int,
              choose: Callable[[np.ndarray], tuple[int, Optional[np.ndarray]]]) -> tuple[list[int], list[np.ndarray]]:
        """Up to ``k`` tokens after the target's cache plus ``last``, and the q rows they were drawn from.

        Args:
            last: the context's last token (the target holds everything before it).
            k: the most tokens to draft.
            choose: picks a token from the head's logits row, and returns the distribution it
                sampled from (None for a greedy pick).
        """
        self.catch_up()
        pos = self.target.n_past
        hidden = self._hidden_before(np.array([pos]))
        token = last
        tokens: list[int] = []
        rows: list[np.ndarray] = []
        try:
            for i in range(k):  # one (token, hidden) row at a time, the head's own hidden state fed back
                self._decode(np.array([token]), pos + i, hidden, True)
                logits = np.ctypeslib.as_array(ll.llama_get_logits_ith(self._ctx, -1), shape=(self.n_vocab,))
                token, q = choose(logits)
                if q is not None:
                    rows.append(q)
                tokens.append(token)
                if self.target.is_eog(token):
                    break
                out = self._ext.llama_get_embeddings_nextn_ith(self._ctx, -1)
                if not out:
                    raise BackendError(f"llama.cpp gave no hidden state from the MTP head of {self.path.name}.")
                hidden = np.ctypeslib.as_array(out, shape=(1, self.n_embd)).copy()
        finally:  # the row of ``last`` is the one the target's verification would add: keep it, drop the guesses
            self._cut(pos + 1)
        return tokens, rows

