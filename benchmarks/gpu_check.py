#!/usr/bin/env python3
"""The prepared GPU check of issue 21: CUDA build, real-shaped random models, costs and exactness on the GPU.

One run writes everything as JSON into one folder (``--out``; ``$OUT`` on the
device machine), step by step, so a run cut short still reports what it did:

1. build: llama-cpp-python 0.3.36 with CUDA for the H200 (sm_90) from the
   trimmed sdist carried in ``.gpu_carry/``, installed with ``--target`` into
   ``--site`` (``--build``; a dry run only records the command);
2. models: the Qwen2.5-Coder 1.5B target and 0.5B draft with the real files'
   metadata and tensor shapes (``benchmarks/qwen_shapes.json``) and random
   weights, written as F16 with ``gguf`` and quantized to Q4_K_M by llama.cpp;
   the vocabulary is synthetic but of the real size with the real special ids
   (costs depend on its size, not on its texts);
3. calibrate: the verify curve for n = 1..kmax+1, the draft step, the Python
   time per round outside llama.cpp, the time to copy n logits rows, and
   ``localspec calibrate --json`` through the CLI;
4. tests: the tiny-model exactness and distribution tests on this build
   (on a GPU build ``Model`` offloads every layer by default).

Modes:
    python benchmarks/gpu_check.py --dry-run --out DIR      # CPU, tiny scale, no build: what CI runs
    python3 benchmarks/gpu_check.py --build --out "$OUT"    # on the device machine
    python benchmarks/gpu_check.py --prepare-carry          # here: fill .gpu_carry/ (sdist, pure-Python deps)
    python benchmarks/gpu_check.py --write-spec             # here: benchmarks/qwen_shapes.json from the real pair
    python benchmarks/gpu_check.py --device-command         # print the device run's command
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import importlib.metadata
import json
import math
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "benchmarks" / "qwen_shapes.json"
LLAMA_VERSION = "0.3.36"
CARRY = REPO / ".gpu_carry"
SDIST_NAME = f"llama_cpp_python-{LLAMA_VERSION}.tar.gz"
DEFAULT_SITE = Path("/tmp/localspec-gpu/site")
DEFAULT_WORK = Path("/tmp/localspec-gpu/work")
REAL_MODELS = Path.home() / ".cache" / "localspec" / "test-models"
#: The H200 is compute capability 9.0. The CPU part is built portable, as scripts/install.sh does (a native
#: build enables ggml's AMX kernels, which crash in VMs without AMX state); mtmd (LLAVA) is not needed.
CUDA_CMAKE_ARGS = ("-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON "
                   "-DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON")
#: Paths in the sdist that no build step reads (under its top folder): git packs, docs, vocab test files,
#: benchmark results, the server's web UI and assets. The sdist is 77 MB; without these about 10.
SDIST_TRIM = (".git/", "vendor/llama.cpp/.git", "vendor/llama.cpp/docs/", "vendor/llama.cpp/models/",
              "vendor/llama.cpp/benches/", "vendor/llama.cpp/tools/ui/", "vendor/llama.cpp/tools/server/",
              "vendor/llama.cpp/media/", "vendor/llama.cpp/.github/")
#: Pure-Python packages localspec, llama_cpp and the model writer need that the device image lacks.
CARRY_PACKAGES = ("gguf", "platformdirs", "tomli_w", "prompt_toolkit", "wcwidth", "diskcache")
#: Greedy identical to plain, sampled distribution kept, KV truncation right: the tiny-model tests for them.
EXACTNESS_TESTS = (
    "tests/test_engine_tiny.py", "tests/test_acceptance.py", "tests/test_auto.py",
    "tests/test_history.py::test_greedy_with_history_equals_plain_decoding_and_a_repeat_is_drafted_from_history",
    "tests/test_history.py::test_wrong_history_is_rejected_and_the_output_stays_exact",
    "tests/test_history.py::test_sampled_history_drafts_keep_the_plain_distribution",
)
#: The dry run's few: greedy exactness and the caches after rejections, on the same path.
DRY_RUN_TESTS = ("tests/test_engine_tiny.py::test_greedy_speculation_matches_plain_decoding",
                 "tests/test_engine_tiny.py::test_after_rejections_both_caches_equal_a_fresh_context")
QK_K = 256  # K-quant block: a row length that is a multiple of it quantizes to Q4_K/Q6_K, not a fallback
DRY_RUN_SCALE = 0.02


# -- the shape spec: the real files' metadata and tensor shapes ------------------------------------------------

def _field_value(field: Any) -> Any:
    value = field.contents()
    return value.item() if isinstance(value, np.generic) else value


def _dims(meta: dict[str, list[Any]], arch: str, n_vocab: int) -> dict[str, int]:
    """The few numbers every tensor shape is made of."""
    embd, heads = meta[f"{arch}.embedding_length"][1], meta[f"{arch}.attention.head_count"][1]
    kv_heads = meta[f"{arch}.attention.head_count_kv"][1]
    return {"n_layer": meta[f"{arch}.block_count"][1], "n_embd": embd, "n_ff": meta[f"{arch}.feed_forward_length"][1],
            "n_head": heads, "n_head_kv": kv_heads, "head_dim": embd // heads, "n_vocab": n_vocab,
            "n_embd_kv": kv_heads * (embd // heads)}


def _symbolic(shape: list[int], dims: dict[str, int]) -> list[str]:
    """A tensor shape (ggml order) in dimension names, so it can be scaled."""
    names = {dims[k]: k for k in ("n_embd", "n_ff", "n_vocab", "n_embd_kv")}
    if len(names) < 4:
        raise ValueError(f"two dimensions share a size in {dims}; tensor shapes would be ambiguous")
    return [names[n] for n in shape]


def _tokenizer_spec(fields: dict[str, Any]) -> dict[str, Any]:
    """The tokenizer's layout without its texts: sizes, the special tokens (after the ordinary ones), the
    BOS/EOS/padding tokens by text, the chat template."""
    toks, types = fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"]
    type_of = [int(types.parts[i][0]) for i in types.data]
    n_normal = type_of.index(3) if 3 in type_of else len(type_of)
    special = [[bytes(toks.parts[toks.data[i]]).decode(), type_of[i]] for i in range(n_normal, len(type_of))
               if type_of[i] != 5]  # 5: unused padding, regenerated as [PADn]
    ids = {k: _field_value(fields[f"tokenizer.ggml.{k}_token_id"]) for k in ("bos", "eos", "padding")}
    return {"model": _field_value(fields["tokenizer.ggml.model"]), "pre": _field_value(fields["tokenizer.ggml.pre"]),
            "n_tokens": len(type_of), "n_normal": n_normal, "special": special,
            "ids": {k: bytes(toks.parts[toks.data[v]]).decode() for k, v in ids.items()},
            "add_bos": bool(_field_value(fields["tokenizer.ggml.add_bos_token"])),
            "chat_template": _field_value(fields["tokenizer.chat_template"]),
            "n_merges_real": len(fields["tokenizer.ggml.merges"].data)}


def read_spec(path: Path) -> dict[str, Any]:
    """A model file's metadata (minus the vocabulary texts), tokenizer layout and symbolic tensor shapes."""
    import gguf

    r = gguf.GGUFReader(str(path))
    arch = _field_value(r.fields["general.architecture"])
    meta: dict[str, list[Any]] = {}
    for key, field in r.fields.items():
        if key.startswith(("GGUF.", "tokenizer.")) or key in ("general.architecture", "general.file_type",
                                                                "general.quantization_version"):
            continue
        meta[key] = [field.types[0].name, _field_value(field)]
    tokenizer = _tokenizer_spec(r.fields)
    dims = _dims(meta, arch, tokenizer["n_tokens"])
    blocks: dict[str, list[str]] = {}
    tensors: list[list[Any]] = []
    for t in r.tensors:
        shape = _symbolic([int(n) for n in t.shape], dims)
        if t.name.startswith("blk."):
            _, i, rest = t.name.split(".", 2)
            if blocks.setdefault(rest, shape) != shape:
                raise ValueError(f"{path}: block tensor {rest} changes shape at block {i}")
        else:
            tensors.append([t.name, shape])
    real_types: dict[str, int] = {}
    for t in r.tensors:
        real_types[t.tensor_type.name] = real_types.get(t.tensor_type.name, 0) + 1
    return {"file": path.name, "bytes": path.stat().st_size, "architecture": arch, "metadata": meta,
            "dims": dims, "tokenizer": tokenizer, "tensors": tensors, "block_tensors": sorted(blocks.items()),
            "real_tensor_types": real_types, "ftype": "Q4_K_M"}


def write_spec(target: Path, draft: Path, out: Path) -> dict[str, Any]:
    """Write the shape spec of the real pair to ``out`` (a few KB: no vocabulary texts)."""
    spec = {"about": "Metadata and tensor shapes (ggml order, in dimension names) of the real Qwen2.5-Coder pair, "
                     "read by benchmarks/gpu_check.py --write-spec; the GPU check writes random-weight models "
                     "of these shapes.",
            "models": {"target": read_spec(target), "draft": read_spec(draft)}}
    out.write_text(json.dumps(spec, indent=1, ensure_ascii=False) + "\n")
    return spec


# -- what travels to the device: the trimmed sdist and pure-Python packages ------------------------------------

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
                continue  # scripts outside site-packages, bytecode; a compiled file would not run there
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


def prepare_carry(sdist: Optional[Path], dest: Path = CARRY) -> dict[str, Any]:
    """Fill ``dest`` (git-ignored, named in the device run's ``carry``) and return what is in it."""
    src = sdist or find_sdist(Path.home() / ".cache" / "localspec" / "sdist")
    shutil.rmtree(dest, ignore_errors=True)
    info: dict[str, Any] = trim_sdist(src, dest / SDIST_NAME)
    info["packages"] = copy_packages(CARRY_PACKAGES, dest / "site")
    info["total_bytes"] = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    return info


# -- the build ---------------------------------------------------------------------------------------------------

def _first(patterns: tuple[str, ...], roots: list[Path]) -> Optional[Path]:
    """The first file matching one of ``patterns`` (globs) under the first root that has one."""
    for root in roots:
        for pattern in patterns:
            hits = sorted(root.glob(pattern))
            if hits:
                return hits[0]
    return None


def cuda_hints(root: Path) -> dict[str, Any]:
    """What CMake's FindCUDAToolkit misses in a CUDA toolkit assembled from pip wheels, as on these images.

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


def build_command(src: Path, site: Path) -> list[str]:
    """pip building the unpacked sdist with the image's scikit-build-core, CMake and nvcc, nothing fetched.

    The CMake build folder is fixed (next to ``site``), so a build stopped by a
    time limit resumes where it stopped when the command is run again.
    """
    return [sys.executable, "-m", "pip", "install", "-v", "--no-build-isolation", "--no-index", "--no-deps",
            "--no-cache-dir", "--upgrade", "--target", str(site), "-C", f"build-dir={site.parent / 'build'}", str(src)]


def unpack_sdist(sdist: Path, dest: Path) -> Path:
    """The sdist's source folder under ``dest``, unpacked once (the same path every run, for the build folder)."""
    if not sdist.is_file():
        raise FileNotFoundError(f"{sdist} is missing: run `python benchmarks/gpu_check.py --prepare-carry` here "
                                "and name .gpu_carry in the run's carry")
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
    cmake_args = " ".join([CUDA_CMAKE_ARGS, *hints["cmake_args"]])
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


# -- real-shaped random models -------------------------------------------------------------------------------------

def scaled_dims(dims: dict[str, int], tok: dict[str, Any], scale: float) -> dict[str, int]:
    """The real dimensions, or (scale < 1) fewer layers and narrower, still K-quant-friendly widths.

    The head width stays the real one; the model width stays a multiple of QK_K
    and of a whole number of KV-head groups, so every matrix row quantizes to
    the K-quant types the real width gets.
    """
    if scale == 1:
        return dict(dims)
    hd, kv = dims["head_dim"], dims["n_head_kv"]
    step = math.lcm(QK_K, hd * kv)
    embd = max(step, round(dims["n_embd"] * scale / step) * step)
    heads = embd // hd
    n_fixed = 256 + len(tok["special"]) + 1  # the byte tokens, the specials and one more
    n_vocab = max(n_fixed, round(dims["n_vocab"] * scale))
    return {"n_layer": max(1, round(dims["n_layer"] * scale)), "n_embd": embd,
            "n_ff": max(QK_K, round(dims["n_ff"] * scale / QK_K) * QK_K), "n_head": heads, "n_head_kv": kv,
            "head_dim": hd, "n_vocab": n_vocab, "n_embd_kv": kv * hd}


def vocabulary(tok: dict[str, Any], n_vocab: int) -> tuple[list[str], list[int]]:
    """A synthetic vocabulary of ``n_vocab`` tokens laid out like the real one.

    Ordinary tokens first (the 256 GPT-2 byte tokens, then fillers), then the
    real special tokens in their real order, then unused padding: at full
    scale every special token has its real id.
    """
    if str(REPO / "tests") not in sys.path:
        sys.path.insert(0, str(REPO / "tests"))
    from tinymodel import byte_tokens

    n_pad_real = tok["n_tokens"] - tok["n_normal"] - len(tok["special"])
    n_pad = round(n_pad_real * n_vocab / tok["n_tokens"])
    n_normal = n_vocab - len(tok["special"]) - n_pad
    texts = byte_tokens() + [f"[TOK{i}]" for i in range(256, n_normal)]
    types = [1] * n_normal
    for text, kind in tok["special"]:
        texts.append(text)
        types.append(kind)
    texts += [f"[PAD{i}]" for i in range(len(texts), n_vocab)]
    types += [5] * (n_vocab - len(types))
    return texts, types


def _add_metadata(w: Any, model: dict[str, Any], dims: dict[str, int], texts: list[str], types: list[int]) -> None:
    import gguf

    arch = model["architecture"]
    sized = {f"{arch}.block_count": "n_layer", f"{arch}.embedding_length": "n_embd",
             f"{arch}.feed_forward_length": "n_ff", f"{arch}.attention.head_count": "n_head",
             f"{arch}.attention.head_count_kv": "n_head_kv"}
    for key, (kind, value) in model["metadata"].items():
        w.add_key_value(key, dims[sized[key]] if key in sized else value, gguf.GGUFValueType[kind])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    tok = model["tokenizer"]
    w.add_tokenizer_model(tok["model"])
    w.add_tokenizer_pre(tok["pre"])
    w.add_token_list(texts)
    w.add_token_types(types)
    w.add_token_merges(["Ġ t", "h e"])  # llama.cpp needs merges for BPE; the texts are not measured
    for kind, text in tok["ids"].items():
        w.add_key_value(f"tokenizer.ggml.{kind}_token_id", texts.index(text), gguf.GGUFValueType.UINT32)
    w.add_add_bos_token(tok["add_bos"])
    w.add_chat_template(tok["chat_template"])


def tensor_list(model: dict[str, Any], dims: dict[str, int]) -> list[tuple[str, list[int]]]:
    """Every tensor's name and shape (ggml order) at these dimensions, in the real file's order of kinds."""
    out = [(name, [dims[d] for d in shape]) for name, shape in model["tensors"]]
    for i in range(dims["n_layer"]):
        out += [(f"blk.{i}.{rest}", [dims[d] for d in shape]) for rest, shape in model["block_tensors"]]
    return out


def write_f16(model: dict[str, Any], dims: dict[str, int], path: Path, seed: int) -> int:
    """Write a random-weight F16 GGUF (1-D tensors F32, as converted models have); returns its size.

    Weights are slices of one random pool, scaled by 1/sqrt(fan-in) so
    activations stay finite; norms are ones and biases zeros. Tensors are
    streamed, so a 3 GB file never sits in memory whole.
    """
    import gguf

    texts, types = vocabulary(model["tokenizer"], dims["n_vocab"])
    tensors = tensor_list(model, dims)
    w = gguf.GGUFWriter(str(path), model["architecture"])
    _add_metadata(w, model, dims, texts, types)
    for name, shape in tensors:
        dtype = np.float16 if len(shape) == 2 else np.float32
        w.add_tensor_info(name, shape[::-1], np.dtype(dtype), math.prod(shape) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    pool = rng.standard_normal(1 << 22).astype(np.float16)
    for name, shape in tensors:
        if len(shape) == 1:
            w.write_tensor_data(np.full(shape, 1.0 if "norm" in name else 0.0, dtype=np.float32))
            continue
        start = int(rng.integers(len(pool)))
        data = np.resize(np.roll(pool, -start), math.prod(shape)).reshape(shape[::-1])
        w.write_tensor_data(data * np.float16(1 / math.sqrt(shape[0])))
    w.close()
    return path.stat().st_size


def quantize(src: Path, dst: Path, ftype: str) -> None:
    """Quantize with llama.cpp's own quantize (its default per-tensor choices for ``ftype``)."""
    import llama_cpp as ll

    from localspec.llama import LlamaLog

    params = ll.llama_model_quantize_default_params()
    params.ftype = getattr(ll, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = os.cpu_count() or 1
    log = LlamaLog()
    with log:
        rc = ll.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize failed ({rc}) on {src.name}: {log.last_error() or 'no log'}")


def tensor_types(path: Path) -> dict[str, int]:
    """How many tensors of each ggml type a GGUF holds."""
    import gguf

    counts: dict[str, int] = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return counts


def make_models(spec: dict[str, Any], scale: float, work: Path) -> dict[str, Any]:
    """Write and quantize the target and the draft; returns their shapes, sizes and times.

    Models an earlier run left in ``work`` at the same scale are used again (a second device call).
    """
    record = work / "models.json"
    if record.is_file():
        done = json.loads(record.read_text())
        if done["scale"] == scale and all(Path(done[r]["path"]).is_file() for r in ("target", "draft")):
            return dict(done, reused=True)
    out: dict[str, Any] = {"scale": scale}
    for seed, role in enumerate(("target", "draft")):
        model = spec["models"][role]
        dims = scaled_dims(model["dims"], model["tokenizer"], scale)
        f16, quant = work / f"{role}-f16.gguf", work / f"{role}.gguf"
        t0 = time.perf_counter()
        f16_bytes = write_f16(model, dims, f16, seed)
        t1 = time.perf_counter()
        quantize(f16, quant, model["ftype"])
        t2 = time.perf_counter()
        f16.unlink()  # 3 GB at full scale; only the quantized file is used
        out[role] = {"dims": dims, "ftype": model["ftype"], "f16_bytes": f16_bytes, "bytes": quant.stat().st_size,
                     "real_bytes": model["bytes"], "tensor_types": tensor_types(quant),
                     "real_tensor_types": model["real_tensor_types"], "write_seconds": round(t1 - t0, 2),
                     "quantize_seconds": round(t2 - t1, 2), "path": str(quant)}
    record.write_text(json.dumps(out))
    return out


# -- costs -----------------------------------------------------------------------------------------------------------

def load_pair(models: dict[str, Any], n_gpu_layers: int) -> tuple[Any, Any]:
    """The target and draft as localspec loads them, with every layer on the GPU (-1) or none (0)."""
    from localspec.backend import Model

    target = Model(models["target"]["path"], n_gpu_layers=n_gpu_layers)
    draft = Model(models["draft"]["path"], n_gpu_layers=n_gpu_layers)
    return target, draft


def calibrate(target: Any, draft: Any, kmax: int) -> dict[str, Any]:
    """The verify curve for n = 1..kmax+1 and the draft step (``localspec.calibration.measure``)."""
    from localspec.calibration import measure

    t0 = time.perf_counter()
    profile = measure(target, draft, kmax)
    return {"kmax": kmax, "verify_seconds": profile.verify, "draft_step_seconds": profile.draft_step,
            "lookup_seconds": profile.lookup, "relative": profile.relative(), "source": profile.source,
            "n_gpu_layers": target.n_gpu_layers, "flash_attn": target.flash_attn, "threads": target.n_threads,
            "threads_batch": target.n_threads_batch, "seconds": round(time.perf_counter() - t0, 2)}


def round_overhead(target: Any, drafter: Any, k: int, params: Any, rounds: int) -> dict[str, float]:
    """Milliseconds per engine round inside and outside llama.cpp, over ``rounds`` rounds after a short prompt.

    Runs ``engine.speculative_round`` as a generation does, appending each
    round's tokens (end-of-generation tokens too: random weights may pick one).
    """
    from localspec.engine import speculative_round

    models = (target, *(drafter.models if drafter is not None else ()))
    context = np.zeros(target.n_ctx, dtype=np.int32)
    prompt = target.tokenize("def merge(a, b):\n    out = []\n", add_special=False)
    n = len(prompt)
    context[:n] = prompt
    target.reset()
    target.eval(prompt[:-1], logits="none")
    if drafter is not None:
        drafter.model.reset()
        drafter.prefill(context[:n])
    rng = np.random.default_rng(0)
    wall = busy = 0.0
    for i in range(rounds + 2):  # the first two warm up
        b0, t0 = sum(m.busy_seconds for m in models), time.perf_counter()
        rnd = speculative_round(target, drafter, context[:n], k, params, rng)
        if i >= 2:
            wall += time.perf_counter() - t0
            busy += sum(m.busy_seconds for m in models) - b0
        for tok in rnd.draft.tokens[: rnd.kept] + [rnd.next_token]:
            context[n] = tok
            n += 1
    return {"python_ms_per_round": round(1000 * (wall - busy) / rounds, 4),
            "llama_ms_per_round": round(1000 * busy / rounds, 4)}


def logits_copy_seconds(target: Any, kmax: int, reps: int = 20) -> list[float]:
    """Median seconds to copy n rows of logits out of llama.cpp's buffer, n = 1..kmax+1."""
    base = target.tokenize("The quick brown fox jumps over the lazy dog. ", add_special=False)
    probe = (base * (kmax + 2))[: kmax + 2]
    target.reset()
    target.eval(probe[:1], logits="none")
    out = []
    for n in range(1, kmax + 2):
        rows = target.eval(probe[1 : n + 1], logits="all")
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            rows.copy()
            times.append(time.perf_counter() - t0)
        out.append(float(np.median(times)))
        target.truncate(1)
    return out


def generation_overheads(target: Any, draft: Any, profile: dict[str, Any], tokens: int) -> dict[str, Any]:
    """The engine's own figures for whole generations (``GenerationStats``) per method, auto deciding by
    ``profile``: Python milliseconds per round outside llama.cpp, the emit loop and auto's choices included.

    Random weights may pick an end-of-generation token early; ``rounds`` says how many there were.
    """
    from localspec.api import Pair
    from localspec.costs import CostProfile

    pair = Pair(target, draft, history=False)  # not closed here: the caller owns the models
    pair.set_profile(CostProfile(profile["verify_seconds"], profile["draft_step_seconds"], profile["lookup_seconds"]))
    prompt = target.tokenize("def merge(a, b):\n    out = []\n    i = j = 0\n" * 3, add_special=False)
    out = {}
    for method, k in (("plain", None), ("lookup", None), ("draft", 4), ("auto", None)):
        stats = pair.generate(prompt, max_tokens=tokens, method=method, k=k).stats
        out[method] = {"rounds": stats.rounds, "tokens": stats.generated_tokens,
                       "python_ms_per_round": round(stats.overhead_ms_per_round, 4),
                       "decode_ms_per_token": round(1000 / stats.decode_tokens_per_second, 4)
                       if stats.decode_tokens_per_second else None}
    return out


def overheads(target: Any, draft: Any, profile: dict[str, Any], kmax: int, rounds: int) -> dict[str, Any]:
    """Python time per round outside llama.cpp (single rounds, plain and draft model, greedy and sampled; whole
    generations per method) and the time to copy logits rows."""
    from localspec.drafters import ModelDrafter
    from localspec.options import SamplingParams

    greedy, sampled = SamplingParams(), SamplingParams(temperature=0.7, top_p=0.9)
    out: dict[str, Any] = {"rounds": rounds}
    for name, params in (("greedy", greedy), ("sampled", sampled)):
        out[f"plain_{name}"] = round_overhead(target, None, 0, params, rounds)
        out[f"draft4_{name}"] = round_overhead(target, ModelDrafter(draft, params), 4, params, rounds)
    out["generation"] = generation_overheads(target, draft, profile, rounds)
    out["logits_copy_seconds"] = logits_copy_seconds(target, kmax)
    target.reset()
    draft.reset()
    return out


def cli_calibrate(models: dict[str, Any], home: Path, env: dict[str, str], timeout: float) -> dict[str, Any]:
    """``localspec calibrate --json`` on the pair through the CLI, in a fresh localspec home."""
    cmd = [sys.executable, "-m", "localspec", "calibrate", "-t", models["target"]["path"],
           "-d", models["draft"]["path"], "--json"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                       env=dict(env, LOCALSPEC_HOME=str(home), LOCALSPEC_HISTORY="off"))
    if r.returncode != 0:
        raise RuntimeError(f"localspec calibrate exited {r.returncode}: {r.stderr.strip()[-1500:]}")
    return {"command": "localspec calibrate -t TARGET -d DRAFT --json", "seconds": round(time.perf_counter() - t0, 2),
            "result": json.loads(r.stdout.strip().splitlines()[-1]), "stderr": r.stderr.strip()[-1000:]}


# -- the exactness tests ---------------------------------------------------------------------------------------------

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
from localspec.backend import Model
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


# -- the run -------------------------------------------------------------------------------------------------------

def _command_output(cmd: list[str]) -> Optional[str]:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def machine_info() -> dict[str, Any]:
    """The GPU (nvidia-smi), nvcc, CPU and Python."""
    smi = _command_output(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem",
                           "--format=csv,noheader"])
    nvcc = _command_output(["nvcc", "--version"])
    return {"gpu": smi, "nvidia_smi": _command_output(["nvidia-smi"]), "nvcc": nvcc.splitlines()[-1] if nvcc else None,
            "cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
            "numpy": np.__version__}


def llama_info() -> dict[str, Any]:
    """Which llama-cpp-python this run imports, and whether it can offload to a GPU."""
    import llama_cpp as ll

    from localspec.llama import gpu_offload_supported

    lib = Path(ll.__file__).parent / "lib"
    return {"version": ll.__version__, "file": ll.__file__, "gpu_offload": gpu_offload_supported(),
            "libs": sorted(p.name for p in lib.glob("*")) if lib.is_dir() else [],
            "system_info": ll.llama_print_system_info().decode(errors="replace").strip()}


class Report:
    """gpu_check.json, rewritten after every step so a run cut short still says what it did."""

    def __init__(self, out: Path, mode: str):
        self.path = out / "gpu_check.json"
        self.data: dict[str, Any] = {"mode": mode, "started": datetime.datetime.now(datetime.timezone.utc)
                                     .isoformat(timespec="seconds"), "steps": {}}
        self.t0 = time.perf_counter()

    def step(self, name: str, fn: Callable[[], Any]) -> Any:
        """Run one step, keep its result under ``name`` (or its error), save, and return the result."""
        print(f"gpu_check: {name} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            result = fn()
        except Exception as exc:  # one step's failure must not lose the others' results
            self.data["steps"][name] = {"ok": False, "seconds": round(time.perf_counter() - t0, 1),
                                        "error": f"{type(exc).__name__}: {exc}"}
            print(f"gpu_check: {name} FAILED: {exc}", file=sys.stderr, flush=True)
            result = None
        else:
            self.data["steps"][name] = {"ok": True, "seconds": round(time.perf_counter() - t0, 1)}
            if result is not None:
                self.data[name] = result
        self.save()
        return result

    def save(self) -> None:
        self.data["seconds"] = round(time.perf_counter() - self.t0, 1)
        self.path.write_text(json.dumps(self.data, indent=1) + "\n")

    @property
    def ok(self) -> bool:
        return all(s["ok"] for s in self.data["steps"].values())


DEVICE_COMMAND = ('export PYTHONUNBUFFERED=1; set -o pipefail; '
                  'python3 benchmarks/gpu_check.py --build --out "$OUT" 2>&1 | tee "$OUT/run.log"')
DEVICE_CARRY = [".gpu_carry"]
DEVICE_TIMEOUT_S = 600


def device_command() -> str:
    """The device run, as the session with a GPU gives it to the ``run`` tool."""
    return (f"run(command={json.dumps(DEVICE_COMMAND)}, carry={json.dumps(DEVICE_CARRY)}, "
            f"timeout_s={DEVICE_TIMEOUT_S})")


def python_path(args: argparse.Namespace) -> list[str]:
    """Where this run imports from: the built llama_cpp and the carried packages first on the device."""
    paths = [] if args.dry_run else [str(args.site), str(CARRY / "site")]
    return paths + [str(REPO)]


def build_step(rep: Report, args: argparse.Namespace, hints: dict[str, Any], seconds: float) -> None:
    """The build (``--build`` on the device), or what it would run."""
    sdist = CARRY / SDIST_NAME
    if args.build:
        rep.step("build", lambda: build_llama(sdist, args.site, hints, args.out / "build.log", seconds))
        importlib.invalidate_caches()
        return
    src = args.site.parent / SDIST_NAME.removesuffix(".tar.gz")
    rep.step("build", lambda: {"skipped": True, "would_run": shlex.join(build_command(src, args.site)),
                               "cmake_args": " ".join([CUDA_CMAKE_ARGS, *hints["cmake_args"]]),
                               "sdist_present": sdist.is_file()})


def library_step(rep: Report, args: argparse.Namespace, hints: dict[str, Any]) -> Optional[int]:
    """Import llama_cpp (the new build on the device); the GPU layers to use, or None to stop here."""
    def load() -> dict[str, Any]:
        preloaded = [] if args.dry_run else preload_cuda_libs(hints["lib_dirs"])
        return dict(llama_info(), preloaded=preloaded, cuda_hints=hints)

    info = rep.step("llama_cpp", load)
    if info is not None and not args.dry_run and not info["gpu_offload"]:
        rep.data["steps"]["llama_cpp"].update(ok=False, error="this llama-cpp-python build cannot offload to a GPU")
        rep.save()
        return None
    return None if info is None else -1 if info["gpu_offload"] else 0


def measure_steps(rep: Report, args: argparse.Namespace, models: dict[str, Any], ngl: int) -> None:
    """Calibration and overheads in this process, on one loaded pair."""
    target, draft = load_pair(models, ngl)
    try:
        profile = rep.step("calibration", lambda: calibrate(target, draft, args.kmax))
        if profile is not None:
            rep.step("overheads", lambda: overheads(target, draft, profile, args.kmax, args.rounds))
    finally:
        target.close()
        draft.close()


def check(args: argparse.Namespace, work: Path) -> bool:
    """Every step of the check, into ``args.out``; True when all passed."""
    deadline = time.perf_counter() + args.budget

    def left(margin: float) -> float:
        return max(10.0, deadline - time.perf_counter() - margin)

    entries = python_path(args)
    sys.path[:0] = entries
    hints = cuda_hints(work if args.dry_run else args.site.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(entries + [os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    if not args.dry_run:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(hints["lib_dirs"] + [os.environ.get("LD_LIBRARY_PATH", "")])
    rep = Report(args.out, "dry-run" if args.dry_run else "device")
    rep.data.update(scale=args.scale, kmax=args.kmax, device_command=device_command())
    rep.step("machine", machine_info)
    build_step(rep, args, hints, left(120))
    ngl = library_step(rep, args, hints)
    models = None if ngl is None else rep.step("models", lambda: make_models(json.loads(SPEC.read_text()),
                                                                           args.scale, work))
    if models is None:
        return False
    measure_steps(rep, args, models, ngl)
    rep.step("cli_calibrate", lambda: cli_calibrate(models, work / "home", env, left(15)))
    rep.step("offload_probe", lambda: offload_probe(work, env))
    tests = DRY_RUN_TESTS if args.dry_run else EXACTNESS_TESTS
    rep.step("tests", lambda: run_tests(tests, args.out, env, left(10)))
    return rep.ok and rep.data["tests"]["failed"] == rep.data["tests"]["errors"] == 0


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[2:]))
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write-spec", action="store_true", help=f"write {SPEC.name} from the real pair's headers")
    mode.add_argument("--prepare-carry", action="store_true", help="fill .gpu_carry/ for the device run")
    mode.add_argument("--device-command", action="store_true", help="print the device run and exit")
    ap.add_argument("--out", type=Path, help="folder for gpu_check.json and the logs")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny scale, no build, a few tests (CI)")
    ap.add_argument("--build", action="store_true", help="build llama-cpp-python with CUDA first (device)")
    ap.add_argument("--scale", type=float, default=None,
                    help=f"model size: 1 = the real shapes (default), less = fewer layers, narrower "
                         f"(dry run: {DRY_RUN_SCALE})")
    ap.add_argument("--kmax", type=int, default=16, help="verify curve up to kmax+1 tokens (default 16)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds per overhead figure (default 50, dry run 20)")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds the whole run may take; the build and the tests stop in time to report "
                         "(default 560, dry run 600)")
    ap.add_argument("--site", type=Path, default=DEFAULT_SITE,
                    help=f"where the build installs (default {DEFAULT_SITE})")
    ap.add_argument("--work", type=Path, default=None,
                    help=f"folder for the models (default {DEFAULT_WORK}; dry run: a temporary one)")
    ap.add_argument("--sdist", type=Path, default=None, help="llama-cpp-python sdist for --prepare-carry "
                    "(default: ~/.cache/localspec/sdist, downloaded with pip once)")
    ap.add_argument("--target", type=Path, default=REAL_MODELS / "target.gguf", help="real target for --write-spec")
    ap.add_argument("--draft", type=Path, default=REAL_MODELS / "draft.gguf", help="real draft for --write-spec")
    args = ap.parse_args(argv)
    checking = not (args.write_spec or args.prepare_carry or args.device_command)
    if checking and args.out is None:
        ap.error("--out DIR is required for the check (or give --write-spec, --prepare-carry or --device-command)")
    if args.scale is not None and not 0 < args.scale <= 1:
        ap.error(f"--scale must be in (0, 1] (1 = the real shapes), got {args.scale}")
    if not 1 <= args.kmax <= 64:
        ap.error(f"--kmax must be from 1 to 64, got {args.kmax}")
    if args.build and args.dry_run:
        ap.error("--build and --dry-run exclude each other: the dry run never builds")
    args.scale = args.scale if args.scale is not None else DRY_RUN_SCALE if args.dry_run else 1.0
    args.rounds = args.rounds or (20 if args.dry_run else 50)
    args.budget = args.budget or (600.0 if args.dry_run else 560.0)
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    if args.write_spec:
        spec = write_spec(args.target, args.draft, SPEC)
        print(f"wrote {SPEC} ({SPEC.stat().st_size} bytes; {', '.join(spec['models'])})")
        return 0
    if args.prepare_carry:
        info = prepare_carry(args.sdist)
        print(json.dumps(info, indent=1))
        print(f"{CARRY} holds {info['total_bytes'] / 2**20:.1f} MiB; the device run carries it:\n{device_command()}")
        return 0
    if args.device_command:
        print(device_command())
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.dry_run:
        args.site.mkdir(parents=True, exist_ok=True)  # on sys.path from the start, filled by the build
    temp = tempfile.TemporaryDirectory(prefix="gpu_check-") if args.dry_run and not args.work else None
    work = Path(temp.name) if temp else (args.work or DEFAULT_WORK)  # on the device: kept for a second call
    work.mkdir(parents=True, exist_ok=True)
    try:
        ok = check(args, work)
    finally:
        if temp is not None:
            temp.cleanup()
    print(f"gpu_check: {'all steps passed' if ok else 'FAILED (see the steps in gpu_check.json)'}; "
          f"results in {args.out / 'gpu_check.json'}")
    if args.dry_run:
        print(f"On a GPU machine, after `python benchmarks/gpu_check.py --prepare-carry` here:\n{device_command()}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
