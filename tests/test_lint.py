"""The project keeps ruff and mypy clean; CI enforces it here."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install -e '.[test]')")


def test_ruff_is_clean():
    needs("ruff")
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "localspec", "tests", "scripts", "benchmarks"],
                       cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_is_clean():
    needs("mypy")
    r = subprocess.run([sys.executable, "-m", "mypy", "localspec"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
