"""Is a greedy run exact? Plain decoding's own margins, and the kernels' batch-shape rounding noise."""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ..runtime.model import Model
from ..structured.grammar import GrammarState
from .records import Run

#: A divergence counts as a numeric tie below this top-two logit margin of plain decoding,
#: or below twice the measured batch-shape noise of this build if that is larger.
TIE_MARGIN = 0.05


def margin_at(target: Model, prompt: list[int], plain_tokens: list[int], i: int,
              matcher: Optional[GrammarState] = None) -> float:
    """Plain decoding's own top-two logit margin before token i (prefill, then one token at a time); under a
    constraint, ``matcher`` at the reply's start, the margin between the two best tokens it allows there
    (infinite where it allows one: no tie can explain a divergence from a forced token)."""
    target.reset()
    logits = target.sync(prompt)
    for t in plain_tokens[:i]:
        logits = target.eval([t], logits="last")[0]
    target.reset()
    if matcher is not None:
        matcher.consume(list(plain_tokens[:i]))
        logits = matcher.mask(logits)
        matcher.rollback(i)
    top2 = np.partition(logits, -2)[-2:]
    return float(top2[1] - top2[0]) if np.isfinite(top2[0]) else float("inf")


def batch_noise(target: Model, tokens: list[int], n: int = 8) -> float:
    """Largest logit difference between evaluating n tokens one at a time and as one batch.

    llama.cpp's CPU kernels round differently for different batch shapes (even
    plain decoding's prompt prefill is a batch), so a greedy choice whose top
    two logits are closer than this can go either way.
    """
    head, tail = tokens[:-n], tokens[-n:]
    target.reset()
    target.sync(head)
    single = np.stack([target.eval([t], logits="last")[0].copy() for t in tail])
    target.truncate(len(head))
    batch = target.eval(tail, logits="all").copy()
    target.reset()
    return float(np.abs(single - batch).max())


def classify(plain: list[int], tokens: list[int], margin: Callable[[int], float],
             tie_margin: float = TIE_MARGIN) -> tuple[str, Optional[dict[str, float]]]:
    """Exactness verdict of greedy ``tokens`` against plain decoding's.

    Returns:
        ("identical", None), ("tie", info) when they part where plain's top two
        logits were within ``tie_margin``, or ("MISMATCH", info).
    """
    n = min(len(plain), len(tokens))
    i = next((j for j in range(n) if plain[j] != tokens[j]), None)
    if i is None:
        if len(plain) == len(tokens):
            return "identical", None
        i = n  # one stopped earlier than the other
    m = margin(i)
    info = {"token": float(i), "margin": m}
    return ("tie" if m < tie_margin else "MISMATCH"), info


def worst_verdict(target: Model, prompt_tokens: list[int], ref: list[int], group: list[Run], tie_margin: float,
                  margins: dict[tuple[int, ...], float],
                  matcher: Optional[GrammarState] = None) -> tuple[str, Optional[dict]]:
    """The worst verdict over a method's repetitions against a plain run's tokens (under the constraint of
    ``matcher``, at the reply's start, if there is one).

    ``margins`` remembers plain decoding's margin by prompt and reference prefix: it costs one
    decode step per token, and repetitions, methods and the two references (localspec's and
    llama-cpp-python's plain tokens, usually equal) mostly diverge at the same place.
    """

    def margin(i: int) -> float:
        key = (*prompt_tokens, -1 if matcher is None else -2, *ref[:i])
        if key not in margins:
            margins[key] = margin_at(target, prompt_tokens, ref, i, matcher)
        return margins[key]

    worst: tuple[str, Optional[dict]] = ("identical", None)
    for run in group:
        verdict = classify(ref, run.tokens, margin, tie_margin)
        if verdict[0] == "MISMATCH" or (verdict[0] == "tie" and worst[0] == "identical"):
            worst = verdict
    return worst
