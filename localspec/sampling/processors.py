"""Logit processors: OpenAI's ``logit_bias`` and llama.cpp's repeat, frequency and presence penalties.

A processed row depends only on the tokens generated before its position,
so verification processes row i with the generated tokens plus the first i
drafted ones, exactly as plain decoding would have processed that position:
every method keeps plain decoding's output under the same processing.

The order is llama-cpp-python's: the bias is added first, then the
penalties (``llama_sampler_penalties``: over the last ``repeat_last_n``
generated tokens, a token seen ``c`` times has its logit divided by the
repeat penalty when positive, multiplied when not, then lowered by
``c * frequency + presence``); the engine applies a grammar's mask after
them, and the sampling filters last.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from ..errors import TokenIdError
from ..options import GenerationOptions
from ..runtime.vocabulary import Tokens


@dataclass(frozen=True)
class Processing:
    """The logit processing of one generation (see ``GenerationOptions`` for the values' bounds).

    Attributes:
        bias: (token id, value) pairs added to those tokens' logits.
        repeat: llama.cpp's repeat penalty (1: off).
        frequency: subtracted once per earlier occurrence (0: off).
        presence: subtracted once if the token occurred at all (0: off).
        last_n: how many of the latest generated tokens the penalties look at.
    """

    bias: tuple[tuple[int, float], ...] = ()
    repeat: float = 1.0
    frequency: float = 0.0
    presence: float = 0.0
    last_n: int = 64
    _ids: np.ndarray = field(init=False, repr=False, compare=False)
    _values: np.ndarray = field(init=False, repr=False, compare=False)

    @classmethod
    def from_options(cls, opts: GenerationOptions, n_vocab: int) -> Optional[Processing]:
        """The processing ``opts`` asks for, checked against a vocabulary of ``n_vocab`` tokens (None: none).

        Raises:
            TokenIdError: a biased token id is not in the vocabulary.
        """
        for token, _ in opts.logit_bias:
            if not 0 <= token < n_vocab:
                raise TokenIdError(f"logit_bias names token id {token}, outside this model's vocabulary of "
                                   f"{n_vocab} tokens (ids 0 to {n_vocab - 1}).")
        p = cls(opts.logit_bias, opts.repeat_penalty, opts.frequency_penalty, opts.presence_penalty,
                opts.repeat_last_n)
        return p if p.bias or p.penalizes else None

    @property
    def penalizes(self) -> bool:
        """Whether any penalty is on (llama.cpp skips them all otherwise)."""
        return self.last_n > 0 and (self.repeat != 1.0 or self.frequency != 0.0 or self.presence != 0.0)

    def __post_init__(self) -> None:
        ids, values = zip(*self.bias, strict=True) if self.bias else ((), ())
        # the bias as arrays, made once: distinct ids, so one vectorised add per row (or per round)
        object.__setattr__(self, "_ids", np.asarray(ids, dtype=np.int64))
        object.__setattr__(self, "_values", np.asarray(values, dtype=np.float32))

    def row(self, logits: np.ndarray, generated: Tokens) -> np.ndarray:
        """One logits row processed, for the position after ``generated`` (a new float32 array)."""
        out = np.array(logits, dtype=np.float32, copy=True)
        if self.bias:
            out[self._ids] += self._values
        if self.penalizes:
            recent = np.asarray(generated[-self.last_n:] if len(generated) else [], dtype=np.int64)
            if recent.size:
                ids, counts = np.unique(recent, return_counts=True)
                x = out[ids]
                x = np.where(x <= 0, x * self.repeat, x / self.repeat)
                out[ids] = x - (counts * self.frequency + self.presence).astype(np.float32)
        return out

    def rows(self, logits: np.ndarray, generated: Tokens, draft: Sequence[int]) -> np.ndarray:
        """Verification rows processed: row i for the position after ``generated`` and ``draft[:i]``."""
        if not self.penalizes:  # the bias alone: the same for every row, added to all of them at once
            out = np.array(logits, dtype=np.float32, copy=True)
            out[:, self._ids] += self._values
            return out
        # only the window's tail of what was generated matters: no copy of a long output per round
        tail = np.asarray(generated[-self.last_n:] if self.penalizes and len(generated) else [], dtype=np.int64)
        history = np.concatenate([tail, np.asarray(draft, dtype=np.int64)])
        return np.stack([self.row(logits[i], history[: len(tail) + i]) for i in range(len(logits))])
