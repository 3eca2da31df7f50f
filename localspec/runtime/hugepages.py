"""Transparent huge pages for the memory llama.cpp allocates while a model loads (Linux, CPU builds).

Where the kernel's transparent-huge-page mode is ``madvise`` (the default on
Debian and Ubuntu), anonymous memory gets 4 KiB pages unless the program asks
for more, and llama.cpp does not ask. Its CPU buffers (the weights it repacks
for the CPU's matrix kernels, the KV cache, the compute buffers) are such
memory, and decoding reads every weight once per token, so the page-table walks
show in the speed, and without huge pages the speed can depend on the order in
which models were loaded (``benchmarks/results/2026-11-30-huge-pages.md`` gives the figures;
``benchmarks/load_order.py`` measures them).

llama.cpp's allocations cannot be hooked from Python, so ``HugePages`` notes the
anonymous mappings before a load and, afterwards, advises huge pages for the
mappings that are new (pages faulted in from then on are huge) and asks the
kernel to collapse the pages already there into huge pages now
(``MADV_COLLAPSE``, Linux 6.1+; the kernel does it in place, safely while the
memory is in use). An older kernel's khugepaged collapses them in the
background instead, more slowly.
"""

from __future__ import annotations

import ctypes
import re
import sys
from pathlib import Path

HUGE_PAGE = 2 << 20
_PAGE = 4096
_MADV_HUGEPAGE, _MADV_COLLAPSE = 14, 25
_THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")

Ranges = list[tuple[int, int]]


def thp_mode() -> str:
    """The kernel's transparent-huge-page mode (``always``, ``madvise``, ``never``), or '' off Linux."""
    try:
        found = re.search(r"\[(\w+)\]", _THP_MODE.read_text())
    except OSError:
        return ""
    return found.group(1) if found else ""


def anonymous_ranges() -> Ranges:
    """The process's private, writable mappings that belong to no file, as (start, end) addresses."""
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            # address perms offset device inode [path]: anonymous memory has no path
            if len(fields) == 5 and fields[1] == "rw-p":
                start, end = fields[0].split("-")
                ranges.append((int(start, 16), int(end, 16)))
    return ranges


def subtract(ranges: Ranges, taken: Ranges) -> Ranges:
    """The parts of ``ranges`` that lie in none of ``taken``."""
    out = []
    unchanged = set(taken)
    for start, end in ranges:
        if (start, end) in unchanged:
            continue
        pieces = [(start, end)]
        for t0, t1 in taken:
            pieces = [p for a, b in pieces for p in ((a, min(b, t0)), (max(a, t1), b)) if p[0] < p[1]]
        out.extend(pieces)
    return out


def aligned(ranges: Ranges) -> Ranges:
    """Each range shrunk to whole huge pages; ranges with none are dropped."""
    out = []
    for start, end in ranges:
        lo, hi = -(-start // HUGE_PAGE) * HUGE_PAGE, end // HUGE_PAGE * HUGE_PAGE
        if hi > lo:
            out.append((lo, hi))
    return out


def back_with_huge_pages(ranges: Ranges) -> int:
    """Advise huge pages for ``ranges`` (aligned to HUGE_PAGE) and collapse what is in memory into them.

    Returns:
        The number of bytes collapsed into huge pages now.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    resident = (ctypes.c_ubyte * (HUGE_PAGE // _PAGE))()
    collapsed = 0
    for start, end in ranges:
        if libc.madvise(start, end - start, _MADV_HUGEPAGE) != 0:
            continue
        for at in range(start, end, HUGE_PAGE):
            # a piece never touched needs nothing more (its first fault will be huge);
            # collapsing it would fill it with zeros
            if libc.mincore(at, HUGE_PAGE, resident) != 0 or not any(resident):
                continue
            # fails on kernels before 6.1, where khugepaged does it later
            if libc.madvise(at, HUGE_PAGE, _MADV_COLLAPSE) == 0:
                collapsed += HUGE_PAGE
    return collapsed


class HugePages:
    """Huge pages for the anonymous memory mapped between construction and ``apply()``.

    Does nothing off Linux, or where the kernel's mode is not ``madvise``
    (``always`` gives huge pages anyway, ``never`` refuses them).

    Args:
        enabled: False to do nothing.
    """

    def __init__(self, enabled: bool = True):
        self.enabled = enabled and sys.platform.startswith("linux") and thp_mode() == "madvise"
        self._before: Ranges = []
        if self.enabled:
            try:
                self._before = anonymous_ranges()
            except OSError:  # no readable /proc: an optimisation only, so the load goes on without it
                self.enabled = False
        #: Bytes advised to use huge pages by ``apply``.
        self.advised = 0

    def apply(self) -> None:
        """Advise huge pages for what was mapped since construction, and collapse what is in memory."""
        if not self.enabled:
            return
        try:
            new = aligned(subtract(anonymous_ranges(), self._before))
            self.advised = sum(end - start for start, end in new)
            back_with_huge_pages(new)
        except OSError:
            pass  # an optimisation only: a kernel that refuses leaves the pages as they were
