"""Free reasoning, a reasoning budget, then a constrained answer: one generation's grammar state over them.

A ``ReasoningGate`` is driven by the engine like any grammar state (``grammar.Matcher``): it masks logits
rows, judges drafts, forces tokens and rolls back. While the model reasons any token goes. Once the budget is
spent the gate forces the model's own closing tokens one by one (as llama-server's reasoning budget does), so
those tokens are part of the target's sequence, and are free drafts to every method. The answer's grammar,
if there is one, holds from the end of the reasoning on (a lazy start, as llama.cpp's triggered grammars).

Plain decoding runs through the same gate, so every method stays exact under it.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import numpy as np

from ..structured.grammar import GrammarState

_START, _REASONING, _ANSWER = 0, 1, 2


class _State(NamedTuple):
    phase: int
    spent: int = 0  # reasoning tokens the model chose
    force: tuple[int, ...] = ()  # tokens still to be forced, in order
    tail: tuple[int, ...] = ()  # the latest reasoning tokens, to see the model's own close


class ReasoningGate:
    """A reply's reasoning phase, its budget and its answer's grammar, as one grammar state.

    Args:
        inner: the answer's grammar state, fresh (None: the answer is free).
        end_token: the model's end token (the answer's grammar's, where there is one).
        inside: the reply starts inside the reasoning (the template opened it).
        open_token: the token that opens reasoning when a reply starts with it (None: only ``inside`` does).
        ends: token sequences after which the answer begins (the model's own close of its reasoning).
        close: the tokens forced to end the reasoning once the budget is spent.
        separator: tokens forced after the end of the reasoning before a constrained answer.
        budget: the most reasoning tokens the model chooses (None: no limit; 0: it closes at once).
    """

    def __init__(self, inner: Optional[GrammarState], end_token: int, *, inside: bool,
                 open_token: Optional[int], ends: Sequence[Sequence[int]], close: Sequence[int],
                 separator: Sequence[int] = (), budget: Optional[int] = None):
        self._inner = inner
        self._end = inner.end_token if inner is not None else end_token
        self._open = open_token
        self._ends = [tuple(e) for e in ends if e]
        self._close = tuple(close)
        self._separator = tuple(separator) if inner is not None else ()
        self._budget = budget
        self._state = self._reasoning() if inside else _State(_START)
        self._past: list[tuple[_State, bool]] = []  # before each consumed token: the state, and if inner had it

    def _reasoning(self) -> _State:
        return _State(_REASONING, force=self._close if self._budget == 0 else ())

    def _answer(self) -> _State:
        return _State(_ANSWER, force=self._separator)

    def _step(self, s: _State, token: int) -> tuple[_State, bool]:
        """The state after ``token``, and whether the answer's grammar takes it."""
        if s.force:  # only the forced token is allowed here
            rest = s.force[1:]
            if rest or s.phase == _ANSWER:
                return s._replace(force=rest), False
            return self._answer(), False
        if s.phase == _ANSWER:
            return s, self._inner is not None
        if s.phase == _START:
            return (self._reasoning(), False) if token == self._open else (_State(_ANSWER), self._inner is not None)
        tail = (*s.tail, token)[-max((len(e) for e in self._ends), default=1):]
        if any(tail[-len(e):] == e for e in self._ends):
            return self._answer(), False
        spent = s.spent + 1
        spent_all = self._budget is not None and spent >= self._budget
        return _State(_REASONING, spent, self._close if spent_all else (), tail), False

    def _grammar_judges(self, s: _State, token: int) -> bool:
        """Whether the answer's grammar decides ``token`` in state ``s``."""
        return self._inner is not None and not s.force and (s.phase == _ANSWER or s.phase == _START
                                                            and token != self._open)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """The row with what may not come next set to -inf (the row itself where anything may)."""
        s = self._state
        if s.force:
            out = np.full(len(logits), -np.inf, dtype=np.float32)
            if s.force[0] < len(logits):
                out[s.force[0]] = logits[s.force[0]]
            return out
        if self._inner is None or s.phase == _REASONING:
            return logits
        out = self._inner.mask(logits)
        if out is logits:  # the answer's grammar masks nothing yet (a trigger not written): the row is shared
            return logits
        if s.phase == _START and self._open is not None and self._open < len(out):
            out[self._open] = logits[self._open]  # the reply may open its reasoning instead
        return out

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of ``tokens`` may come in a row from here (nothing is consumed)."""
        s = self._state
        for i, token in enumerate(tokens):
            if self._grammar_judges(s, token):
                assert self._inner is not None
                return i + self._inner.valid_prefix(tokens[i:])
            if s.force and token != s.force[0]:
                return i
            s = self._step(s, token)[0]
        return len(tokens)

    def forced_tokens(self, k: int) -> list[int]:
        """Up to ``k`` tokens that must come next: the forced close, or what the answer's grammar forces."""
        s = self._state
        if s.force:
            return list(s.force[:k])
        if s.phase == _ANSWER and self._inner is not None:
            return self._inner.forced_tokens(k)
        return []

    def consume(self, tokens: list[int]) -> None:
        """Advance past ``tokens`` (each one allowed)."""
        for token in tokens:
            state, judged = self._step(self._state, token)
            if judged:
                assert self._inner is not None
                self._inner.consume([token])
            self._past.append((self._state, judged))
            self._state = state

    def rollback(self, n: int) -> None:
        """Go back ``n`` consumed tokens."""
        if n <= 0:
            return
        undone = self._past[-n:]
        del self._past[-n:]
        judged = sum(j for _, j in undone)
        if judged:
            assert self._inner is not None
            self._inner.rollback(judged)
        self._state = undone[0][0]

    @property
    def end_token(self) -> int:
        """The model's end token."""
        return self._end

    @property
    def reasoning(self) -> bool:
        """True while the reply is inside its reasoning (the forced close included)."""
        return self._state.phase == _REASONING
