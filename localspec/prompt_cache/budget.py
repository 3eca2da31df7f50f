"""The prompt cache's default budgets: a share of the memory available and of the disk space free."""

from __future__ import annotations

import os
from pathlib import Path

#: Default budgets: this share of the memory free at start (at most RAM_MOST), and of the disk free (at most DISK_MOST).
RAM_SHARE, RAM_MOST = 0.25, 8 * 2**30
DISK_SHARE, DISK_MOST = 0.10, 16 * 2**30


def available_memory() -> int:
    """Bytes of memory available now (Linux's MemAvailable; the free pages elsewhere; 4 GiB when unknown)."""
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        try:
            return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
        except (AttributeError, ValueError, OSError):  # not on this system (macOS, Windows): a fixed amount
            return 4 * 2**30


def default_ram_budget() -> int:
    """Bytes for the RAM tier: ``RAM_SHARE`` of the memory available now, at most ``RAM_MOST``."""
    return int(min(RAM_MOST, RAM_SHARE * available_memory()))


def default_disk_budget(folder: Path) -> int:
    """Bytes for the disk tier: ``DISK_SHARE`` of the free space where ``folder`` is, at most ``DISK_MOST``."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        st = os.statvfs(probe)
    except (OSError, AttributeError):  # no statvfs (Windows): a fixed budget
        return 2 * 2**30
    return int(min(DISK_MOST, DISK_SHARE * st.f_bavail * st.f_frsize))


def budget_text(n: int) -> str:
    """A budget or a state's size in MiB, or in GiB from 10 GiB on."""
    return f"{n / 2**20:.0f} MiB" if n < 10 * 2**30 else f"{n / 2**30:.1f} GiB"
