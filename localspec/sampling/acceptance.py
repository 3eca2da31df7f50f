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

from ..options import SamplingParams

# Nucleus search first sorts only this many of the largest probabilities and
# falls back to a full sort when they do not reach top_p.
_NUCLEUS_CANDIDATES = 1024
# The filters (top-k, top-p, min-p) look first at the tokens within 8 nats of the
# likeliest one (tens to a few thousand of a 150k vocabulary), then within 16, and
# at all of them only when the answer could lie lower still.
_NEAR_NATS = (8.0, 16.0)
# A window holding more than this share of the vocabulary (1/8) is not worth searching apart.
_NEAR_SHARE = 8
# ``sample`` finds the block of this many tokens first, then the token within it.
_SAMPLE_BLOCK = 1024


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
    x = np.asarray(logits)
    if x.ndim == 2:
        return np.stack([probabilities(row, params) for row in x]) if len(x) else x.astype(np.float64)
    if params.greedy:
        p = np.zeros(x.shape[0], dtype=np.float64)
        p[int(np.argmax(x))] = 1.0
        return p
    ids, w = _weights(x, params)
    return w if ids is None else _spread(ids, w, x.shape[0])


def _spread(ids: np.ndarray, w: np.ndarray, n: int) -> np.ndarray:
    """A row of ``n`` probabilities holding ``w`` at ``ids`` and 0 elsewhere."""
    out = np.zeros(n, dtype=np.float64)  # pages never written cost nothing
    out[ids] = w
    return out


def _weights(x: np.ndarray, params: SamplingParams) -> tuple[Optional[np.ndarray], np.ndarray]:
    """One row's sampling probabilities (not greedy): (None, the whole row), or (ids, ascending; their
    probabilities) when the filters' answer lies among a few of the likeliest tokens."""
    top = float(np.max(x))
    filters = params.top_k > 0 or params.top_p < 1.0 or params.min_p > 0
    ids = _window(x, top, params) if filters else None
    z = (x if ids is None else x[ids]).astype(np.float64)
    z -= top
    if filters:
        p = np.exp(z)
        p /= _mass(x, top) if ids is not None else p.sum()  # the whole vocabulary's, either way
        _filter(p, params, x.shape[0])
    z *= 1.0 / params.temperature  # in place: a fresh 150k-row array costs more than the arithmetic
    w = np.exp(z, out=z)
    if filters:
        w[p == 0.0] = 0.0  # the temperature shapes what the filters left
    w /= w.sum()
    return ids, w


def _mass(x: np.ndarray, top: float) -> float:
    """The softmax denominator of a row whose largest logit is ``top``, in one float32 pass (float64 for a
    float64 row: large logits would lose their differences in float32)."""
    e = np.subtract(x, top, dtype=np.float64 if x.dtype == np.float64 else np.float32)
    return float(np.exp(e, out=e).sum(dtype=np.float64))


def _window(x: np.ndarray, top: float, params: SamplingParams) -> Optional[np.ndarray]:
    """The likeliest tokens (ids, ascending), enough of them to hold every token the filters could keep, or
    None for all of them: every token left out is less likely than every token kept, so the top k, the top-p
    nucleus and min-p's survivors lie within them once they number k, hold top_p of the mass, or reach down
    to min-p."""
    k, top_p, min_p = params.top_k, params.top_p, params.min_p
    n = x.shape[0]
    total: Optional[float] = None
    for nats in _NEAR_NATS:
        near = x >= top - nats
        if np.count_nonzero(near) > n // _NEAR_SHARE:  # a flat row: the window would save nothing
            break
        ids = np.flatnonzero(near)
        if not len(ids):  # a NaN at the top: nothing compares; the whole row says what it says
            return None
        if k > 0:
            if len(ids) >= k:
                return ids
            continue
        if top_p < 1.0:
            total = _mass(x, top) if total is None else total
            if np.exp(x[ids].astype(np.float64) - top).sum() >= top_p * total:
                return ids
            continue
        if min_p >= np.exp(-nats):
            return ids
    if 0 < k < n:  # the top k themselves, ties at the k-th kept as top-k keeps them
        return np.flatnonzero(x >= np.partition(x, n - k)[n - k])
    return None


def _filter(p: np.ndarray, params: SamplingParams, n_vocab: int) -> None:
    """Zero, in place, the probabilities top-k, then top-p, then min-p drop (``p``: the likeliest tokens of a
    vocabulary of ``n_vocab``)."""
    n, k = p.shape[0], params.top_k
    if 0 < k < n_vocab:
        if k < n:
            p[p < np.partition(p, n - k)[n - k]] = 0.0
        p /= p.sum()  # top-p and min-p see the top k's own distribution
    if params.top_p < 1.0:
        p[p < _nucleus_threshold(p, params.top_p)] = 0.0
    if params.min_p > 0:
        p[p < params.min_p * p.max()] = 0.0


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
    n = p.shape[0]
    whole = n - n % _SAMPLE_BLOCK
    if not whole:
        return _draw(p, rng.random())
    # One running sum over 150k weights is slow in numpy: the blocks' sums first, then the block's weights.
    sums = p[:whole].reshape(-1, _SAMPLE_BLOCK).sum(axis=1)
    if whole < n:
        sums = np.append(sums, p[whole:].sum())
    if not sums.any():  # no weight anywhere: the last index, as one running sum gives
        return n - 1
    u = rng.random()
    b = _draw(sums, u)
    cdf = np.cumsum(sums)  # the same running sum _draw searched
    # where u falls inside block b, from 0 to 1 (rounding may leave it just outside)
    inner = min(max((u * cdf[-1] - (cdf[b - 1] if b else 0.0)) / sums[b], 0.0), 1.0) if sums[b] > 0 else u
    block = p[b * _SAMPLE_BLOCK: (b + 1) * _SAMPLE_BLOCK]
    return b * _SAMPLE_BLOCK + _draw(block, min(inner, np.nextafter(1.0, 0.0)))


def _draw(w: np.ndarray, u: float) -> int:
    """The index where ``u`` (in [0, 1)) of the weights' total falls; never a zero weight when any is positive."""
    cdf = np.cumsum(w)
    # side="right" never lands on a zero-weight index, except past the end through rounding.
    i = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    if i < w.shape[0]:
        return i
    nonzero = np.flatnonzero(w)
    return int(nonzero[-1]) if nonzero.size else w.shape[0] - 1


def choose(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> tuple[int, Optional[np.ndarray]]:
    """One token from a logits row: the argmax for greedy parameters (one-hot q: None), else a sample and the
    distribution q it was drawn from."""
    if params.greedy:
        return int(np.argmax(logits)), None
    x = np.asarray(logits)
    ids, w = _weights(x, params)
    if ids is None:
        return sample(w, rng), w
    return int(ids[_draw(w, rng.random())]), _spread(ids, w, x.shape[0])  # drawn among the kept: as from q


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
