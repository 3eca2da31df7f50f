"""The project keeps ruff and mypy clean; CI enforces it here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_ruff_is_clean():
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "localspec", "tests", "scripts"],
                       cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_is_clean():
    r = subprocess.run([sys.executable, "-m", "mypy", "localspec"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
