"""Sampling and speculative acceptance over logits, in pure numpy.

This module knows nothing about llama.cpp. It turns logits rows into
probabilities (temperature, top-k, top-p, min-p) and decides how many drafted
tokens to keep:

* Greedy: keep drafted tokens while each equals the target's argmax at its
  position; the token after the kept prefix is the target's own argmax there.
* Sampled (Leviathan et al. 2023, Chen et al. 2023): with target probabilities
  p and draft probabilities q at a position, keep the drafted token x with
  probability min(1, p(x) / q(x)); on the first rejection draw the next token
  from norm(max(0, p - q)); if every drafted token is kept, draw a bonus token
  from the target's row after the last one. The tokens that come out are
  distributed exactly as if sampled from p one at a time. A draft that was
  not sampled (prompt lookup, a greedy draft model) has one-hot q, so x is
  kept with probability p(x) and the residual is p with x removed.
"""

from __future__ import annotations

from typing import Optional, Protocol, Sequence, Union

import numpy as np

from .options import SamplingParams

# Nucleus search first sorts only this many of the largest probabilities and
# falls back to a full sort when they do not reach top_p.
_NUCLEUS_CANDIDATES = 1024


def probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Turn one logits row (or a 2-D array of rows) into sampling probabilities.

    llama.cpp's order: top-k, top-p and min-p choose the candidates from the
    untempered distribution, then the temperature shapes the distribution
    over the candidates left. Greedy parameters give a one-hot row at the argmax.

    Args:
        logits: shape (vocab,) or (rows, vocab).
        params: the sampling parameters.

    Returns:
        float64 probabilities with the shape of ``logits``, each row summing to 1.
    """
    x = np.asarray(logits, dtype=np.float64)
    if x.ndim == 2:
        return np.stack([probabilities(row, params) for row in x]) if len(x) else x.copy()
    if params.greedy:
        p = np.zeros_like(x)
        p[int(np.argmax(x))] = 1.0
        return p
    z = x - x.max()
    out = np.exp(z / params.temperature)
    if params.top_k == 0 and params.top_p >= 1.0 and params.min_p == 0:
        return out / out.sum()  # no filter: the tempered softmax
    p = np.exp(z) if params.temperature != 1.0 else out.copy()
    p /= p.sum()
    n = p.shape[0]
    if 0 < params.top_k < n:
        kth = np.partition(p, n - params.top_k)[n - params.top_k]
        p[p < kth] = 0.0
        p /= p.sum()
    if params.top_p < 1.0:
        p[p < _nucleus_threshold(p, params.top_p)] = 0.0
    if params.min_p > 0:
        p[p < params.min_p * p.max()] = 0.0
    out[p == 0.0] = 0.0  # the temperature applies to the candidates left
    return out / out.sum()


def _nucleus_threshold(p: np.ndarray, top_p: float) -> float:
    """Smallest probability still inside the top-p nucleus of ``p``."""
    n = p.shape[0]
    m = min(n, _NUCLEUS_CANDIDATES)
    cand = p[np.argpartition(p, n - m)[n - m:]] if m < n else p
    cand = np.sort(cand)[::-1]
    csum = np.cumsum(cand)
    if csum[-1] < top_p and m < n:  # the nucleus is wider than the candidates
        cand = np.sort(p)[::-1]
        csum = np.cumsum(cand)
    cut = min(int(np.searchsorted(csum, top_p)), cand.shape[0] - 1)
    return float(cand[cut])


class Rows(Protocol):
    """Indexable rows of probabilities (an array, a list of rows, or ProbRows)."""

    def __getitem__(self, i: int) -> np.ndarray: ...

    def __len__(self) -> int: ...


class ProbRows:
    """Rows of target probabilities computed only when first read.

    Sampled acceptance usually stops before the last row; a 150k-token
    softmax per row is worth skipping.
    """

    def __init__(self, logits: np.ndarray, params: SamplingParams):
        self._logits = logits
        self._params = params
        self._rows: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._logits)

    def __getitem__(self, i: int) -> np.ndarray:
        if i not in self._rows:
            self._rows[i] = probabilities(self._logits[i], self._params)
        return self._rows[i]


def token_logprobs(logits: np.ndarray, token: int, top: int) -> tuple[float, tuple[tuple[int, float], ...]]:
    """The log-probability of ``token`` under the softmax of one (processed) logits row, and the ``top``
    likeliest tokens with theirs, likeliest first; tokens the grammar masked (probability 0) are left out."""
    x = np.asarray(logits, dtype=np.float64)
    m = x.max()
    lse = m + np.log(np.exp(x - m).sum())
    best: tuple[tuple[int, float], ...] = ()
    if top > 0:
        idx = np.argpartition(x, -top)[-top:] if top < x.shape[0] else np.arange(x.shape[0])
        idx = idx[np.lexsort((idx, -x[idx]))]  # likeliest first; equal logits by id
        best = tuple((int(i), float(x[i] - lse)) for i in idx if np.isfinite(x[i]))
    return float(x[token] - lse), best


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one index from non-negative weights ``p`` (need not sum to 1)."""
    cdf = np.cumsum(p)
    # side="right" never lands on a zero-weight index.
    i = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return min(i, p.shape[0] - 1)


def choose(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> tuple[int, Optional[np.ndarray]]:
    """One token from a logits row: the argmax for greedy parameters (one-hot q: None), else a sample and the
    distribution q it was drawn from."""
    if params.greedy:
        return int(np.argmax(logits)), None
    q = probabilities(logits, params)
    return sample(q, rng), q


def accept_greedy(draft: Sequence[int], target_logits: np.ndarray) -> tuple[int, int]:
    """Greedy acceptance.

    Args:
        draft: the K drafted token ids.
        target_logits: K + 1 rows; row i is the target's logits after the
            context plus the first i drafted tokens.

    Returns:
        (number of drafted tokens kept, the target's next token after them).
    """
    # Row by row, stopping at the first disagreement: each row is a 150k-wide
    # argmax, and numpy's per-row argmax is much faster than axis=-1 on 2-D.
    for n, x in enumerate(draft):
        best = int(np.argmax(target_logits[n]))
        if best != x:
            return n, best
    return len(draft), int(np.argmax(target_logits[len(draft)]))


def residual(p: np.ndarray, q: Optional[np.ndarray], x: int) -> np.ndarray:
    """Weights to resample from after drafted token ``x`` was rejected.

    norm(max(0, p - q)) for a sampled draft; for a one-hot draft (q is None)
    that is p with x removed. Falls back to p when rounding leaves no mass.
    """
    if q is None:
        r = p.copy()
        if x < r.shape[0]:
            r[x] = 0.0
    else:
        r = np.maximum(p - _aligned(q, p.shape[0]), 0.0)
    return r if r.sum() > 0 else p


def accept_sampled(
    draft: Sequence[int],
    draft_probs: Optional[np.ndarray],
    target_probs: Union[Rows, np.ndarray],
    rng: np.random.Generator,
) -> tuple[int, int]:
    """Speculative sampling acceptance (the rule in the module docstring).

    Args:
        draft: the K drafted token ids.
        draft_probs: K rows of draft probabilities q, or None for a one-hot
            draft (prompt lookup or a greedy draft model).
        target_probs: K + 1 rows of target probabilities p (already filtered
            by the sampling parameters); may be a lazy ``ProbRows``.
        rng: the generator all randomness comes from.

    Returns:
        (number of drafted tokens kept, the next token: correction or bonus).
    """
    for i, x in enumerate(draft):
        p = target_probs[i]
        px = float(p[x]) if x < p.shape[0] else 0.0
        qx = 1.0 if draft_probs is None else float(draft_probs[i][x])
        # Keep x with probability min(1, p(x)/q(x)), written without dividing.
        if rng.random() * qx < px:
            continue
        q = None if draft_probs is None else draft_probs[i]
        return i, sample(residual(p, q, x), rng)
    return len(draft), sample(target_probs[len(draft)], rng)


def _aligned(q: np.ndarray, n: int) -> np.ndarray:
    """``q`` cut or zero-padded to length n (draft vocab padded differently)."""
    if q.shape[0] == n:
        return q
    if q.shape[0] > n:
        return q[:n]
    return np.concatenate([q, np.zeros(n - q.shape[0], dtype=q.dtype)])
