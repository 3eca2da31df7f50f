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


def test_the_replay_records_once_and_predicts_on_any_profile(tiny_dir, tmp_path):
    """benchmarks/replay.py end to end on the tiny pair: a recording, then predictions on a given curve and on a
    GPU check's JSON (its costs and its Python time per round)."""
    import json

    script = str(BENCHMARKS / "replay.py")
    traces = tmp_path / "traces.json"
    r = subprocess.run([sys.executable, script, "record", str(tiny_dir / "target.gguf"), "--draft",
                        str(tiny_dir / "target.gguf"), "-n", "16", "--threads", "1", "--out", str(traces)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(traces.read_text())["meta"]["workload"] == "suite"
    out = tmp_path / "flat.json"
    flat = subprocess.run([sys.executable, script, "predict", str(traces), "--verify", "1,1.02,1.04,1.06,1.08",
                           "--draft-step", "0.1", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert flat.returncode == 0 and "median" in flat.stdout, flat.stderr[-2000:]
    median = json.loads(out.read_text())["median"]
    assert median["draft 4"] > 2.0 and median["auto"] > 1.5  # the target drafting for itself: every guess kept
    gpu = tmp_path / "gpu_check.json"
    gpu.write_text(json.dumps({"calibration": {"verify_seconds": [0.003 * (1 + 0.02 * n) for n in range(17)],
                                               "draft_step_seconds": 0.001, "lookup_seconds": 2e-5},
                               "overheads": {"generation": {"plain": {"python_ms_per_round": 0.3},
                                                            "auto": {"python_ms_per_round": 0.6}}}}))
    r = subprocess.run([sys.executable, script, "predict", str(traces), "--profile", str(gpu)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "0.30 ms plain, 0.60 ms drafted" in r.stdout, r.stderr[-2000:]
