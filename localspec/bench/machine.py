"""The machine a bench ran on: CPU, offload, threads, library version, model files and checksums."""

from __future__ import annotations

import hashlib
import os
import platform
from pathlib import Path
from typing import Any

from ..api import Pair
from ..runtime.hugepages import thp_mode
from ..runtime.process import gpu_offload_supported


def host_info() -> dict[str, Any]:
    """The CPU, its cores, the platform, Python, llama-cpp-python and whether it was built for a GPU."""
    import llama_cpp

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "llama_cpp_python": llama_cpp.__version__, "gpu_offload_build": gpu_offload_supported()}


def machine_info(pair: Pair, checksums: bool = True) -> dict[str, Any]:
    """CPU, offload, threads, library version, model files and checksums."""
    models = {}
    for role, model in (("target", pair.target), ("draft", pair.draft)):
        if model is None:
            continue
        info: dict[str, Any] = {"path": str(model.path), "bytes": model.path.stat().st_size}
        if checksums:
            h = hashlib.sha256()
            with open(model.path, "rb") as f:
                while block := f.read(1 << 22):
                    h.update(block)
            info["sha256"] = h.hexdigest()
        models[role] = info
    return {
        **host_info(),
        "gpu_layers": pair.target.n_gpu_layers, "threads": pair.target.n_threads,
        "threads_batch": pair.target.n_threads_batch,
        "flash_attn": pair.target.flash_attn, "n_ctx": pair.target.n_ctx, "models": models,
        "transparent_huge_pages": thp_mode(), "huge_page_bytes": pair.target.huge_page_bytes,
    }
