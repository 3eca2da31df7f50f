"""Where localspec keeps its files.

``LOCALSPEC_HOME`` puts everything under one directory (config in it, cache
in ``HOME/cache``); otherwise platformdirs' per-user directories are used.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import platformdirs

APP = "localspec"


def _home_override() -> Optional[Path]:
    """``LOCALSPEC_HOME``, the one place it is read."""
    env = os.environ.get("LOCALSPEC_HOME")
    return Path(env).expanduser() if env else None


def home() -> Path:
    """Directory for user configuration (``models.toml``) and downloaded models."""
    return _home_override() or Path(platformdirs.user_data_dir(APP))


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def cache_dir() -> Path:
    """Directory for things that can be recomputed (calibrations)."""
    override = _home_override()
    return override / "cache" if override else Path(platformdirs.user_cache_dir(APP))
