"""One generation's grammar state: the token mask, draft validation, rollback and forced tokens.

The running half of ``localspec.constraint``, over llguidance; see there.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

import numpy as np

from ..constraint import Constraint, llguidance
from ..errors import ConfigError


class Matcher:
    """One generation's grammar state over a model's vocabulary.

    Args:
        constraint: what the output must follow.
        tokenizer: the model's llguidance tokenizer (``tokenizer_for``).
        n_vocab: the model's vocabulary size (the mask's width).

    Raises:
        ConfigError: the grammar does not compile (the message says why).
    """

    def __init__(self, constraint: Constraint, tokenizer: Any, n_vocab: int):
        llg = llguidance()
        try:
            grammar = constraint.grammar()
        except (ValueError, RuntimeError) as exc:
            raise ConfigError(f"{constraint.describe(capital=True)} cannot be compiled: {_one_line(exc)}") from None
        error = llg.LLMatcher.validate_grammar(grammar, tokenizer)
        if error:
            raise ConfigError(f"{constraint.describe(capital=True)} cannot be compiled: {_one_line(error)}")
        self._m = llg.LLMatcher(tokenizer, grammar, log_level=0)
        if self._m.is_error():
            raise ConfigError(f"{constraint.describe(capital=True)} cannot be compiled: "
                              f"{_one_line(self._m.get_error())}")
        self.constraint = constraint
        self.n_vocab = n_vocab
        self._eos = int(tokenizer.eos_token)
        self._bits = np.full((n_vocab + 31) // 32, -1, dtype=np.int32)  # llguidance's mask: a bit per token
        self.allowed()  # a grammar that fails at once (an empty language, a loop of references) fails here
        self._probe_forced_start()

    def _probe_forced_start(self) -> None:
        """Follow the tokens the grammar forces from its start (a JSON object's '{'), on a copy, so that a limit
        met there (a row of too many alternatives) fails here, before any work, not at the reply's first token.
        A copy, not a rollback: llguidance cannot roll back some grammars (stop= or max_tokens= lexemes)."""
        probe = self._m.deep_copy()
        forced = [int(t) for t in probe.compute_ff_tokens()[:64]]
        if forced and probe.consume_tokens(forced) and not probe.is_error():
            probe.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)  # the next row's limit too
        if probe.is_error():
            raise ConfigError(f"{self.constraint.describe(capital=True)} cannot be followed: "
                              f"{_one_line(probe.get_error())}")

    def allowed(self) -> np.ndarray:
        """A boolean mask over the vocabulary: the tokens the grammar allows next.

        Raises:
            ConfigError: the grammar is in llguidance's error state (it then allows only the end token,
                which would end the reply early as if it were complete).
        """
        self._m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        if self._m.is_error():
            raise ConfigError(f"{self.constraint.describe(capital=True)} cannot be followed: "
                              f"{_one_line(self._m.get_error())}")
        # as little-endian words (a no-op here), byte b's bit j is token 8b + j
        words = self._bits.astype("<u4", copy=False)
        return np.unpackbits(words.view(np.uint8), bitorder="little")[: self.n_vocab].view(bool)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """A copy of a logits row with every token the grammar rejects next set to -inf.

        A row of another width (a draft model's padded or shorter vocabulary) is masked over the ids the two
        share; its ids past the target's vocabulary are rejected.

        Raises:
            ConfigError: the grammar allows no token at all (it cannot be completed).
        """
        allowed = self.allowed()
        if not allowed.any():
            raise ConfigError(f"{self.constraint.describe(capital=True)} allows no token here "
                              f"({self._m.get_error() or 'nothing can follow'}); check it can be completed.")
        out = np.array(logits, dtype=np.float32, copy=True)
        n = min(len(out), len(allowed))
        out[:n][~allowed[:n]] = -np.inf
        out[n:] = -np.inf
        return out

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of ``tokens`` the grammar accepts in a row from here (nothing is consumed).

        An end token counts where the grammar is complete (llguidance's own check leaves it out).
        """
        n = int(self._m.validate_tokens(tokens)) if tokens else 0
        if n < len(tokens) and tokens[n] == self._eos:
            self.consume(tokens[:n])
            complete = self._m.is_accepting() or self._m.is_stopped()
            self.rollback(n)
            n += complete
        return n

    def forced_tokens(self, k: int) -> list[int]:
        """Up to ``k`` tokens the grammar forces from here (exactly one way on), as a free draft."""
        return [int(t) for t in self._m.compute_ff_tokens()[:k]]

    def consume(self, tokens: list[int]) -> None:
        """Advance past ``tokens`` (each one the grammar allows)."""
        if tokens and not self._m.consume_tokens(tokens):
            # llguidance stops at a resource limit (a row of too many alternatives, a step's fuel) here too
            raise ConfigError(f"{self.constraint.describe(capital=True)} cannot be followed: "
                              f"{_one_line(self._m.get_error() or 'it refused a token it had allowed')}")

    def rollback(self, n: int) -> None:
        """Go back ``n`` consumed tokens (after a rejected guess)."""
        if n > 0 and not self._m.rollback(n):
            raise ConfigError(f"{self.constraint.describe(capital=True)} could not go back {n} tokens: "
                              f"{_one_line(self._m.get_error() or 'llguidance refused')}")

    @property
    def end_token(self) -> int:
        """The token that ends the output where the grammar is complete (never consumed: the reply ends)."""
        return self._eos


def _one_line(error: object) -> str:
    """An engine's error as one line: its own lines (source excerpts and carets dropped) joined."""
    lines = [line.strip() for line in str(error).splitlines()]
    kept = [line for line in lines if line and not set(line) <= {"^", " "} and not line[:1].isdigit()
            and not line.startswith("(") or line.startswith("error:")]
    return "; ".join(dict.fromkeys(kept)) or str(error).strip()


def tokenizer_for(vocab: Any, eos: int) -> Any:
    """llguidance's tokenizer for a llama.cpp vocabulary (costs about a second on a 150k vocabulary: cache it)."""
    llguidance()
    import warnings

    from llguidance.llamacpp import lltokenizer_from_vocab

    with warnings.catch_warnings():  # it reads token attributes through a name llama-cpp-python deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        return lltokenizer_from_vocab(vocab, eos_token=eos)


class TriggeredMatcher:
    """A grammar that holds from a trigger token on; until the model writes that token, any token goes.

    The same five calls as ``Matcher`` (the engine cannot tell them apart). The
    inner matcher is fed the trigger token first, so its grammar starts with it.

    Args:
        inner: the grammar, fresh.
        trigger: the token that starts it.
    """

    def __init__(self, inner: Matcher, trigger: int):
        self._inner = inner
        self._trigger = trigger
        self._n = 0  # tokens consumed in all
        self._at: Optional[int] = None  # how many had been consumed when the trigger came (None: not yet)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """The grammar's mask once triggered; before, the row itself (nothing is masked, so no copy is made:
        the engine copies masked rows into its own array and only reads the first row)."""
        return self._inner.mask(logits) if self._at is not None else logits

    def valid_prefix(self, tokens: list[int]) -> int:
        if self._at is not None:
            return self._inner.valid_prefix(tokens)
        if self._trigger not in tokens:
            return len(tokens)
        free = tokens.index(self._trigger)  # the tokens before it are free; the grammar judges the rest
        return free + self._inner.valid_prefix(tokens[free:])

    def forced_tokens(self, k: int) -> list[int]:
        return self._inner.forced_tokens(k) if self._at is not None else []

    def consume(self, tokens: list[int]) -> None:
        if self._at is None and self._trigger in tokens:
            free = tokens.index(self._trigger)
            self._n += free
            self._at, tokens = self._n, tokens[free:]
        if self._at is not None:
            self._inner.consume(tokens)
        self._n += len(tokens)

    @property
    def end_token(self) -> int:
        return self._inner.end_token

    def rollback(self, n: int) -> None:
        if n <= 0:
            return
        if self._at is not None:
            self._inner.rollback(min(n, self._n - self._at))
            if self._n - n <= self._at:  # back before the trigger: free again
                self._at = None
        self._n -= n


class GrammarState(Protocol):
    """What the engine drives: a grammar that holds throughout (``Matcher``), one from a trigger token on
    (``TriggeredMatcher``), or one that holds only after a reply's reasoning
    (``localspec.reasoning.gate.ReasoningGate``)."""

    def mask(self, logits: np.ndarray) -> np.ndarray: ...

    def valid_prefix(self, tokens: list[int]) -> int: ...

    def forced_tokens(self, k: int) -> list[int]: ...

    def consume(self, tokens: list[int]) -> None: ...

    def rollback(self, n: int) -> None: ...

    @property
    def end_token(self) -> int: ...
