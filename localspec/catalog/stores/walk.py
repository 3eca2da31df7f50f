"""Listing folders for the scan: unreadable ones reported, symlink loops never followed."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Iterator, Optional

from .found import Skipped


class Walker:
    """Directory listing that reports unreadable folders; ``files`` never loops."""

    def __init__(self, skipped: list[Skipped]):
        self.skipped = skipped

    def entries(self, d: Path, seen: Optional[set[tuple[int, int]]] = None) -> list[os.DirEntry[str]]:
        """The entries of ``d`` by name; [] when missing, or (with a Skipped) when it cannot be read.

        Args:
            d: the folder.
            seen: folders already listed in this traversal (by device and inode); ``d`` is added.
        """
        try:
            st = d.stat()
        except FileNotFoundError:
            return []
        except OSError as exc:
            self.skipped.append(Skipped(str(d), f"cannot be read ({why(exc)})."))
            return []
        if not stat.S_ISDIR(st.st_mode):
            return []
        if seen is not None:
            if (st.st_dev, st.st_ino) in seen:
                return []  # a folder symlinked back into the tree
            seen.add((st.st_dev, st.st_ino))
        try:
            with os.scandir(d) as it:
                return sorted(it, key=lambda e: e.name)
        except OSError as exc:
            self.skipped.append(Skipped(str(d), f"cannot be read ({why(exc)}); check its permissions."))
            return []

    def files(self, root: Path, max_depth: int, suffix: str = ".gguf") -> Iterator[Path]:
        """Files ending in ``suffix`` under ``root``, at most ``max_depth`` folders down, hidden ones left out."""
        seen: set[tuple[int, int]] = set()
        stack = [(root, 0)]
        while stack:
            d, depth = stack.pop(0)
            subdirs = []
            for e in self.entries(d, seen):
                if e.name.startswith("."):
                    continue
                if is_dir(e):
                    if depth < max_depth:
                        subdirs.append((Path(e.path), depth + 1))
                elif e.name.lower().endswith(suffix):
                    yield Path(e.path)
            stack[0:0] = subdirs  # depth first, in name order


def is_dir(e: os.DirEntry[str]) -> bool:
    try:
        return e.is_dir()
    except OSError:  # a symlink loop: it is looked at (and reported) as a file
        return False


def why(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "a symlink loop"
    return (exc.strerror or str(exc)).lower()
