"""The benchmark scripts still start (their imports and arguments), and the index names every one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.glob("*.py"))


def test_the_index_names_every_script_and_nothing_else():
    index = (BENCHMARKS / "README.md").read_text()
    named = {line.split("`")[1] for line in index.splitlines() if line.startswith("| `")}
    assert named == {p.name for p in SCRIPTS} and len(SCRIPTS) >= 4


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_benchmark_script_answers_help(script):
    r = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "usage:" in r.stdout.lower()
