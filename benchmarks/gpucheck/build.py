"""The CUDA build of llama-cpp-python on the GPU machine, into a folder of its own."""

from __future__ import annotations

import ctypes
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any, Optional

from .settings import CUDA_CMAKE_ARGS, REPO, SDIST_NAME


def _first(patterns: tuple[str, ...], roots: list[Path]) -> Optional[Path]:
    """The first file matching one of ``patterns`` (globs) under the first root that has one."""
    for root in roots:
        for pattern in patterns:
            hits = sorted(root.glob(pattern))
            if hits:
                return hits[0]
    return None


def cuda_hints(root: Path) -> dict[str, Any]:
    """What CMake's FindCUDAToolkit misses in a CUDA toolkit assembled from pip wheels (as some PyTorch setups have).

    cuBLAS (which ggml-cuda links) is then not in the toolkit but in the Python
    packages' ``nvidia/`` folders (PyTorch's dependency); the driver library is
    in the driver's folder. Returns the CMake arguments that name them and the
    folders the built library will load them from at run time. The cuBLAS
    headers are linked into ``root/cublas-include`` alone, so the other CUDA
    headers beside them cannot shadow the toolkit's own.
    """
    toolkit = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    args: list[str] = []
    lib_dirs = [str(toolkit / "lib64")]
    if not (toolkit / "include" / "cublas_v2.h").is_file():
        roots = [Path(p) / "nvidia" for p in sys.path if p and (Path(p) / "nvidia").is_dir()]
        header = _first(("**/include/cublas_v2.h",), roots)
        blas, blas_lt = _first(("**/lib/libcublas.so*",), roots), _first(("**/lib/libcublasLt.so*",), roots)
        if header and blas and blas_lt:
            include = root / "cublas-include"
            include.mkdir(parents=True, exist_ok=True)
            for h in header.parent.glob("cublas*.h"):
                if not (include / h.name).exists():
                    (include / h.name).symlink_to(h)
            args += [f"-DCUDA_cublas_LIBRARY={blas}", f"-DCUDA_cublasLt_LIBRARY={blas_lt}",
                     f"-DCMAKE_CUDA_FLAGS=-I{include}", f"-DCMAKE_CXX_FLAGS=-I{include}"]
            lib_dirs.append(str(blas.parent))
    system = [Path(d) for d in ("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/x86_64-linux-gnu",
                                "/usr/lib64")]
    driver = _first(("libcuda.so", "libcuda.so.1"), [toolkit / "lib64" / "stubs", toolkit / "lib64", *system])
    # Without the driver library ggml cannot use CUDA's virtual memory pool; it falls back to its own pool.
    args.append(f"-DCUDA_cuda_driver_LIBRARY={driver}" if driver else "-DGGML_CUDA_NO_VMM=ON")
    return {"cmake_args": args, "lib_dirs": lib_dirs}


def preload_cuda_libs(lib_dirs: list[str]) -> list[str]:
    """Load the CUDA runtime and cuBLAS from ``lib_dirs`` into this process before llama_cpp needs them
    (LD_LIBRARY_PATH is read only when a process starts; subprocesses get it set)."""
    loaded = []
    for pattern in ("libcudart.so.*", "libcublasLt.so.*", "libcublas.so.*"):
        lib = _first((pattern,), [Path(d) for d in lib_dirs])
        if lib is not None:
            ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
            loaded.append(str(lib))
    return loaded


def build_cmake_args(hints: dict[str, Any]) -> str:
    """CMAKE_ARGS for the CUDA build: the settings' flags, the toolkit hints, and, as install.sh does, llama.cpp's
    "common" library skipped (llama_cpp never loads it; it is half the C++ compile)."""
    lean = f"-DCMAKE_PROJECT_llama.cpp_INCLUDE={REPO / 'scripts' / 'llama_cpp_lean.cmake'}"
    return " ".join([CUDA_CMAKE_ARGS, lean, *hints["cmake_args"]])


def preload_folder(root: Path) -> Path:
    """A folder holding a ``sitecustomize`` that imports llama_cpp at interpreter start, for the check's
    subprocesses (pytest, the CLI): with some numpy builds (2.5 with scipy-openblas 0.3.34 was seen) imported
    first, the CUDA build's llama.cpp crashes loading a model's vocabulary, so its libraries must load before
    numpy's. The check's own process imports no numpy before it imports llama_cpp."""
    folder = root / "preload"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text("import llama_cpp  # noqa: F401  (before numpy: see gpucheck.build)\n")
    return folder


def build_command(src: Path, site: Path) -> list[str]:
    """pip building the unpacked sdist with the environment's scikit-build-core, CMake and nvcc, nothing fetched.

    The CMake build folder is fixed (next to ``site``), so a build stopped by a
    time limit resumes where it stopped when the command is run again.
    """
    return [sys.executable, "-m", "pip", "install", "-v", "--no-build-isolation", "--no-index", "--no-deps",
            "--no-cache-dir", "--upgrade", "--target", str(site), "-C", f"build-dir={site.parent / 'build'}", str(src)]


def unpack_sdist(sdist: Path, dest: Path) -> Path:
    """The sdist's source folder under ``dest``, unpacked once (the same path every run, for the build folder)."""
    if not sdist.is_file():
        raise FileNotFoundError(f"{sdist} is missing: run `python benchmarks/gpu_check.py --prepare-offline` on a "
                                f"machine with the network and copy {sdist.parent.name}/ beside the checkout")
    src = dest / SDIST_NAME.removesuffix(".tar.gz")
    if not (src / "pyproject.toml").is_file():
        with tarfile.open(sdist) as tar:
            tar.extractall(dest, filter="data")
    return src


def run_group(cmd: list[str], log: Any, env: dict[str, str], timeout: float) -> Optional[int]:
    """Run ``cmd`` in its own process group; past ``timeout`` stop the whole group (pip, CMake, ninja, nvcc)
    so that nothing keeps writing into the build folder. Returns the exit status, or None when stopped."""
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=os.setpgrp)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # ninja removes the outputs of the commands it interrupts
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        return None


def build_llama(sdist: Path, site: Path, hints: dict[str, Any], log: Path, timeout: float) -> dict[str, Any]:
    """Build and install llama-cpp-python with CUDA into ``site``; the log's tail goes to ``log``."""
    resumed = (site.parent / "build").is_dir()
    src = unpack_sdist(sdist, site.parent)
    cmake_args = build_cmake_args(hints)
    env = dict(os.environ, CMAKE_ARGS=cmake_args, CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 1))
    cmd = build_command(src, site)
    full = site.parent / "build-full.log"
    t0 = time.perf_counter()
    with open(full, "ab") as f:
        rc = run_group(cmd, f, env, timeout)
    seconds = time.perf_counter() - t0
    log.write_bytes(full.read_bytes()[-400_000:])  # the tail: the error, or the last compile lines
    if rc != 0:
        raise RuntimeError(f"the build {'ran out of time' if rc is None else f'failed (exit {rc})'} after "
                           f"{seconds:.0f} s; see {log.name}" + ("; run again to resume it" if rc is None else ""))
    return {"seconds": round(seconds, 1), "resumed": resumed, "command": shlex.join(cmd), "cmake_args": cmake_args,
            "sdist_bytes": sdist.stat().st_size}
