"""What the prompt cache holds: its entries, found by serial and by prefix, and the counts of what it did."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from .files import State
from .index import PrefixIndex


@dataclass
class Entry:
    """One model's saved state after ``tokens``.

    Attributes:
        identity: the model's ``state_identity``.
        tokens: the prefix the state holds.
        size: bytes of the state.
        data: the state, while it is in RAM (None: only on disk).
        file: its disk file, once written (None: RAM only).
        hits: times it was restored.
        used: when it was saved or last restored (``time.monotonic``).
    """

    identity: str
    tokens: np.ndarray
    size: int
    data: Optional[State] = None
    file: Optional[Path] = None
    hits: int = 0
    used: float = field(default_factory=time.monotonic)
    serial: int = 0
    queued: bool = False  # waiting for the disk writer, which holds the state meanwhile (counted in RAM)
    removed: bool = False  # dropped from the cache: the writer must not bring it back
    refusals: int = 0  # times in a row llama.cpp refused it in a context shared with other sequences


@dataclass
class CacheStats:
    """What the cache has done since it was opened."""

    saves: int = 0
    restores: int = 0
    restored_tokens: int = 0
    disk_reads: int = 0
    disk_writes: int = 0
    rejected_files: int = 0
    save_seconds: float = 0.0
    restore_seconds: float = 0.0
    saved_bytes: int = 0
    restored_bytes: int = 0
    read_seconds: float = 0.0
    read_bytes: int = 0


class EntryTable:
    """Every entry the cache knows, by serial, and each model's by the token blocks of its prefix.

    It takes no lock: its callers hold the cache's.
    """

    def __init__(self) -> None:
        self._entries: dict[int, Entry] = {}
        self._indexes: dict[str, PrefixIndex] = {}
        self._serials = itertools.count(1)

    def __len__(self) -> int:
        return len(self._entries)

    def new_serial(self) -> int:
        """A serial no entry has had."""
        return next(self._serials)

    def all(self) -> list[Entry]:
        """Every entry, in the order they were added."""
        return list(self._entries.values())

    def candidates(self, identity: str, tokens: np.ndarray) -> list[Entry]:
        """The entries of model ``identity`` that may share the most with ``tokens`` (see ``PrefixIndex``)."""
        index = self._indexes.get(identity)
        if index is None:
            return []
        return [self._entries[serial] for serial in index.candidates(tokens)]

    def add(self, entry: Entry) -> None:
        """Know ``entry`` by its serial and its prefix."""
        self._entries[entry.serial] = entry
        self._indexes.setdefault(entry.identity, PrefixIndex()).add(entry.serial, entry.tokens)

    def remove(self, entry: Entry) -> None:
        """Drop ``entry`` and its state in RAM; it is marked removed, so a pending disk write leaves no entry."""
        entry.removed = True
        entry.data = None
        if self._entries.pop(entry.serial, None) is not None:
            index = self._indexes.get(entry.identity)
            if index is not None:
                index.remove(entry.serial, entry.tokens)
