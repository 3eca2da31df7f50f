"""What a model name means: the files behind a pair name, a store name or a path, and a draft found on disk.

``localspec.load`` and the command line both take a target as a path, a
registered pair's name (``qwen2.5-coder-1.5b``), or a name from the model
stores on this machine (``ollama:qwen2.5-coder:7b``, ``lmstudio:...``,
``hf:ORG/REPO/FILE.gguf`` in the local cache); ``resolve_models`` turns it
into files, and, for a target given alone, picks the best draft on disk
with a sentence saying which and why.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

from ..errors import ConfigError, RegistryError
from ..runtime.gguf_metadata import check_gguf, read_local

PathLike = Union[str, os.PathLike]
#: ``draft=`` values: no draft at all, or the best one found on this machine.
NO_DRAFT = "none"
FIND_DRAFT = "auto"


@dataclass
class Resolved:
    """The files a name stands for, and what a pair's registration says about them.

    Attributes:
        target: the target file.
        draft: the draft file, or None.
        n_ctx: the pair's context length (None: not a pair, or none given).
        draft_k: the pair's suggested draft length (None: none).
        notices: sentences for a person: which draft was picked and why, or why none.
        repos: for a pair from the Hub, the repositories of its target and draft.
        mmproj: the vision projector the pair names for its target (None: none named).
    """

    target: Path
    draft: Optional[Path] = None
    n_ctx: Optional[int] = None
    draft_k: Optional[int] = None
    notices: list[str] = field(default_factory=list)
    repos: tuple[Optional[str], Optional[str]] = (None, None)
    mmproj: Optional[Path] = None


def names_a_model(name: str) -> bool:
    """A name that is a model file or one of the stores' names, not a pair's name."""
    from .stores import is_store_name

    return (is_store_name(name) or name.lower().endswith(".gguf") or "/" in name or os.sep in name
            or name.startswith(("~", ".")) or Path(name).expanduser().is_file())


def model_path(ref: PathLike) -> Path:
    """A file path for a path or one of the stores' names (``ollama:NAME:TAG``, ``hf:ORG/REPO/FILE``...)."""
    from .stores import is_store_name, resolve_name

    text = os.fspath(ref)
    return Path(resolve_name(text)) if isinstance(ref, str) and is_store_name(text) else Path(text).expanduser()


def default_draft(method: Optional[str]) -> Optional[str]:
    """The draft a target given alone gets: the best one on this machine (``FIND_DRAFT``) when ``method``
    (None: auto) can draft with a model, else none."""
    from ..methods import AUTO, DRAFT

    return FIND_DRAFT if method in (None, AUTO.name, DRAFT.name) else None


def resolve_models(target: PathLike, draft: Optional[PathLike] = None) -> Resolved:
    """The files for ``target`` and ``draft`` as ``localspec.load`` and the command line take them.

    Args:
        target: a path, a registered pair's name, or a store name.
        draft: a path or store name; ``"none"`` for no draft; ``"auto"`` for the best draft found on
            this machine; None for the pair's own draft (a pair name) or no draft (a file).

    Raises:
        RegistryError: an unknown pair name, or a pair whose files are not downloaded.
        ModelFileError: a file that is missing or not a GGUF.
        ConfigError: a pair name given with a draft of its own.
    """
    if isinstance(target, str) and not names_a_model(target):
        from .hub import resolve
        from .registry import get_pair

        if draft not in (None, NO_DRAFT):
            raise ConfigError(f"Pair {target!r} brings its own draft; give a draft with a target file, "
                              "or draft='none'.")
        try:
            spec = get_pair(target)
        except RegistryError as exc:
            raise RegistryError(f"{exc} Nor is {target!r} a model file here; give its path.") from None
        files = resolve(spec)
        missing = [] if spec.mmproj is None or files.mmproj is not None else [
            f"The vision projector of pair {spec.name!r}, {spec.mmproj.path}, does not exist, so images are off; "
            f"`localspec add {spec.name} ... --mmproj FILE` names another." if spec.mmproj.is_local else
            f"The vision projector of pair {spec.name!r} ({spec.mmproj.describe()}) is not downloaded, so images "
            f"are off; `localspec pull {spec.name}` fetches it."]
        return Resolved(files.target, None if draft == NO_DRAFT else files.draft, spec.ctx, spec.k,
                        notices=missing, repos=(spec.target.repo, spec.draft.repo), mmproj=files.mmproj)
    path = model_path(target)
    if draft is None or draft == NO_DRAFT:
        return Resolved(path)
    if draft == FIND_DRAFT:
        found, notice = draft_on_disk(path)
        return Resolved(path, found, notices=[notice])
    return Resolved(path, model_path(draft))


def draft_on_disk(target: Path) -> tuple[Optional[Path], str]:
    """The best draft for ``target`` among the models beside it and in the stores, and a sentence saying
    which and why (or that there is none, and how to find one)."""
    from .pairing import find_draft
    from .stores import scan

    size = check_gguf(target).stat().st_size  # a missing or foreign target is reported as such
    # Only files smaller than the target can draft for it, so only their headers are read; beside the
    # target, only its own folder (not a whole home directory's tree).
    found = scan(folders=[target.resolve().parent], max_depth=0, smaller_than=size).models
    match = find_draft(str(target), found)
    head = read_local(target).mtp_layers
    if match is None:
        with_head = "its own MTP head, " if head else ""
        return None, (f"localspec: no model on this machine can draft for {target.name} (same vocabulary, "
                      f"several times smaller; `localspec models --scan` lists what there is), so auto drafts "
                      f"with {with_head}lookup and history only; --draft FILE gives one, `localspec pull NAME "
                      "--target hf:ORG/REPO/FILE.gguf` finds one on the Hub")
    return match.draft.path, (f"localspec: drafting with {match.draft.name}: {match.reason} (--draft FILE or "
                              "--draft none overrides)"
                              + ("; the target's own MTP head is a candidate too" if head else ""))
