"""Sizes as people read them: bytes (``1.2 GB``) and parameter counts (``1.5B``)."""

from __future__ import annotations


def human_bytes(n: int) -> str:
    """``1.2 GB``, ``3.4 MB``, ``56.0 KB``, ``12 bytes``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def human_count(n: int) -> str:
    """A parameter count as model names say it: ``1.5B``, ``494M``."""
    if n >= 10**9:
        return f"{n / 1e9:.1f}".rstrip("0").rstrip(".") + "B"
    return f"{n / 1e6:.0f}M"
