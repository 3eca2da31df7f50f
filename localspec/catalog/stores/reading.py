"""Reading what the layouts list: one file's header (split models, projectors and adapters), and the scan."""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import replace
from pathlib import Path
from typing import Iterable, Iterator, Optional, Union

from ...errors import ModelFileError
from ...runtime.gguf_metadata import GGUFHeader, read_local
from .found import FoundModel, PathLike, Roots, Say, Scan, Skipped, quiet
from .layouts import Candidate, folder_models, hf_models, llamacpp_models, lmstudio_models, ollama_models
from .walk import Walker, why

DEFAULT_DEPTH = 6
_SPLIT = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


def split_parts(path: Path) -> Optional[tuple[int, list[Path]]]:
    """For ``x-00001-of-00003.gguf``: (this part's number, every part's path); None when not split."""
    m = _SPLIT.match(path.name)
    if not m:
        return None
    part, count = int(m.group(2)), int(m.group(3))
    if not 1 <= part <= count:  # "-00002-of-00000": not a split model's name after all
        return None
    return part, [path.with_name(f"{m.group(1)}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def first_part(path: Path) -> Path:
    """A split model's first part (what llama.cpp loads); any other path as it is."""
    split = split_parts(path)
    return path if split is None else split[1][0]


def read_model(path: Path) -> FoundModel:
    """One GGUF given by its path, read as the scan reads the files it finds.

    Raises:
        ModelFileError: ``path`` is not a readable GGUF language model (the message says why).
    """
    result = inspect(str(path), path, "path", {})
    if isinstance(result, Skipped):
        raise ModelFileError(result.why)
    assert result is not None  # a fresh ``seen`` has listed nothing yet
    return result


def _not_a_model(path: Path, header: GGUFHeader) -> Optional[str]:
    """Why a GGUF is not a language model (a projector, an adapter...), or None if it is one."""
    kind = header.model_type
    if kind == "mmproj" or header.architecture == "clip" or path.name.lower().startswith("mmproj"):
        return "is a vision projector (mmproj), loaded with the model it lies beside (or given with --mmproj)."
    if kind == "adapter":
        return "is a LoRA adapter, not a model; load it with its base model."
    if kind not in (None, "model"):
        return f"is a GGUF of type {kind!r}, not a language model."
    return None


def inspect(name: str, path: Path, store: str, seen: dict[tuple[int, int], Optional[FoundModel]],
             smaller_than: Optional[int] = None) -> Union[FoundModel, Skipped, None]:
    """Read one candidate: a FoundModel, a Skipped saying why not, or None (already listed, a later split part,
    or not smaller than ``smaller_than`` bytes)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            return Skipped(name, f"{path} is a dangling symlink (to {os.readlink(path)}).")
        return Skipped(name, f"{path} does not exist.")
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return Skipped(name, f"{path} is a symlink loop; remove it or point it at the model file.")
        return Skipped(name, f"{path} cannot be read ({why(exc)}).")
    if not stat.S_ISREG(st.st_mode):
        return Skipped(name, f"{path} is not a regular file.")
    if smaller_than is not None and st.st_size >= smaller_than:
        return None
    key = (st.st_dev, st.st_ino)
    if key in seen:
        earlier = seen[key]
        if earlier is not None:
            earlier.aliases.append(name)
        return None  # listed, or skipped with a reason, under its first name
    seen[key] = None
    size = st.st_size
    split = split_parts(path)
    if split is not None:
        part, parts = split
        if part != 1:
            if os.path.exists(parts[0]):
                return None  # listed with its first part
            return Skipped(name, f"{path} is part {part} of a split model whose first part {parts[0].name} is "
                                 "missing; download every part.")
        missing = [p.name for p in parts if not os.path.exists(p)]
        if missing:
            verb = "is" if len(missing) == 1 else "are"
            return Skipped(name, f"{path} is the first part of a split model, but {', '.join(missing)} {verb} "
                                 "missing; download every part.")
        size = sum(p.stat().st_size for p in parts)
    try:
        header = read_local(path)
    except ModelFileError as exc:
        return Skipped(name, str(exc))
    reason = _not_a_model(path, header)
    if reason:
        return Skipped(name, f"{path} {reason}")
    found = FoundModel(name, path, store, size, header)
    seen[key] = found
    return found


# -- scanning -------------------------------------------------------------------


def scan(roots: Optional[Roots] = None, *, folders: Iterable[PathLike] = (), say: Say = quiet,
         max_depth: int = DEFAULT_DEPTH, smaller_than: Optional[int] = None) -> Scan:
    """List every GGUF language model in the stores, reading only their headers.

    Args:
        roots: where the stores are (default: ``Roots.default()``, from the environment).
        folders: more folders to search (added to ``roots.folders``).
        say: called with one line for each entry skipped.
        max_depth: how many folders down named folders are searched.
        smaller_than: leave out, unread and unsaid, files of at least this many bytes (looking for
            drafts of a target of that size, nothing larger can be one).

    Returns:
        The models (each file once, in store order, then by name) and what was skipped.
    """
    roots = roots or Roots.default()
    if folders:
        roots = replace(roots, folders=roots.folders + tuple(Path(f).expanduser() for f in folders))
    skipped: list[Skipped] = []
    walk = Walker(skipped)
    seen: dict[tuple[int, int], Optional[FoundModel]] = {}
    models: list[FoundModel] = []
    sources: list[Iterator[Union[Candidate, Skipped]]] = [
        ollama_models(roots.ollama, walk), lmstudio_models(roots.lmstudio, walk), hf_models(roots.hf, walk),
        llamacpp_models(roots.llamacpp, walk), folder_models(roots.folders, walk, max_depth),
    ]
    reported = 0
    for source in sources:
        for item in source:
            result = inspect(*item, seen, smaller_than) if isinstance(item, tuple) else item
            if isinstance(result, FoundModel):
                models.append(result)
            elif isinstance(result, Skipped):
                skipped.append(result)
            for s in skipped[reported:]:  # the walker appends too
                say(str(s))
            reported = len(skipped)
    return Scan(models, skipped)
