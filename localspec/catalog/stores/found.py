"""What a scan finds: the models, what it skipped and why, and where each store lives."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional, Union

from ...runtime.gguf_metadata import GGUFHeader
from ...runtime.vocab_match import VocabInfo
from ...sizes import human_bytes, human_count
from ..hub import hub_cache_dir

Say = Callable[[str], None]
PathLike = Union[str, "os.PathLike[str]"]

#: Store names, in the order they are scanned (the first name found for a file is its name).
STORES = ("ollama", "lmstudio", "hf", "llamacpp", "folder")


def quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class Skipped:
    """An entry that was not listed, and why (one sentence)."""

    where: str
    why: str

    def __str__(self) -> str:
        return f"skipped {self.where}: {self.why}"


@dataclass
class FoundModel:
    """A GGUF model found on this machine.

    Attributes:
        name: the readable name (``ollama:qwen2.5-coder:7b``, ``hf:org/repo/file.gguf``, or a path).
        path: the file to load (for a split model, its first part).
        store: which store it was found in (one of ``STORES``).
        size: bytes on disk (all parts of a split model).
        header: its parsed GGUF header.
        aliases: other names that reach the same file.
    """

    name: str
    path: Path
    store: str
    size: int
    header: GGUFHeader = field(repr=False)
    aliases: list[str] = field(default_factory=list)

    @property
    def architecture(self) -> Optional[str]:
        """``general.architecture``."""
        return self.header.architecture

    @property
    def parameters(self) -> Optional[int]:
        """The parameter count, stated or estimated from the size label; None when the file gives neither."""
        return self.header.parameters

    @property
    def size_label(self) -> Optional[str]:
        """``general.size_label`` (e.g. ``1.5B``), or None."""
        return self.header.size_label

    @property
    def quantization(self) -> Optional[str]:
        """The file type's name (``Q4_K_M``...), or None."""
        return self.header.quantization

    @property
    def mtp_layers(self) -> int:
        """Next-n (MTP) layers: a head that drafts for this model with no draft file (0: none)."""
        return self.header.mtp_layers

    @property
    def role(self) -> Optional[str]:
        """``"embedding"`` or ``"reranker"`` for a model whose header pools its tokens (it gives vectors or
        scores, not text: ``localspec.load_embedding`` loads it), else None."""
        pooling = self.header.metadata.get(f"{self.architecture}.pooling_type")
        if not isinstance(pooling, int) or pooling <= 0:
            return None
        return "reranker" if pooling == 4 else "embedding"  # llama.cpp's LLAMA_POOLING_TYPE_RANK is 4

    @property
    def fingerprint(self) -> Optional[str]:
        """The vocabulary fingerprint (``GGUFHeader.vocab_fingerprint``); None without a tokenizer."""
        return self.header.vocab_fingerprint()

    @property
    def n_tokens(self) -> int:
        """The vocabulary's size."""
        return self.header.n_tokens

    @property
    def names(self) -> list[str]:
        """The name and every alias."""
        return [self.name, *self.aliases]

    def vocab(self) -> VocabInfo:
        """The vocabulary, as llama.cpp would read it, with this model's path."""
        return self.header.vocab(self.path)

    def label(self) -> str:
        """The size as people say it: the size label, the parameter count (``1.5B``) or the file size."""
        if self.size_label:
            return self.size_label
        if self.parameters:
            return human_count(self.parameters)
        return human_bytes(self.size)



@dataclass
class Scan:
    """What ``scan`` found: the models, and what it skipped."""

    models: list[FoundModel]
    skipped: list[Skipped]


@dataclass(frozen=True)
class Roots:
    """Where each store lives. ``Roots.default()`` reads the environment; tests pass their own."""

    ollama: tuple[Path, ...] = ()
    lmstudio: tuple[Path, ...] = ()
    hf: tuple[Path, ...] = ()
    llamacpp: tuple[Path, ...] = ()
    folders: tuple[Path, ...] = ()

    @classmethod
    def default(cls, folders: Iterable[PathLike] = ()) -> Roots:
        """Every store at its usual place (environment variables honoured), plus ``folders``."""
        return cls(ollama_roots(), lmstudio_roots(), (hub_cache_dir(),), llamacpp_roots(),
                   tuple(Path(f).expanduser() for f in folders))


def ollama_roots() -> tuple[Path, ...]:
    """``$OLLAMA_MODELS``, else ``~/.ollama/models`` (and the Linux service's models folder)."""
    env = os.environ.get("OLLAMA_MODELS")
    if env:
        return (Path(env).expanduser(),)
    roots = [Path("~/.ollama/models").expanduser()]
    if sys.platform.startswith("linux"):
        roots.append(Path("/usr/share/ollama/.ollama/models"))
    return tuple(roots)


def lmstudio_roots() -> tuple[Path, ...]:
    """``~/.lmstudio/models`` and the older ``~/.cache/lm-studio/models``."""
    return (Path("~/.lmstudio/models").expanduser(), Path("~/.cache/lm-studio/models").expanduser())


def llamacpp_roots() -> tuple[Path, ...]:
    """llama.cpp's download cache: ``$LLAMA_CACHE``, else the platform's cache folder plus ``llama.cpp``."""
    env = os.environ.get("LLAMA_CACHE")
    if env:
        return (Path(env).expanduser(),)
    if sys.platform == "darwin":
        return (Path("~/Library/Caches/llama.cpp").expanduser(),)
    if sys.platform == "win32":
        return (Path(os.environ.get("LOCALAPPDATA", "~")).expanduser() / "llama.cpp",)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return (Path(base) / "llama.cpp",)

