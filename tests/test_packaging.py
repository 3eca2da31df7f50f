"""localspec installed as a user installs it (``pip install .``): a built wheel, not this checkout.

The wheel is built without build isolation (the test extras bring setuptools) and installed, without its
dependencies (they are this environment's), into a folder of its own; the command then runs from another
directory, so nothing of the checkout is imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("packaging")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(work / "dist"), str(REPO)], check=True, cwd=work, timeout=300)
    wheel = next((work / "dist").glob("localspec-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(work / "site"),
                    str(wheel)], check=True, cwd=work, timeout=300)
    return work


def run_installed(work: Path, *args: str, home: Path) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(work / "site"), "LOCALSPEC_HOME": str(home), "LOCALSPEC_HISTORY": "off",
           "PATH": "/usr/bin:/bin", "HOME": str(home)}
    return subprocess.run([sys.executable, "-c", "import sys; from localspec.cli import main; sys.argv[0] = "
                           "'localspec'; main()", *args], capture_output=True, text=True, cwd=work, env=env,
                          timeout=300)


def test_the_wheel_holds_every_module_and_data_file_and_the_command(installed: Path):
    wheel = next((installed / "dist").glob("localspec-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {p.relative_to(REPO).as_posix() for p in (REPO / "localspec").rglob("*.py")}
    assert sources <= names, sorted(sources - names)
    assert {"localspec/data/models.toml", "localspec/data/suite.jsonl", "localspec/py.typed"} <= names
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "localspec = localspec.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_the_installed_command_lists_the_pairs_and_generates(installed: Path, tiny_dir: Path, tmp_path: Path):
    where = run_installed(installed, "--version", home=tmp_path)
    assert where.returncode == 0 and "localspec" in where.stdout, where.stderr
    probe = subprocess.run([sys.executable, "-c", "import localspec; print(localspec.__file__)"], capture_output=True,
                           text=True, cwd=installed, env={"PYTHONPATH": str(installed / "site")}, timeout=60)
    assert probe.stdout.strip().startswith(str(installed / "site")), probe.stdout  # not this checkout
    listed = run_installed(installed, "models", home=tmp_path)
    assert listed.returncode == 0 and "qwen2.5-coder-1.5b" in listed.stdout, listed.stderr  # packaged catalog
    r = run_installed(installed, "generate", "-t", str(tiny_dir / "target.gguf"), "-p", "the cat sat on the",
                      "-n", "8", "--method", "plain", "--threads", "1", home=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "finish:" in r.stderr and r.stdout.strip()


def test_pip_install_dot_into_a_clean_venv_gives_a_working_command(tiny_dir: Path, tmp_path: Path):
    # What a user runs (pipx does the same into a venv of its own): the checkout and its dependencies from the
    # package index, llama-cpp-python from the wheel scripts/install.sh built (it would otherwise build it again).
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "localspec" / "wheels"
    built = sorted(cache.glob("*/llama_cpp_python-*.whl"), key=lambda p: p.stat().st_mtime)
    if not built:
        pytest.skip(f"no llama-cpp-python wheel under {cache}: scripts/install.sh builds one")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--find-links",
                    str(built[-1].parent), str(REPO)], check=True, cwd=tmp_path, timeout=1200)
    env = {"LOCALSPEC_HOME": str(tmp_path / "home"), "LOCALSPEC_HISTORY": "off", "PATH": "/usr/bin:/bin",
           "HOME": str(tmp_path / "home")}
    r = subprocess.run([str(venv / "bin" / "localspec"), "generate", "-t", str(tiny_dir / "target.gguf"), "-p",
                        "the cat sat on the", "-n", "8", "--method", "plain", "--threads", "1"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "finish:" in r.stderr and r.stdout.strip()
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", "import localspec; print(localspec.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert probe.stdout.strip().startswith(str(venv)), probe.stdout  # installed, not this checkout
