"""A target model's history on disk: the file format, its lock, CRCs, compaction and set-aside copies.

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
"""

from __future__ import annotations

import hashlib
import os
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple, Optional, Sequence

import numpy as np

from ...errors import ConfigError
from ...paths import home
from .index import HistoryIndex

#: Format of the store file; another version is set aside and started afresh.
FORMAT_VERSION = 1
_MAGIC = b"LSHIST"
_HEADER = struct.Struct("<6sHH")  # magic, version, length of the model name that follows
_TAG = b"REC1"
_HEAD = struct.Struct("<4sIIII")  # tag, tokens, history-drafted, history-accepted, reserved: what the CRC covers
_RECORD = struct.Struct(_HEAD.format + "I")  # the head, then its crc32 (of the head and the token ids)
#: Default bound of a store: about 8 MB on disk and 40 MB of index in memory.
DEFAULT_LIMIT_TOKENS = 2_000_000
#: Prompt tokens kept per record (the newest ones; the rest was usually recorded before).
PROMPT_KEEP = 4096


class Record(NamedTuple):
    """One recorded generation: its token ids, and how many tokens history drafted and the target accepted."""

    tokens: np.ndarray
    drafted: int
    accepted: int


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
    def of(cls, records: Sequence[Record], size: int) -> HistoryCounts:
        """The counts of ``records`` in a file of ``size`` bytes."""
        return cls(len(records), sum(len(r.tokens) for r in records), size,
                   sum(r.drafted for r in records), sum(r.accepted for r in records))


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


def _record_bytes(rec: Record) -> bytes:
    payload = np.asarray(rec.tokens, dtype="<i4").tobytes()
    head = _HEAD.pack(_TAG, len(rec.tokens), rec.drafted, rec.accepted, 0)
    return head + struct.pack("<I", zlib.crc32(head + payload)) + payload


def _parse(data: bytes, offset: int) -> tuple[list[Record], int, bool]:
    """Records from ``offset``, where parsing stopped, and whether all was valid."""
    out: list[Record] = []
    while offset < len(data):
        if len(data) - offset < _RECORD.size:
            return out, offset, False
        tag, n, drafted, accepted, reserved, crc = _RECORD.unpack_from(data, offset)
        end = offset + _RECORD.size + 4 * n
        if tag != _TAG or end > len(data):
            return out, offset, False
        payload = data[offset + _RECORD.size : end]
        if zlib.crc32(data[offset : offset + _HEAD.size] + payload) != crc:
            return out, offset, False
        out.append(Record(np.frombuffer(payload, dtype="<i4").astype(np.int32), drafted, accepted))
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
        self._records: list[Record] = []
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

    def _rewrite(self, records: list[Record]) -> None:
        """Write the newest records within 3/4 of the limit to a new file, atomically."""
        kept: list[Record] = []
        total = 0
        for rec in reversed(records):
            if total + len(rec.tokens) > (3 * self.limit_tokens) // 4 and kept:
                break
            kept.append(rec)
            total += len(rec.tokens)
        kept.reverse()
        blob = self._header() + b"".join(_record_bytes(rec) for rec in kept)
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, self.path)
        self.index, self._records = HistoryIndex(), []
        self._offset = len(blob)
        self._inode = os.stat(self.path).st_ino
        self._take(kept)

    def _take(self, records: list[Record]) -> None:
        self.index.extend([rec.tokens for rec in records])
        self._records += records

    def _tokens(self) -> int:
        return sum(len(r.tokens) for r in self._records)

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
                rec = Record(arr, drafted, accepted)
                data = _record_bytes(rec)
                with open(self.path, "ab") as f:
                    f.write(data)
                self._offset += len(data)
                self.index.add(arr)
                self._records.append(rec)
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
