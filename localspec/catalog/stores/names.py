"""The scan's names (``ollama:NAME:TAG``, ``lmstudio:...``, ``hf:...``, ``llamacpp:...``) turned back into files,
without scanning everything."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Optional, Sequence

from ...errors import ConfigError, ModelFileError
from .found import FoundModel, Roots, Skipped
from .layouts import OLLAMA_NAMESPACE, OLLAMA_REGISTRY, REV, ollama_blob, ollama_name, read_ref

#: Prefixes of the names ``resolve_name`` understands.
PREFIXES = ("ollama:", "lmstudio:", "hf:", "llamacpp:")


def is_store_name(ref: str) -> bool:
    """True if ``ref`` is one of the scan's names (``ollama:``, ``lmstudio:``, ``hf:``, ``llamacpp:``)."""
    return ref.startswith(PREFIXES)


def _parts(ref: str, body: str, at_least: int) -> list[str]:
    parts = body.split("/")
    if len(parts) < at_least or any(p in ("", ".", "..") for p in parts) or "\\" in body:
        raise ConfigError(f"{ref!r} is not a valid model name; `localspec models --scan` lists the names "
                          "of the models on this machine.")
    return parts


def resolve_name(ref: str, found: Optional[Sequence[FoundModel]] = None, roots: Optional[Roots] = None) -> Path:
    """The file a scan name refers to, without scanning everything.

    Args:
        ref: ``ollama:NAME[:TAG]`` (tag ``latest`` when left out), ``lmstudio:PUBLISHER/REPO/FILE``,
            ``hf:ORG/REPO/FILE`` (in the local Hugging Face cache only), or ``llamacpp:FILE``.
        found: a scan's models; a name or alias among them is used first.
        roots: where the stores are (default: ``Roots.default()``).

    Raises:
        ConfigError: ``ref`` is not such a name.
        ModelFileError: the model is not on this machine (the message says what to run).
    """
    for m in found or ():
        if ref in m.names:
            return m.path
    roots = roots or Roots.default()
    prefix, _, body = ref.partition(":")
    if prefix == "ollama":
        return _resolve_ollama(ref, body, roots.ollama)
    if prefix == "lmstudio":
        parts = _parts(ref, body, 1)
        for root in roots.lmstudio:
            p = root.joinpath(*parts)
            if _is_file(p):
                return p
        raise ModelFileError(f"{ref} is not in LM Studio's models folder ({_listed(roots.lmstudio)}); download it "
                             "in LM Studio, or run `localspec models --scan` to see what is there.")
    if prefix == "hf":
        parts = _parts(ref, body, 3)
        hit = _resolve_hf(parts, roots.hf)
        if hit is None:
            repo, file = "/".join(parts[:2]), REV.sub(r"\1", "/".join(parts[2:]))
            raise ModelFileError(f"{ref} is not in the Hugging Face cache ({_listed(roots.hf)}); download it first "
                                 f"with `localspec pull NAME --target hf:{repo}/{file}`.")
        return hit
    if prefix == "llamacpp":
        parts = _parts(ref, body, 1)
        for root in roots.llamacpp:
            hit = root / parts[0] if len(parts) == 1 else _resolve_hf(parts, (root,))
            if hit is not None and _is_file(hit):
                return hit
        raise ModelFileError(f"{ref} is not in llama.cpp's cache ({_listed(roots.llamacpp)}); run "
                             "`localspec models --scan` to see what is there.")
    raise ConfigError(f"{ref!r} is not a model name localspec knows: use a path, a pair name, or a scan name "
                      "starting with ollama:, lmstudio:, hf: or llamacpp:.")


def _listed(paths: Sequence[Path]) -> str:
    return ", ".join(str(p) for p in paths) or "none configured"


def _resolve_ollama(ref: str, body: str, roots: Sequence[Path]) -> Path:
    name, tag = body, "latest"
    if ":" in body.rsplit("/", 1)[-1]:
        name, tag = body.rsplit(":", 1)
    parts = _parts(ref, name, 1)
    if len(parts) > 3 or not tag or "/" in tag or tag in (".", ".."):
        raise ConfigError(f"{ref!r} is not a valid Ollama model name (expected ollama:[NAMESPACE/]MODEL[:TAG]).")
    if len(parts) == 1:
        full = [OLLAMA_REGISTRY, OLLAMA_NAMESPACE, *parts]
    elif len(parts) == 2:
        full = [OLLAMA_REGISTRY, *parts]
    else:
        full = parts
    for root in roots:
        manifest = root.joinpath("manifests", *full, tag)
        if _is_file(manifest):
            result = ollama_blob(root, manifest, ollama_name(full[0], full[1], full[2], tag))
            if isinstance(result, Skipped):
                raise ModelFileError(f"{ref}: {result.why}")
            return result[1]
    short = body if ":" in body.rsplit("/", 1)[-1] else f"{body}:{tag}"
    raise ModelFileError(f"{ref} is not in Ollama's models folder ({_listed(roots)}); run `ollama pull {short}` "
                         "first, or set OLLAMA_MODELS to where Ollama keeps its models.")


def _resolve_hf(parts: Sequence[str], roots: Sequence[Path]) -> Optional[Path]:
    """A file in a Hugging Face style cache (the revision ``main`` points at first), or None."""
    org, repo, *file = parts
    rel = "/".join(file)
    want_rev = None
    m = REV.match(rel)
    if m:
        rel, want_rev = m.group(1), m.group(2)
    for root in roots:
        repo_dir = root / f"models--{org}--{repo}"
        snapshots = repo_dir / "snapshots"
        try:
            revs = sorted(os.listdir(snapshots))
        except OSError:
            continue
        main = read_ref(repo_dir / "refs" / "main")
        revs = [r for r in revs if r == main] + [r for r in revs if r != main]
        for rev in revs:
            if want_rev and not rev.startswith(want_rev):
                continue
            p = snapshots / rev / rel
            if _is_file(p):
                return p
    return None


def _is_file(p: Path) -> bool:
    """``Path.is_file`` that also answers False for a path it may not look at (EACCES)."""
    try:
        return stat.S_ISREG(p.stat().st_mode)
    except OSError:
        return False
