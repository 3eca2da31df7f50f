"""Finding a prompt's longest cached prefix: a chain of block hashes, each model's entries indexed by it.

Lookup walks the prompt's blocks of ``BLOCK`` tokens through a chain of hashes (each block's hash covers
every token before it), so finding the longest cached prefix takes time linear in the prompt, whatever the
number of entries.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from ..runtime.model import Model

#: Tokens per hashed block of the lookup chain.
BLOCK = 32


def chain(tokens: np.ndarray) -> Iterable[int]:
    """The hash of each whole block of ``tokens`` together with every block before it, in order."""
    h = 0
    for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
        h = hash((h, tokens[start : start + BLOCK].tobytes()))
        yield h


class PrefixIndex:
    """Entries of one model by their token blocks: ``through[h]`` holds every entry whose tokens begin with
    the blocks chained into ``h``, ``ends[h]`` those whose last whole block that is (0: none whole)."""

    def __init__(self) -> None:
        self.through: dict[int, set[int]] = {}
        self.ends: dict[int, set[int]] = {}

    def add(self, serial: int, tokens: np.ndarray) -> None:
        """Index the entry ``serial``, which holds ``tokens``."""
        last = 0
        for h in chain(tokens):
            self.through.setdefault(h, set()).add(serial)
            last = h
        self.ends.setdefault(last, set()).add(serial)

    def remove(self, serial: int, tokens: np.ndarray) -> None:
        """Forget the entry ``serial``, which holds ``tokens``."""
        last = 0
        for h in chain(tokens):
            self._drop(self.through, h, serial)
            last = h
        self._drop(self.ends, last, serial)

    @staticmethod
    def _drop(table: dict[int, set[int]], h: int, serial: int) -> None:
        held = table.get(h)
        if held is not None:
            held.discard(serial)
            if not held:
                del table[h]

    def candidates(self, tokens: np.ndarray) -> set[int]:
        """Entries that may share the most with ``tokens``: those sharing its deepest indexed block, and every
        entry ending in a block it shares (a whole-prefix entry, which is all a recurrent state can use)."""
        found = set(self.ends.get(0, ()))
        deepest: set[int] = set()
        for h in chain(tokens):
            through = self.through.get(h)
            if not through:
                break
            deepest = through
            found |= self.ends.get(h, set())
        return found | deepest


def usable(model: Model, entry_tokens: np.ndarray, wanted: np.ndarray) -> int:
    """How many of ``wanted`` a restore of an entry holding ``entry_tokens`` gives ``model``: any shared prefix for
    an attention cache (the rest is cut off), only the whole entry for a recurrent state or a sliding window."""
    n = min(len(entry_tokens), len(wanted))
    diff = np.flatnonzero(entry_tokens[:n] != wanted[:n])
    shared = int(diff[0]) if diff.size else n
    if model.cuts_after_load:
        return shared
    return shared if shared == len(entry_tokens) else 0
