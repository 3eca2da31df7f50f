"""The offline bundle for a GPU machine without network: the trimmed llama-cpp-python sdist and the
pure-Python packages the check imports."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any, Optional

from .settings import LLAMA_VERSION, OFFLINE, OFFLINE_PACKAGES, SDIST_NAME, SDIST_TRIM


def trim_sdist(src: Path, dst: Path) -> dict[str, int]:
    """Copy the sdist ``src`` to ``dst`` without the paths in SDIST_TRIM; returns sizes and counts."""
    kept = dropped = 0
    dst.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(src, "r:gz") as tin, tarfile.open(dst, "w:gz", compresslevel=6) as tout:
        for member in tin:
            inner = member.name.split("/", 1)[1] if "/" in member.name else ""
            if inner.startswith(SDIST_TRIM) or inner + "/" in SDIST_TRIM:
                dropped += 1
                continue
            tout.addfile(member, tin.extractfile(member) if member.isfile() else None)
            kept += 1
    return {"sdist_bytes": src.stat().st_size, "trimmed_bytes": dst.stat().st_size, "kept": kept, "dropped": dropped}


def copy_packages(names: tuple[str, ...], dest: Path) -> dict[str, str]:
    """Copy installed pure-Python distributions (code and metadata, no bytecode) into ``dest``."""
    versions = {}
    for name in names:
        dist = importlib.metadata.distribution(name)
        root = Path(str(dist.locate_file("")))
        for f in dist.files or []:
            parts = Path(f).parts
            if parts[0] == ".." or "__pycache__" in parts or f.suffix in (".so", ".pyd"):
                continue  # scripts outside site-packages, bytecode; a compiled file may not run on the GPU machine
            target = dest / f
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / f, target)
        versions[name] = dist.version
    return versions


def find_sdist(cache: Path) -> Path:
    """The llama-cpp-python sdist from ``cache``, downloaded there with pip the first time."""
    path = cache / SDIST_NAME
    if not path.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={LLAMA_VERSION}", "-d", str(cache)], check=True)
    return path


def prepare_offline(sdist: Optional[Path], dest: Path = OFFLINE) -> dict[str, Any]:
    """Fill ``dest`` (git-ignored; copy it beside the checkout on the GPU machine) and return what is in it."""
    src = sdist or find_sdist(Path.home() / ".cache" / "localspec" / "sdist")
    shutil.rmtree(dest, ignore_errors=True)
    info: dict[str, Any] = trim_sdist(src, dest / SDIST_NAME)
    info["packages"] = copy_packages(OFFLINE_PACKAGES, dest / "site")
    info["total_bytes"] = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    return info
