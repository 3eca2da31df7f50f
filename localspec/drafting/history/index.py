"""The in-memory index of a history store: records concatenated, with sorted window hashes.

A lookup is a binary search plus a few vectorised comparisons over at most
``MAX_CANDIDATES`` occurrences (well under a millisecond); an append merges
the new record's hashes into the sorted arrays.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

#: Window lengths indexed; a match is extended beyond them by direct comparison.
WINDOWS = (4, 2)
#: Longest suffix match measured, and most occurrences considered per lookup (the newest).
MAX_MATCH = 32
MAX_CANDIDATES = 512
#: A continuation is proposed while at least this share of the matched occurrences agree on it.
MIN_AGREEMENT = 0.5
_MUL = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x27D4EB2F165667C5],
                dtype=np.uint64)


def _hashes(tokens: np.ndarray, n: int) -> np.ndarray:
    """uint32 hash of each n-token window ending at positions n-1..len-1 (windows with a -1 get 0)."""
    m = len(tokens) - n + 1
    if m <= 0:
        return np.zeros(0, dtype=np.uint32)
    t = tokens.astype(np.int64).view(np.uint64)
    h = np.zeros(m, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(n):
            h = h * np.uint64(0x100000001B3) + t[j : j + m] * _MUL[j]
    folded = ((h >> np.uint64(32)) ^ h).astype(np.uint32)
    folded[folded == 0] = 1  # 0 marks windows that cross a separator
    bad = np.zeros(m, dtype=bool)
    neg = tokens < 0
    for j in range(n):
        bad |= neg[j : j + m]
    folded[bad] = 0
    return folded


class HistoryIndex:
    """Records concatenated, with sorted window hashes for suffix matching (in memory only)."""

    def __init__(self) -> None:
        self._corpus = np.full(1, -1, dtype=np.int32)  # starts with a separator: index 0 never matches
        self._size = 1
        # each window's sorted hashes and their end positions, replaced as one pair: a generation matching on
        # another thread never pairs one's new keys with the other's old positions
        self._windows = {n: (np.zeros(0, dtype=np.uint32), np.zeros(0, dtype=np.int32)) for n in WINDOWS}

    @property
    def corpus(self) -> np.ndarray:
        return self._corpus[: self._size]

    def add(self, tokens: np.ndarray) -> None:
        """Append one record and index its windows."""
        tokens = np.asarray(tokens, dtype=np.int32)
        if len(tokens) == 0:
            return
        start = self._size
        need = start + len(tokens) + 1
        if need > len(self._corpus):
            grown = np.full(max(need, 2 * len(self._corpus)), -1, dtype=np.int32)
            grown[: self._size] = self._corpus[: self._size]
            self._corpus = grown
        self._corpus[start : start + len(tokens)] = tokens
        self._corpus[start + len(tokens)] = -1
        self._size = need
        for n in WINDOWS:
            h = _hashes(tokens, n)
            ok = np.flatnonzero(h)
            if ok.size == 0:
                continue
            keys = h[ok]
            pos = (ok + start + n - 1).astype(np.int32)  # position of each window's last token
            order = np.argsort(keys, kind="stable")
            keys, pos = keys[order], pos[order]
            # New positions are the largest, so inserting after equal keys keeps each key's
            # occurrences in position order (newest last).
            old_keys, old_pos = self._windows[n]
            at = np.searchsorted(old_keys, keys, side="right")
            self._windows[n] = (np.insert(old_keys, at, keys), np.insert(old_pos, at, pos))

    def extend(self, records: Sequence[np.ndarray]) -> None:
        """Append many records at once: one sort per window instead of one merge per record."""
        records = [np.asarray(r, dtype=np.int32) for r in records if len(r)]
        if len(records) <= 1:
            for r in records:
                self.add(r)
            return
        parts = [self.corpus] + [x for r in records for x in (r, np.full(1, -1, dtype=np.int32))]
        corpus = np.concatenate(parts)
        self._corpus, self._size = corpus, len(corpus)
        for n in WINDOWS:
            h = _hashes(corpus, n)
            ok = np.flatnonzero(h)
            order = np.argsort(h[ok], kind="stable")  # positions ascend within each key: newest last
            self._windows[n] = (h[ok][order], (ok[order] + n - 1).astype(np.int32))

    def match(self, context: np.ndarray) -> tuple[int, np.ndarray]:
        """The longest suffix of ``context`` found here: (its length, end positions of its newest occurrences).

        Length 0 (and no positions) when not even the last two tokens occurred.
        """
        corpus = self.corpus
        for n in WINDOWS:
            keys, positions = self._windows[n]
            if len(context) < n or keys.size == 0:
                continue
            key = _hashes(np.asarray(context[-n:], dtype=np.int32), n)[0]
            lo = int(np.searchsorted(keys, key, side="left"))
            hi = int(np.searchsorted(keys, key, side="right"))
            cand = positions[max(lo, hi - MAX_CANDIDATES) : hi]
            cand = cand[cand < len(corpus)]  # a record added since ``corpus`` was read is not in it
            if not cand.size:
                continue
            # Match length of each occurrence: how many tokens, going back from its end, equal
            # the context's last tokens (a hash collision gives fewer than n and is dropped).
            w = min(MAX_MATCH, len(context))
            back = np.arange(w)
            idx = cand[:, None] - back[None, :]
            np.maximum(idx, 0, out=idx)  # index 0 is a separator, which never equals a token
            eq = corpus[idx] == context[len(context) - 1 - back][None, :]
            lengths = np.cumprod(eq, axis=1).sum(axis=1)
            best = int(lengths.max())
            if best >= n:
                return best, cand[lengths == best]
        return 0, np.zeros(0, dtype=np.int32)

    def continuation(self, ends: np.ndarray, k: int) -> tuple[list[int], list[float]]:
        """The most frequent continuation after the occurrences ending at ``ends``.

        Token by token: the next token most of the (still agreeing) occurrences
        have, while at least ``MIN_AGREEMENT`` of them agree; ties go to the
        newest occurrence's choice. Returns the tokens and each one's agreement.
        """
        corpus = self.corpus
        tokens: list[int] = []
        agreement: list[float] = []
        pos = ends
        while len(tokens) < k and pos.size:
            nxt = corpus[pos + 1]
            if pos.size == 1:  # one occurrence: copy what followed it, up to its record's end
                run = corpus[int(pos[0]) + 1 : int(pos[0]) + 1 + k - len(tokens)]
                stop = np.flatnonzero(run < 0)
                run = run[: stop[0]] if stop.size else run
                tokens += [int(t) for t in run]
                agreement += [1.0] * len(run)
                break
            values, counts = np.unique(nxt[nxt >= 0], return_counts=True)
            if values.size == 0:
                break
            top = counts.max()
            if top < MIN_AGREEMENT * pos.size:
                break
            tied = values[counts == top]
            choice = int(tied[0]) if tied.size == 1 else int(nxt[np.isin(nxt, tied)][-1])  # newest among ties
            tokens.append(choice)
            agreement.append(float(top) / pos.size)
            pos = pos[nxt == choice] + 1
        return tokens, agreement
