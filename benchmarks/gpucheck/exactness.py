"""The tiny-model exactness tests on this build, and whether layers really went to the GPU."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from .settings import REPO


def parse_junit(path: Path) -> dict[str, Any]:
    """Counts and the failing tests' names from pytest's JUnit XML."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    count = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    failed = [f"{c.get('classname')}::{c.get('name')}" for c in root.iter("testcase")
              if c.find("failure") is not None or c.find("error") is not None]
    return {"tests": count["tests"], "passed": count["tests"] - count["failures"] - count["errors"] - count["skipped"],
            "failed": count["failures"], "errors": count["errors"], "skipped": count["skipped"],
            "failing": failed[:30]}


_PROBE = """
import sys, llama_cpp
sys.path.insert(0, "tests")
from tinymodel import write_tiny_model
from localspec.runtime.model import Model
m = Model(write_tiny_model(sys.argv[1]), n_ctx=256, verbose=True)
print(m.n_gpu_layers, m.flash_attn, llama_cpp.__file__)
"""


def offload_probe(work: Path, env: dict[str, str]) -> dict[str, Any]:
    """How the tests' tiny models load in a test process: the GPU layers ``Model`` chose, and llama.cpp's own
    word on how many layers it offloaded."""
    r = subprocess.run([sys.executable, "-c", _PROBE, str(work / "probe.gguf")], capture_output=True, text=True,
                       cwd=REPO, env=env, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"the offload probe failed: {r.stderr.strip()[-1500:]}")
    ngl, flash, lib = r.stdout.split()[-3:]
    said = [line.split("load_tensors: ", 1)[-1] for line in r.stderr.splitlines() if "offload" in line]
    return {"n_gpu_layers": int(ngl), "flash_attn": flash, "llama_cpp": lib, "llama_log": said[:4]}


def run_tests(tests: tuple[str, ...], out: Path, env: dict[str, str], timeout: float) -> dict[str, Any]:
    """The tiny-model tests on this build, JUnit XML and log into ``out``."""
    junit, log = out / "junit.xml", out / "pytest.log"
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", f"--junitxml={junit}", *tests]
    t0 = time.perf_counter()
    try:
        with open(log, "wb") as f:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, env=env, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        rc = None  # pytest was stopped; the JUnit file is not written then
    result: dict[str, Any] = {"command": shlex.join(["pytest", *cmd[3:]]), "returncode": rc,
                              "seconds": round(time.perf_counter() - t0, 1)}
    if rc is None or not junit.is_file():
        raise RuntimeError(f"pytest {'timed out' if rc is None else f'exited {rc} without a report'}; see {log.name}")
    result.update(parse_junit(junit))
    return result
