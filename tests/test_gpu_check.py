"""The prepared GPU check (benchmarks/gpu_check.py): its CPU dry run takes every step the GPU run takes."""

from __future__ import annotations

import importlib
import io
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "gpu_check.py"
SCALE = 0.02  # the dry run's default
STEPS = {"machine", "build", "llama_cpp", "models", "calibration", "overheads", "cli_calibrate", "offload_probe",
         "tests"}


def gpu_check(part: str):
    """A module of the check's package, ``benchmarks/gpucheck``."""
    if str(REPO / "benchmarks") not in sys.path:
        sys.path.insert(0, str(REPO / "benchmarks"))
    return importlib.import_module(f"gpucheck.{part}")


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    r = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=REPO)
    assert (out / "gpu_check.json").is_file(), r.stderr[-3000:]
    return r, json.loads((out / "gpu_check.json").read_text()), out


def test_the_dry_run_passes_every_step_and_prints_the_gpu_command(dry_run):
    r, report, out = dry_run
    assert r.returncode == 0, r.stderr[-3000:]
    assert set(report["steps"]) == STEPS and all(s["ok"] for s in report["steps"].values()), report["steps"]
    assert report["mode"] == "dry-run" and report["build"]["skipped"]
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" in report["build"]["cmake_args"]
    assert "--no-build-isolation --no-index" in report["build"]["would_run"]
    instruction = re.search(r"^On the GPU machine .*\.gpu_offline/.*: (.*)$", r.stdout, re.MULTILINE)
    assert instruction, r.stdout[-2000:]
    assert "--build --out" in instruction.group(1) and instruction.group(1) == report["gpu_command"]
    assert "--prepare-offline" in r.stdout
    assert {p.name for p in out.iterdir()} <= {"gpu_check.json", "junit.xml", "pytest.log"}  # models stay out


def test_the_verify_curve_has_every_n_and_never_falls(dry_run):
    cal = dry_run[1]["calibration"]
    v = cal["verify_seconds"]
    assert cal["kmax"] == 16 and len(v) == 17
    assert all(t > 0 for t in v) and all(a <= b for a, b in zip(v, v[1:], strict=False))
    offload = dry_run[1]["llama_cpp"]["gpu_offload"]
    assert cal["draft_step_seconds"] > 0 and cal["n_gpu_layers"] == (-1 if offload else 0)
    assert len(dry_run[1]["cli_calibrate"]["result"]["verify_seconds"]) >= 2  # the CLI's own kmax


def test_overheads_are_measured_per_round_and_per_logits_row(dry_run):
    over = dry_run[1]["overheads"]
    for name in ("plain_greedy", "plain_sampled", "draft4_greedy", "draft4_sampled"):
        assert over[name]["python_ms_per_round"] >= 0 and over[name]["llama_ms_per_round"] > 0
    assert set(over["generation"]) == {"plain", "lookup", "draft", "auto"}
    assert all(g["rounds"] > 0 for g in over["generation"].values())
    copies = over["logits_copy_seconds"]
    assert len(copies) == 17 and all(c > 0 for c in copies)


def test_the_models_have_the_real_layout_scaled_as_asked(dry_run):
    models = dry_run[1]["models"]
    spec = json.loads((REPO / "benchmarks" / "qwen_shapes.json").read_text())["models"]
    assert models["scale"] == SCALE
    for role in ("target", "draft"):
        real, got = spec[role]["dims"], models[role]["dims"]
        assert got["n_layer"] == max(1, round(real["n_layer"] * SCALE))
        assert got["n_vocab"] == round(real["n_vocab"] * SCALE)
        assert got["n_embd"] % 256 == 0 and got["n_ff"] % 256 == 0 and got["n_embd"] <= real["n_embd"]
        assert got["head_dim"] == real["head_dim"] and got["n_head"] % got["n_head_kv"] == 0
        assert models[role]["bytes"] < 5 * 2**20 and "Q4_K" in models[role]["tensor_types"]
    assert models["target"]["dims"]["n_vocab"] == models["draft"]["dims"]["n_vocab"]


def test_the_exactness_tests_ran_and_passed_on_the_layers_the_build_offloads(dry_run):
    report = dry_run[1]
    tests = report["tests"]
    assert tests["passed"] > 0 and tests["failed"] == 0 and tests["errors"] == 0, tests
    assert report["offload_probe"]["n_gpu_layers"] == (-1 if report["llama_cpp"]["gpu_offload"] else 0)


@pytest.mark.parametrize("args,message", [
    (["--dry-run", "--scale", "0", "--out", "OUT"], "--scale must be in (0, 1]"),
    (["--dry-run"], "--out DIR is required"),
    (["--dry-run", "--build", "--out", "OUT"], "--build and --dry-run exclude each other"),
])
def test_a_bad_argument_is_one_clear_error(tmp_path, args, message):
    args = [str(tmp_path) if a == "OUT" else a for a in args]
    r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert message in r.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "gpu_check.json").exists()


def test_the_trimmed_sdist_keeps_the_sources_and_drops_what_no_build_reads(tmp_path):
    src, dst = tmp_path / "pkg-1.0.tar.gz", tmp_path / "out" / "pkg-1.0.tar.gz"
    names = ["pkg-1.0/pyproject.toml", "pkg-1.0/.git/modules/pack", "pkg-1.0/vendor/llama.cpp/.git",
             "pkg-1.0/vendor/llama.cpp/docs/ops/CUDA.csv", "pkg-1.0/vendor/llama.cpp/models/ggml-vocab-qwen2.gguf",
             "pkg-1.0/vendor/llama.cpp/ggml/src/ggml-cuda/mmq.cu", "pkg-1.0/vendor/llama.cpp/src/models/qwen2.cpp"]
    with tarfile.open(src, "w:gz") as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = 3
            tar.addfile(info, io.BytesIO(b"abc"))
    counts = gpu_check("offline").trim_sdist(src, dst)
    with tarfile.open(dst) as tar:
        kept = set(tar.getnames())
    assert kept == {names[0], names[5], names[6]} and counts["dropped"] == 4


def test_the_offline_bundle_is_an_ignored_folder():
    assert ".gpu_offline/" in (REPO / ".gitignore").read_text().splitlines()


@pytest.mark.real
def test_the_shape_spec_matches_the_real_pair():
    from conftest import real_models_dir

    d = real_models_dir()
    committed = json.loads((REPO / "benchmarks" / "qwen_shapes.json").read_text())["models"]
    module = gpu_check("spec")
    for role in ("target", "draft"):
        read = json.loads(json.dumps(module.read_spec(d / f"{role}.gguf")))  # tuples to lists, as in the file
        assert read == committed[role]
