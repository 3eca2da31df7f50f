"""What this machine generated before, as a drafter: a per-model history store and its index.

After each generation the prompt's new part and the generated tokens are
appended to a store kept for that target model (keyed by the model file's
content, so two different models never share one). ``HistoryDrafter`` then
finds the longest suffix of the current context that occurred in the store
and proposes the most frequent continuation, token by token, while a
majority of the matched occurrences agree.

Layout (``home()/history``, readable by the user only):

* ``<model id>.bin``: a header, then one record per generation: its token
  ids and a few counts (history-drafted and accepted tokens), each record
  checked by a CRC. Records are appended under a file lock
  (``<model id>.lock``); when the store outgrows its limit it is rewritten,
  newest records first, through a temporary file and an atomic rename.
* A store that fails its checks (a torn write, a foreign file) is set aside
  as ``<name>.corrupt-<time>``, with a one-line warning, and rebuilt from
  the records that passed; one from another format version is set aside
  and started afresh.

The index lives in memory: all records concatenated (separated by -1) and,
for 2- and 4-token windows, hashes sorted with their end positions. A lookup
is a binary search plus a few vectorised comparisons over at most
``MAX_CANDIDATES`` occurrences (well under a millisecond); an append merges
the new record's hashes into the sorted arrays.
"""

from __future__ import annotations

import hashlib
import os
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import numpy as np

from .drafters import EMPTY_DRAFT, Draft
from .errors import ConfigError
from .paths import home

if TYPE_CHECKING:
    from .backend import Model

#: Format of the store file; another version is set aside and started afresh.
FORMAT_VERSION = 1
_MAGIC = b"LSHIST"
_HEADER = struct.Struct("<6sHH")  # magic, version, length of the model name that follows
_RECORD = struct.Struct("<4sIIIII")  # tag, tokens, history-drafted, history-accepted, reserved, crc32
_TAG = b"REC1"
#: Default bound of a store: about 8 MB on disk and 40 MB of index in memory.
DEFAULT_LIMIT_TOKENS = 2_000_000
#: Prompt tokens kept per record (the newest ones; the rest was usually recorded before).
PROMPT_KEEP = 4096
#: Window lengths indexed; a match is extended beyond them by direct comparison.
WINDOWS = (4, 2)
#: Longest suffix match measured, and most occurrences considered per lookup (the newest).
MAX_MATCH = 32
MAX_CANDIDATES = 512
#: A continuation is proposed while at least this share of the matched occurrences agree on it.
MIN_AGREEMENT = 0.5
_MUL = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x27D4EB2F165667C5],
                dtype=np.uint64)


def model_id(path: Path) -> str:
    """A short identity of a model file's content: its size and its first and last MiB hashed.

    Cheap (2 MiB read) and independent of where the file lives, so a moved or
    re-downloaded copy keeps its history and a different model never shares it.
    """
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        h.update(f.read(1 << 20))
    return h.hexdigest()[:20]


def history_dir() -> Path:
    """Where the stores live (inside the localspec data directory)."""
    return home() / "history"


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
        self._keys = {n: np.zeros(0, dtype=np.uint32) for n in WINDOWS}
        self._pos = {n: np.zeros(0, dtype=np.int32) for n in WINDOWS}

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
            at = np.searchsorted(self._keys[n], keys, side="right")
            self._keys[n] = np.insert(self._keys[n], at, keys)
            self._pos[n] = np.insert(self._pos[n], at, pos)

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
            self._keys[n] = h[ok][order]
            self._pos[n] = (ok[order] + n - 1).astype(np.int32)

    def match(self, context: np.ndarray) -> tuple[int, np.ndarray]:
        """The longest suffix of ``context`` found here: (its length, end positions of its newest occurrences).

        Length 0 (and no positions) when not even the last two tokens occurred.
        """
        corpus = self.corpus
        for n in WINDOWS:
            if len(context) < n or self._keys[n].size == 0:
                continue
            key = _hashes(np.asarray(context[-n:], dtype=np.int32), n)[0]
            lo = int(np.searchsorted(self._keys[n], key, side="left"))
            hi = int(np.searchsorted(self._keys[n], key, side="right"))
            if hi <= lo:
                continue
            cand = self._pos[n][max(lo, hi - MAX_CANDIDATES) : hi]
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


@dataclass
class HistoryCounts:
    """What a store holds and how well it guessed (over the records it still holds)."""

    records: int = 0
    tokens: int = 0
    bytes: int = 0
    drafted: int = 0
    accepted: int = 0

    @property
    def hit_rate(self) -> float:
        """History-drafted tokens the target accepted, over those drafted."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @classmethod
    def of(cls, records: Sequence[tuple[np.ndarray, int, int]], size: int) -> HistoryCounts:
        """The counts of ``records`` (tokens, drafted, accepted) in a file of ``size`` bytes."""
        return cls(len(records), sum(len(r[0]) for r in records), size,
                   sum(r[1] for r in records), sum(r[2] for r in records))


def _read_header(data: bytes) -> Optional[tuple[int, str, int]]:
    """(format version, model file name, offset of the first record), or None if ``data`` is no store."""
    if len(data) < _HEADER.size or data[:6] != _MAGIC:
        return None
    _, version, name_len = _HEADER.unpack_from(data, 0)
    name = data[_HEADER.size : _HEADER.size + name_len].decode("utf-8", "replace")
    return version, name, _HEADER.size + name_len


def _lock_path(store: Path) -> Path:
    """The lock file of a store (or of one of its set-aside copies)."""
    return store.with_name(store.name.split(".bin")[0] + ".lock")


def _record_bytes(tokens: np.ndarray, drafted: int, accepted: int) -> bytes:
    payload = np.asarray(tokens, dtype="<i4").tobytes()
    head = struct.pack("<4sIIII", _TAG, len(tokens), drafted, accepted, 0)
    return _RECORD.pack(_TAG, len(tokens), drafted, accepted, 0, zlib.crc32(head + payload)) + payload


def _parse(data: bytes, offset: int) -> tuple[list[tuple[np.ndarray, int, int]], int, bool]:
    """Records from ``offset``: (tokens, drafted, accepted) each, where parsing stopped, and whether all was valid."""
    out: list[tuple[np.ndarray, int, int]] = []
    while offset < len(data):
        if len(data) - offset < _RECORD.size:
            return out, offset, False
        tag, n, drafted, accepted, reserved, crc = _RECORD.unpack_from(data, offset)
        end = offset + _RECORD.size + 4 * n
        if tag != _TAG or end > len(data):
            return out, offset, False
        payload = data[offset + _RECORD.size : end]
        if zlib.crc32(struct.pack("<4sIIII", tag, n, drafted, accepted, reserved) + payload) != crc:
            return out, offset, False
        out.append((np.frombuffer(payload, dtype="<i4").astype(np.int32), drafted, accepted))
        offset = end
    return out, offset, True


class HistoryStore:
    """One target model's history: the file, its lock, and the in-memory index.

    Args:
        model_path: the target model file (its content decides which store).
        directory: where stores live (default: ``history_dir()``).
        limit_tokens: most tokens kept; the oldest records go first.
        warn: where one-line warnings go (a set-aside store, a busy lock).
    """

    def __init__(self, model_path: Path, directory: Optional[Path] = None,
                 limit_tokens: int = DEFAULT_LIMIT_TOKENS, warn: Optional[Callable[[str], None]] = None):
        from filelock import FileLock

        if limit_tokens < 1:
            raise ConfigError(f"The history limit must be at least 1 token, got {limit_tokens}.")
        self.model_name = Path(model_path).name
        self.directory = Path(directory) if directory is not None else history_dir()
        self.path = self.directory / f"{model_id(Path(model_path))}.bin"
        self.limit_tokens = limit_tokens
        self.warn = warn or (lambda message: None)
        self.index = HistoryIndex()
        self._records: list[tuple[np.ndarray, int, int]] = []
        self._offset = 0  # bytes of the file already read into the index
        self._inode: Optional[int] = None
        #: How long the last ``add`` took (lock, file append and index merge), for the bench.
        self.last_add_seconds = 0.0
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        self._lock = FileLock(str(_lock_path(self.path)), timeout=10, mode=0o600)
        with self._lock:
            self._load()

    # -- file --------------------------------------------------------------------------------------

    def _header(self) -> bytes:
        name = self.model_name.encode("utf-8")[:1000]
        return _HEADER.pack(_MAGIC, FORMAT_VERSION, len(name)) + name

    def _set_aside(self, why: str) -> Path:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(self.path, aside)
        self.warn(f"localspec: the history store {self.path} {why}; it was moved to {aside.name} and rebuilt.")
        return aside

    def _load(self) -> None:
        """Read the whole file (under the lock), setting aside a damaged one."""
        self.index, self._records, self._offset = HistoryIndex(), [], 0
        if not self.path.exists():
            self._rewrite([])
            return
        data = self.path.read_bytes()
        header = _read_header(data)
        if header is None:
            self._set_aside("is not a localspec history file")
            self._rewrite([])
            return
        version, _, first = header
        if version != FORMAT_VERSION:
            self._set_aside(f"has format version {version}, not {FORMAT_VERSION}")
            self._rewrite([])
            return
        records, end, ok = _parse(data, first)
        if not ok:
            self._set_aside(f"is damaged after {len(records)} records (an interrupted write?)")
            self._rewrite(records)
            return
        self._offset = end
        self._inode = os.stat(self.path).st_ino
        self._take(records)
        if self._tokens() > self.limit_tokens:
            self._rewrite(self._records)

    def _rewrite(self, records: list[tuple[np.ndarray, int, int]]) -> None:
        """Write the newest records within 3/4 of the limit to a new file, atomically."""
        kept: list[tuple[np.ndarray, int, int]] = []
        total = 0
        for rec in reversed(records):
            if total + len(rec[0]) > (3 * self.limit_tokens) // 4 and kept:
                break
            kept.append(rec)
            total += len(rec[0])
        kept.reverse()
        blob = self._header() + b"".join(_record_bytes(*rec) for rec in kept)
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, self.path)
        self.index, self._records = HistoryIndex(), []
        self._offset = len(blob)
        self._inode = os.stat(self.path).st_ino
        self._take(kept)

    def _take(self, records: list[tuple[np.ndarray, int, int]]) -> None:
        self.index.extend([rec[0] for rec in records])
        self._records += records

    def _tokens(self) -> int:
        return sum(len(r[0]) for r in self._records)

    @property
    def counts(self) -> HistoryCounts:
        """Records, tokens and bytes held, and history-drafted and accepted tokens in them."""
        return HistoryCounts.of(self._records, self._offset)

    def add(self, tokens: Sequence[int], drafted: int = 0, accepted: int = 0) -> bool:
        """Record one generation (and what history guessed in it). False if the store was busy.

        Records another process appended meanwhile are read in first, so no
        process loses another's records.
        """
        started = time.perf_counter()
        arr = np.asarray(tokens, dtype=np.int32)[-self.limit_tokens :]
        if len(arr) == 0:
            return True
        from filelock import Timeout

        try:
            with self._lock:
                st = os.stat(self.path) if self.path.exists() else None
                if st is None or st.st_ino != self._inode or st.st_size < self._offset:
                    self._load()  # rewritten or removed by another process: start from what is there
                elif st.st_size > self._offset:
                    with open(self.path, "rb") as f:
                        f.seek(self._offset)
                        new, end, ok = _parse(f.read(), 0)
                    if not ok:
                        self._load()
                    else:
                        self._offset += end
                        self._take(new)
                record = _record_bytes(arr, drafted, accepted)
                with open(self.path, "ab") as f:
                    f.write(record)
                self._offset += len(record)
                self.index.add(arr)
                self._records.append((arr, drafted, accepted))
                if self._tokens() > self.limit_tokens:
                    self._rewrite(self._records)
        except Timeout:
            self.warn(f"localspec: the history store {self.path} is locked by another process; "
                      "this generation was not recorded.")
            return False
        finally:
            self.last_add_seconds = time.perf_counter() - started
        return True

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._rewrite([])


def list_stores(directory: Optional[Path] = None) -> list[tuple[Path, str, HistoryCounts]]:
    """Every store in ``directory``: (file, model file name, counts), without loading indexes."""
    directory = Path(directory) if directory is not None else history_dir()
    out = []
    for path in sorted(directory.glob("*.bin")):
        data = path.read_bytes()
        header = _read_header(data)
        if header is None:
            out.append((path, "?", HistoryCounts(bytes=len(data))))
            continue
        version, name, first = header
        records = _parse(data, first)[0] if version == FORMAT_VERSION else []
        out.append((path, name, HistoryCounts.of(records, len(data))))
    return out


def set_aside_copies(directory: Optional[Path] = None) -> list[Path]:
    """The damaged stores set aside in ``directory`` (kept for inspection; ``clear_stores`` deletes them too)."""
    directory = Path(directory) if directory is not None else history_dir()
    return sorted(directory.glob("*.bin.corrupt-*"))


def clear_stores(directory: Optional[Path] = None) -> int:
    """Delete every store (and set-aside copy) in ``directory``; returns how many files went."""
    directory = Path(directory) if directory is not None else history_dir()
    from filelock import FileLock

    removed = 0
    for path in sorted(directory.glob("*.bin*")):
        with FileLock(str(_lock_path(path)), timeout=10):
            path.unlink(missing_ok=True)
        removed += 1
    return removed


class HistoryDrafter:
    """Proposes what followed the longest suffix of the context in earlier generations.

    Args:
        index: the store's index.
        min_match: shortest suffix match that counts.
    """

    name = "history"

    def __init__(self, index: HistoryIndex, min_match: int = 2):
        self.index = index
        self.min_match = min_match
        self.models: tuple[Model, ...] = ()
        #: Length of the suffix match behind the last proposal (0: none).
        self.last_match = 0

    def prefill(self, context: np.ndarray) -> None:
        """Nothing to prepare."""

    def propose(self, context: np.ndarray, k: int, rng: np.random.Generator) -> Draft:
        """Up to ``k`` tokens, fewer where the earlier continuations stop agreeing."""
        self.last_match = 0
        if k <= 0 or len(context) < self.min_match:
            return EMPTY_DRAFT
        length, ends = self.index.match(context)
        if length < self.min_match:
            return EMPTY_DRAFT
        tokens, _ = self.index.continuation(ends, k)
        if not tokens:
            return EMPTY_DRAFT
        self.last_match = length
        return Draft(tokens, None, "history")

    def settle(self, context: np.ndarray) -> None:
        """Nothing to do: recording happens once the generation is over (see ``api``)."""

    def observe(self, drafted: int, kept: int) -> None:
        """Nothing to learn here: auto weighs the guesses."""

    def report(self) -> Optional[dict[str, object]]:
        return None
