"""Where localspec keeps its files.

``LOCALSPEC_HOME`` puts everything under one directory (config in it, cache
in ``HOME/cache``); otherwise platformdirs' per-user directories are used.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP = "localspec"


def home() -> Path:
    """Directory for user configuration (``models.toml``) and downloaded models."""
    env = os.environ.get("LOCALSPEC_HOME")
    return Path(env).expanduser() if env else Path(platformdirs.user_data_dir(APP))


def cache_dir() -> Path:
    """Directory for things that can be recomputed (calibrations)."""
    env = os.environ.get("LOCALSPEC_HOME")
    return Path(env).expanduser() / "cache" if env else Path(platformdirs.user_cache_dir(APP))
