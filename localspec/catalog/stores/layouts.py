"""Where each tool keeps its GGUFs: the five layouts the scan reads (see the package's docstring)."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Iterator, Optional, Sequence, Union

from .found import Skipped
from .walk import Walker, is_dir, why

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_PROJECTOR_LAYER = "application/vnd.ollama.image.projector"
OLLAMA_REGISTRY = "registry.ollama.ai"
OLLAMA_NAMESPACE = "library"
MAX_MANIFEST = 1 << 20  # an Ollama manifest is a few hundred bytes

_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")
#: A Hugging Face file name with its revision: ``FILE@REV``.
REV = re.compile(r"^(.*)@([0-9a-f]{7,40})$")

Candidate = tuple[str, Path, str]  # name, path, store


def ollama_models(roots: Sequence[Path], walk: Walker) -> Iterator[Union[Candidate, Skipped]]:
    for root in roots:
        manifests = root / "manifests"
        for registry in walk.entries(manifests):
            for namespace in walk.entries(Path(registry.path)):
                for model in walk.entries(Path(namespace.path)):
                    for tag in walk.entries(Path(model.path)):
                        if tag.name.startswith("."):
                            continue
                        name = ollama_name(registry.name, namespace.name, model.name, tag.name)
                        yield ollama_blob(root, Path(tag.path), name)


def ollama_name(registry: str, namespace: str, model: str, tag: str) -> str:
    """Ollama's short name for a manifest: ``ollama:qwen2.5-coder:7b``, ``ollama:user/model:tag``."""
    prefix = "" if registry == OLLAMA_REGISTRY else f"{registry}/"
    if prefix or namespace != OLLAMA_NAMESPACE:
        prefix += f"{namespace}/"
    return f"ollama:{prefix}{model}:{tag}"


def ollama_blob(root: Path, manifest: Path, name: str) -> Union[Candidate, Skipped]:
    """The model blob a manifest names, or why it cannot be used."""
    try:
        if not stat.S_ISREG(manifest.stat().st_mode):  # a FIFO or a device would block or never end
            return Skipped(name, f"its manifest {manifest} is not a regular file.")
        with open(manifest, "rb") as f:
            raw = f.read(MAX_MANIFEST + 1)
        if len(raw) > MAX_MANIFEST:
            return Skipped(name, f"its manifest {manifest} is too large to be an Ollama manifest.")
        data = json.loads(raw)
    except OSError as exc:
        return Skipped(name, f"its manifest {manifest} cannot be read ({why(exc)}).")
    except (ValueError, RecursionError):
        return Skipped(name, f"its manifest {manifest} is not JSON; `ollama pull` the model again.")
    layers = data.get("layers") if isinstance(data, dict) else None
    if not isinstance(layers, list):
        return Skipped(name, f"its manifest {manifest} has no layers; `ollama pull` the model again.")
    digest = next((layer.get("digest") for layer in layers
                   if isinstance(layer, dict) and layer.get("mediaType") == OLLAMA_MODEL_LAYER), None)
    if digest is None:
        return Skipped(name, f"its manifest {manifest} has no GGUF model layer ({OLLAMA_MODEL_LAYER}).")
    m = _DIGEST.match(digest) if isinstance(digest, str) else None
    if not m:
        return Skipped(name, f"its manifest {manifest} names the model layer {digest!r}, not a sha256 digest.")
    blob = root / "blobs" / f"sha256-{m.group(1)}"
    if not os.path.lexists(blob):
        return Skipped(name, f"its manifest points at blob {blob.name}, which is missing from {blob.parent}; "
                             f"`ollama pull {name[len('ollama:'):]}` again.")
    return name, blob, "ollama"


def find_projector(model: Path) -> Optional[Path]:
    """The vision projector that goes with a model file, if one does: an ``mmproj`` GGUF beside it (the Hub's
    and LM Studio's layouts keep it there; among several, the one whose name shares most with the model's, F16
    first), or the projector layer of the Ollama manifest that names the blob."""
    return _projector_beside(model) or ollama_projector(model)


def _projector_beside(model: Path) -> Optional[Path]:
    found = {p.name: p for p in model.parent.glob("*.gguf")}
    best = best_projector(sorted(found), model.name)
    return found[best] if best is not None else None


def best_projector(names: Sequence[str], model: str) -> Optional[str]:
    """Among file names, the ``mmproj`` GGUF that goes with the model file named ``model``: the one whose name
    shares most with the model's after ``mmproj-``, F16 first; None where there is none."""
    stem = model.lower().removesuffix(".gguf")

    def score(name: str) -> tuple[int, bool]:
        own = name.lower().removesuffix(".gguf").removeprefix("mmproj").lstrip("-_.")
        return len(os.path.commonprefix([own, stem])), "f16" in own

    found = [n for n in names if n.lower().startswith("mmproj") and n.lower().endswith(".gguf")]
    return max(found, key=score) if found else None


def ollama_projector(blob: Path) -> Optional[Path]:
    """The vision projector Ollama keeps beside a model blob (its manifest's projector layer), if any: a model
    that sees is pulled as two blobs, the model and its ``mmproj``."""
    if blob.parent.name != "blobs" or not blob.name.startswith("sha256-"):
        return None
    root, digest = blob.parent.parent, "sha256:" + blob.name[len("sha256-"):]
    for manifest in sorted((root / "manifests").rglob("*")):
        try:
            if not manifest.is_file() or manifest.stat().st_size > MAX_MANIFEST:
                continue
            layers = json.loads(manifest.read_bytes()).get("layers") or []
        except (OSError, ValueError, AttributeError, RecursionError):
            continue  # the scan says what is wrong with a manifest; here it only does not name a projector
        kinds = {layer.get("mediaType"): layer.get("digest") for layer in layers if isinstance(layer, dict)}
        m = _DIGEST.match(kinds.get(OLLAMA_PROJECTOR_LAYER) or "")
        if kinds.get(OLLAMA_MODEL_LAYER) == digest and m:
            found = root / "blobs" / f"sha256-{m.group(1)}"
            return found if found.is_file() else None
    return None


def lmstudio_models(roots: Sequence[Path], walk: Walker) -> Iterator[Union[Candidate, Skipped]]:
    for root in roots:
        for path in walk.files(root, 4):
            yield f"lmstudio:{path.relative_to(root).as_posix()}", path, "lmstudio"


def _hf_layout(root: Path, walk: Walker, prefix: str, store: str) -> Iterator[Union[Candidate, Skipped]]:
    """GGUFs in a Hugging Face style cache: ``models--org--name/snapshots/<rev>/...``."""
    for repo_dir in walk.entries(root):
        if not repo_dir.name.startswith("models--") or not is_dir(repo_dir):
            continue
        repo = repo_dir.name[len("models--"):].replace("--", "/")
        snapshots = Path(repo_dir.path) / "snapshots"
        main = read_ref(Path(repo_dir.path) / "refs" / "main")
        listed = walk.entries(snapshots)
        revs = [e for e in listed if e.name == main] + [e for e in listed if e.name != main]
        names: set[str] = set()
        for rev in revs:
            rev_dir = Path(rev.path)
            for path in walk.files(rev_dir, 4):
                name = f"{prefix}{repo}/{path.relative_to(rev_dir).as_posix()}"
                if name in names:  # the same file name in an older revision
                    name = f"{name}@{rev.name[:12]}"
                names.add(name)
                yield name, path, store


def read_ref(path: Path) -> Optional[str]:
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def hf_models(roots: Sequence[Path], walk: Walker) -> Iterator[Union[Candidate, Skipped]]:
    for root in roots:
        yield from _hf_layout(root, walk, "hf:", "hf")


def llamacpp_models(roots: Sequence[Path], walk: Walker) -> Iterator[Union[Candidate, Skipped]]:
    for root in roots:
        for e in walk.entries(root):
            if e.name.lower().endswith(".gguf") and not is_dir(e):
                yield f"llamacpp:{e.name}", Path(e.path), "llamacpp"
        yield from _hf_layout(root, walk, "llamacpp:", "llamacpp")


def folder_models(roots: Sequence[Path], walk: Walker, max_depth: int) -> Iterator[Union[Candidate, Skipped]]:
    for root in roots:
        try:
            mode = root.stat().st_mode
        except FileNotFoundError:
            yield Skipped(str(root), "does not exist; check the folder's name.")
            continue
        except OSError as exc:  # pathlib's exists() and is_file() let EACCES through
            yield Skipped(str(root), f"cannot be read ({why(exc)}).")
            continue
        if stat.S_ISREG(mode) and root.name.lower().endswith(".gguf"):
            yield str(root), root, "folder"
            continue
        for path in walk.files(root, max_depth):
            yield str(path), path, "folder"
