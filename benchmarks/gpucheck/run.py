"""One run of the GPU check, step by step, into gpu_check.json; the command line."""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

from .build import build_cmake_args, build_command, build_llama, cuda_hints, preload_cuda_libs, preload_folder
from .costs import calibrate, cli_calibrate, load_pair, overheads
from .exactness import offload_probe, run_tests
from .models import make_models
from .offline import prepare_offline
from .settings import (
    DEFAULT_SITE,
    DEFAULT_WORK,
    DRY_RUN_SCALE,
    DRY_RUN_TESTS,
    EXACTNESS_TESTS,
    OFFLINE,
    REAL_MODELS,
    REPO,
    SDIST_NAME,
    SPEC,
)
from .spec import write_spec


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
            "numpy": importlib.metadata.version("numpy")}


def llama_info() -> dict[str, Any]:
    """Which llama-cpp-python this run imports, and whether it can offload to a GPU."""
    import llama_cpp as ll

    from localspec.runtime.process import gpu_offload_supported

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


GPU_COMMAND = "python3 benchmarks/gpu_check.py --build --out DIR"


def gpu_instruction() -> str:
    """What to run on the GPU machine, once the offline bundle is beside the checkout there."""
    return f"On the GPU machine (no network needed), with this checkout and {OFFLINE.name}/ copied there: {GPU_COMMAND}"


def python_path(args: argparse.Namespace) -> list[str]:
    """Where this run imports from: on the GPU machine the built llama_cpp and the offline bundle's packages first."""
    paths = [] if args.dry_run else [str(args.site), str(OFFLINE / "site")]
    return paths + [str(REPO)]


def build_step(rep: Report, args: argparse.Namespace, hints: dict[str, Any], seconds: float) -> None:
    """The build (``--build``), or what it would run."""
    sdist = OFFLINE / SDIST_NAME
    if args.build:
        rep.step("build", lambda: build_llama(sdist, args.site, hints, args.out / "build.log", seconds))
        importlib.invalidate_caches()
        return
    src = args.site.parent / SDIST_NAME.removesuffix(".tar.gz")
    rep.step("build", lambda: {"skipped": True, "would_run": shlex.join(build_command(src, args.site)),
                               "cmake_args": build_cmake_args(hints),
                               "sdist_present": sdist.is_file()})


def library_step(rep: Report, args: argparse.Namespace, hints: dict[str, Any]) -> Optional[int]:
    """Import llama_cpp (the new build, after ``--build``); the GPU layers to use, or None to stop here."""
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
        env["PYTHONPATH"] = os.pathsep.join([str(preload_folder(work)), env["PYTHONPATH"]])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(hints["lib_dirs"] + [os.environ.get("LD_LIBRARY_PATH", "")])
    rep = Report(args.out, "dry-run" if args.dry_run else "gpu")
    rep.data.update(scale=args.scale, kmax=args.kmax, gpu_command=GPU_COMMAND)
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
    mode.add_argument("--prepare-offline", action="store_true",
                      help=f"fill {OFFLINE.name}/ (needs the network) for a GPU machine without network")
    ap.add_argument("--out", type=Path, help="folder for gpu_check.json and the logs")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny scale, no build, a few tests (CI)")
    ap.add_argument("--build", action="store_true", help="build llama-cpp-python with CUDA first (on the GPU machine)")
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
    ap.add_argument("--sdist", type=Path, default=None, help="llama-cpp-python sdist for --prepare-offline "
                    "(default: ~/.cache/localspec/sdist, downloaded with pip once)")
    ap.add_argument("--target", type=Path, default=REAL_MODELS / "target.gguf", help="real target for --write-spec")
    ap.add_argument("--draft", type=Path, default=REAL_MODELS / "draft.gguf", help="real draft for --write-spec")
    args = ap.parse_args(argv)
    checking = not (args.write_spec or args.prepare_offline)
    if checking and args.out is None:
        ap.error("--out DIR is required for the check (or give --write-spec or --prepare-offline)")
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
    if args.prepare_offline:
        info = prepare_offline(args.sdist)
        print(json.dumps(info, indent=1))
        print(f"{OFFLINE} holds {info['total_bytes'] / 2**20:.1f} MiB.\n{gpu_instruction()}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.dry_run:
        args.site.mkdir(parents=True, exist_ok=True)  # on sys.path from the start, filled by the build
    temp = tempfile.TemporaryDirectory(prefix="gpu_check-") if args.dry_run and not args.work else None
    work = Path(temp.name) if temp else (args.work or DEFAULT_WORK)  # kept for a second run
    work.mkdir(parents=True, exist_ok=True)
    try:
        ok = check(args, work)
    finally:
        if temp is not None:
            temp.cleanup()
    print(f"gpu_check: {'all steps passed' if ok else 'FAILED (see the steps in gpu_check.json)'}; "
          f"results in {args.out / 'gpu_check.json'}")
    if args.dry_run:
        print(f"Next, on a machine with the network: python benchmarks/gpu_check.py --prepare-offline\n"
              f"{gpu_instruction()}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
