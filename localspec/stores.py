"""Find the GGUF models already on this machine, and pair targets with drafts.

People who try localspec usually have GGUF files already, pulled by another
tool. This module lists them from the places those tools keep them, reads
each one's header (only the key/value section, see ``gguf_header``) and
groups them into target/draft pairs that share a vocabulary. It never
writes, moves or copies anything.

Stores and their layouts:

* **Ollama** (``$OLLAMA_MODELS``, else ``~/.ollama/models`` and, on Linux,
  the system service's ``/usr/share/ollama/.ollama/models``): a JSON manifest per
  model at ``manifests/<registry>/<namespace>/<model>/<tag>``; the layer whose
  ``mediaType`` is ``application/vnd.ollama.image.model`` names the GGUF by its
  ``digest`` ``sha256:<hex>``, stored as ``blobs/sha256-<hex>``. Named
  ``ollama:<model>:<tag>``, with ``<namespace>/`` in front unless it is
  ``library`` and ``<registry>/`` unless it is ``registry.ollama.ai``.
* **LM Studio** (``~/.lmstudio/models``, and the older ``~/.cache/lm-studio/models``):
  ``<publisher>/<repo>/<file>.gguf``. Named ``lmstudio:<publisher>/<repo>/<file>``.
* **Hugging Face cache** (``hub.hub_cache_dir()``): ``models--<org>--<name>/snapshots/<rev>/<file>``,
  each a symlink into ``blobs/``. Named ``hf:<org>/<name>/<file>``.
* **llama.cpp's cache** (``$LLAMA_CACHE``, else ``$XDG_CACHE_HOME/llama.cpp`` or
  ``~/.cache/llama.cpp``; ``~/Library/Caches/llama.cpp`` on macOS): ``-hf``
  downloads saved flat as ``<org>_<repo>_<file>.gguf`` (named ``llamacpp:<file>``);
  newer releases keep Hugging Face's ``models--<org>--<name>`` layout there
  (named ``llamacpp:<org>/<name>/<file>``).
* **Folders the user names**: every ``*.gguf`` under them, to a bounded depth. Named by path.

Decisions:

* A file reached twice (an HF snapshot and a symlink in LM Studio's folder, the same
  Ollama blob under two tags, a named folder inside a store) is listed once, under
  the first name found (stores in the order above); the other names are kept in
  ``FoundModel.aliases`` and ``resolve_name`` accepts them all.
* A split model (``name-00001-of-00003.gguf``, gguf-split) is listed once, as its
  first part, which is what llama.cpp loads (it opens the other parts itself); its
  size is the sum of the parts. If a part is missing it is skipped with a reason.
* Multimodal projectors (``mmproj``), LoRA adapters and other files whose
  ``general.type`` is not ``model`` are skipped with a reason: they cannot
  generate text.
* A store that does not exist is normal and silent; everything else that
  cannot be listed is reported as a ``Skipped`` (and through ``say``).
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Sequence, Union

from .backend import VocabInfo
from .compat import compare
from .errors import ConfigError, ModelFileError
from .gguf_header import GGUFHeader, read_local, vocab_type_name
from .hub import hub_cache_dir

Say = Callable[[str], None]
PathLike = Union[str, "os.PathLike[str]"]

#: Store names, in the order they are scanned (the first name found for a file is its name).
STORES = ("ollama", "lmstudio", "hf", "llamacpp", "folder")
#: Prefixes of the names ``resolve_name`` understands.
PREFIXES = ("ollama:", "lmstudio:", "hf:", "llamacpp:")

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_REGISTRY = "registry.ollama.ai"
OLLAMA_NAMESPACE = "library"
MAX_MANIFEST = 1 << 20  # an Ollama manifest is a few hundred bytes
DEFAULT_DEPTH = 6
MIN_RATIO = 3.0

_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")
_SPLIT = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
_REV = re.compile(r"^(.*)@([0-9a-f]{7,40})$")
_QUANT_BITS = re.compile(r"^(?:I?Q|TQ)(\d)")


def _quiet(_: str) -> None:
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
            return _count(self.parameters)
        return human_bytes(self.size)


@dataclass
class FoundPair:
    """A target and a draft that shares its vocabulary and is several times smaller.

    Attributes:
        target: the model to generate with.
        draft: the model that proposes tokens.
        reason: one line saying why they fit.
        padded: the vocabularies differ only by padding at the end.
    """

    target: FoundModel
    draft: FoundModel
    reason: str
    padded: bool = False


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


# -- walking ------------------------------------------------------------------


class _Walker:
    """Directory listing that reports unreadable folders; ``files`` never loops."""

    def __init__(self, skipped: list[Skipped]):
        self.skipped = skipped

    def entries(self, d: Path, seen: Optional[set[tuple[int, int]]] = None) -> list[os.DirEntry[str]]:
        """The entries of ``d`` by name; [] when missing, or (with a Skipped) when it cannot be read.

        Args:
            d: the folder.
            seen: folders already listed in this traversal (by device and inode); ``d`` is added.
        """
        try:
            st = d.stat()
        except FileNotFoundError:
            return []
        except OSError as exc:
            self.skipped.append(Skipped(str(d), f"cannot be read ({_why(exc)})."))
            return []
        if not stat.S_ISDIR(st.st_mode):
            return []
        if seen is not None:
            if (st.st_dev, st.st_ino) in seen:
                return []  # a folder symlinked back into the tree
            seen.add((st.st_dev, st.st_ino))
        try:
            with os.scandir(d) as it:
                return sorted(it, key=lambda e: e.name)
        except OSError as exc:
            self.skipped.append(Skipped(str(d), f"cannot be read ({_why(exc)}); check its permissions."))
            return []

    def files(self, root: Path, max_depth: int, suffix: str = ".gguf") -> Iterator[Path]:
        """Files ending in ``suffix`` under ``root``, at most ``max_depth`` folders down, hidden ones left out."""
        seen: set[tuple[int, int]] = set()
        stack = [(root, 0)]
        while stack:
            d, depth = stack.pop(0)
            subdirs = []
            for e in self.entries(d, seen):
                if e.name.startswith("."):
                    continue
                if _is_dir(e):
                    if depth < max_depth:
                        subdirs.append((Path(e.path), depth + 1))
                elif e.name.lower().endswith(suffix):
                    yield Path(e.path)
            stack[0:0] = subdirs  # depth first, in name order


def _is_dir(e: os.DirEntry[str]) -> bool:
    try:
        return e.is_dir()
    except OSError:  # a symlink loop: it is looked at (and reported) as a file
        return False


def _why(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "a symlink loop"
    return (exc.strerror or str(exc)).lower()


# -- the stores ---------------------------------------------------------------

_Candidate = tuple[str, Path, str]  # name, path, store


def _ollama(roots: Sequence[Path], walk: _Walker) -> Iterator[Union[_Candidate, Skipped]]:
    for root in roots:
        manifests = root / "manifests"
        for registry in walk.entries(manifests):
            for namespace in walk.entries(Path(registry.path)):
                for model in walk.entries(Path(namespace.path)):
                    for tag in walk.entries(Path(model.path)):
                        if tag.name.startswith("."):
                            continue
                        name = ollama_name(registry.name, namespace.name, model.name, tag.name)
                        yield _ollama_blob(root, Path(tag.path), name)


def ollama_name(registry: str, namespace: str, model: str, tag: str) -> str:
    """Ollama's short name for a manifest: ``ollama:qwen2.5-coder:7b``, ``ollama:user/model:tag``."""
    prefix = "" if registry == OLLAMA_REGISTRY else f"{registry}/"
    if prefix or namespace != OLLAMA_NAMESPACE:
        prefix += f"{namespace}/"
    return f"ollama:{prefix}{model}:{tag}"


def _ollama_blob(root: Path, manifest: Path, name: str) -> Union[_Candidate, Skipped]:
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
        return Skipped(name, f"its manifest {manifest} cannot be read ({_why(exc)}).")
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


def _lmstudio(roots: Sequence[Path], walk: _Walker) -> Iterator[Union[_Candidate, Skipped]]:
    for root in roots:
        for path in walk.files(root, 4):
            yield f"lmstudio:{path.relative_to(root).as_posix()}", path, "lmstudio"


def _hf_layout(root: Path, walk: _Walker, prefix: str, store: str) -> Iterator[Union[_Candidate, Skipped]]:
    """GGUFs in a Hugging Face style cache: ``models--org--name/snapshots/<rev>/...``."""
    for repo_dir in walk.entries(root):
        if not repo_dir.name.startswith("models--") or not _is_dir(repo_dir):
            continue
        repo = repo_dir.name[len("models--"):].replace("--", "/")
        snapshots = Path(repo_dir.path) / "snapshots"
        main = _read_ref(Path(repo_dir.path) / "refs" / "main")
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


def _read_ref(path: Path) -> Optional[str]:
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def _hf(roots: Sequence[Path], walk: _Walker) -> Iterator[Union[_Candidate, Skipped]]:
    for root in roots:
        yield from _hf_layout(root, walk, "hf:", "hf")


def _llamacpp(roots: Sequence[Path], walk: _Walker) -> Iterator[Union[_Candidate, Skipped]]:
    for root in roots:
        for e in walk.entries(root):
            if e.name.lower().endswith(".gguf") and not _is_dir(e):
                yield f"llamacpp:{e.name}", Path(e.path), "llamacpp"
        yield from _hf_layout(root, walk, "llamacpp:", "llamacpp")


def _folders(roots: Sequence[Path], walk: _Walker, max_depth: int) -> Iterator[Union[_Candidate, Skipped]]:
    for root in roots:
        try:
            mode = root.stat().st_mode
        except FileNotFoundError:
            yield Skipped(str(root), "does not exist; check the folder's name.")
            continue
        except OSError as exc:  # pathlib's exists() and is_file() let EACCES through
            yield Skipped(str(root), f"cannot be read ({_why(exc)}).")
            continue
        if stat.S_ISREG(mode) and root.name.lower().endswith(".gguf"):
            yield str(root), root, "folder"
            continue
        for path in walk.files(root, max_depth):
            yield str(path), path, "folder"


# -- one file -----------------------------------------------------------------


def _split_parts(path: Path) -> Optional[tuple[int, list[Path]]]:
    """For ``x-00001-of-00003.gguf``: (this part's number, every part's path); None when not split."""
    m = _SPLIT.match(path.name)
    if not m:
        return None
    part, count = int(m.group(2)), int(m.group(3))
    if not 1 <= part <= count:  # "-00002-of-00000": not a split model's name after all
        return None
    return part, [path.with_name(f"{m.group(1)}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def _not_a_model(path: Path, header: GGUFHeader) -> Optional[str]:
    """Why a GGUF is not a language model (a projector, an adapter...), or None if it is one."""
    kind = header.model_type
    if kind == "mmproj" or header.architecture == "clip" or path.name.lower().startswith("mmproj"):
        return "is a multimodal projector (mmproj), not a language model."
    if kind == "adapter":
        return "is a LoRA adapter, not a model; load it with its base model."
    if kind not in (None, "model"):
        return f"is a GGUF of type {kind!r}, not a language model."
    return None


def _inspect(name: str, path: Path, store: str, seen: dict[tuple[int, int], Optional[FoundModel]],
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
        return Skipped(name, f"{path} cannot be read ({_why(exc)}).")
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
    split = _split_parts(path)
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
    why = _not_a_model(path, header)
    if why:
        return Skipped(name, f"{path} {why}")
    found = FoundModel(name, path, store, size, header)
    seen[key] = found
    return found


# -- scanning -------------------------------------------------------------------


def scan(roots: Optional[Roots] = None, *, folders: Iterable[PathLike] = (), say: Say = _quiet,
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
    walk = _Walker(skipped)
    seen: dict[tuple[int, int], Optional[FoundModel]] = {}
    models: list[FoundModel] = []
    sources: list[Iterator[Union[_Candidate, Skipped]]] = [
        _ollama(roots.ollama, walk), _lmstudio(roots.lmstudio, walk), _hf(roots.hf, walk),
        _llamacpp(roots.llamacpp, walk), _folders(roots.folders, walk, max_depth),
    ]
    reported = 0
    for source in sources:
        for item in source:
            result = _inspect(*item, seen, smaller_than) if isinstance(item, tuple) else item
            if isinstance(result, FoundModel):
                models.append(result)
            elif isinstance(result, Skipped):
                skipped.append(result)
            for s in skipped[reported:]:  # the walker appends too
                say(str(s))
            reported = len(skipped)
    return Scan(models, skipped)


# -- pairing ------------------------------------------------------------------


def _quant_family(q: Optional[str]) -> Optional[str]:
    """``Q4_K_M``, ``IQ4_XS``, ``Q4_0`` -> ``4-bit``; ``F16``/``BF16`` -> ``16-bit``; None when unknown."""
    if not q:
        return None
    m = _QUANT_BITS.match(q)
    if m:
        return f"{m.group(1)}-bit"
    return {"F16": "16-bit", "BF16": "16-bit", "F32": "32-bit"}.get(q, q)


def _count(n: int) -> str:
    if n >= 10**9:
        return f"{n / 1e9:.1f}".rstrip("0").rstrip(".") + "B"
    return f"{n / 1e6:.0f}M"


def human_bytes(n: int) -> str:
    """``1.2 GB``, ``3.4 MB``, ``56.0 KB``, ``12 bytes``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _ratio(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".") + "x"


def _compat(target: FoundModel, draft: FoundModel) -> tuple[bool, bool]:
    """(can draft, only by padding) for two models with tokenizers."""
    if target.fingerprint == draft.fingerprint:
        return True, False
    c = compare(target.vocab(), draft.vocab())
    return c.ok, c.padded


def _smaller(target: FoundModel, draft: FoundModel) -> tuple[float, bool]:
    """How many times smaller the draft is, and whether that is by parameter count (else by file size)."""
    if target.parameters and draft.parameters:
        return target.parameters / draft.parameters, True
    return target.size / max(1, draft.size), False


def _reason(target: FoundModel, draft: FoundModel, padded: bool, ratio: float, by_params: bool) -> str:
    v = target.vocab()
    kind = vocab_type_name(v.type)
    if padded:
        vocab = f"same vocabulary except padding ({kind}, {v.n_tokens} and {draft.n_tokens} tokens)"
    else:
        vocab = f"same vocabulary ({kind}, {v.n_tokens} tokens)"
    if by_params:
        size = f"draft {draft.label()} is {_ratio(ratio)} smaller than {target.label()}"
    else:
        size = f"draft file {human_bytes(draft.size)} is {_ratio(ratio)} smaller than {human_bytes(target.size)}"
    if target.architecture != draft.architecture:
        size += f" (architectures {draft.architecture} and {target.architecture})"
    return f"{vocab}; {size}"


def _drafts_for(target: FoundModel, candidates: Iterable[FoundModel], min_ratio: float) -> list[FoundPair]:
    """Every candidate that can draft for ``target``, best first (see ``pair_models``)."""
    if target.fingerprint is None:
        return []
    ranked = []
    for d in candidates:
        if d is target or d.fingerprint is None or d.path == target.path:
            continue
        ratio, by_params = _smaller(target, d)
        if ratio < min_ratio:
            continue
        ok, padded = _compat(target, d)
        if not ok:
            continue
        key = (d.architecture != target.architecture, padded,
               _quant_family(d.quantization) != _quant_family(target.quantization),
               d.parameters is None, d.parameters or 0, d.size, d.name)
        ranked.append((key, FoundPair(target, d, _reason(target, d, padded, ratio, by_params), padded)))
    ranked.sort(key=lambda kv: kv[0])
    return [pair for _, pair in ranked]


def pair_models(found: Sequence[FoundModel], *, min_ratio: float = MIN_RATIO) -> list[FoundPair]:
    """Pair every model with the drafts on this machine that fit it.

    A draft fits a target when their vocabularies are the same (the same
    fingerprint) or identical except padding at the end (``compat.compare``),
    and the draft is at least ``min_ratio`` times smaller: by parameter count
    when both files state one (``general.parameter_count`` or a size label),
    else by file size. Models without a tokenizer are never paired.

    Drafts for one target are ranked:

    1. same architecture first: the same family's small model agrees with the
       target far more often than a stranger that happens to share its tokenizer;
    2. exact vocabulary before one that differs by padding (a padded draft may
       propose ids the target lacks, each a wasted round);
    3. same quantization width (4-bit with 4-bit...): closest in how it rounds;
    4. a draft whose parameter count is known before one measured by file size only;
    5. then the smallest: every candidate is already several times smaller, so
       the cheaper draft step wins.

    Returns:
        Pairs grouped by target (largest target first), best draft first within each.
    """
    targets = sorted(found, key=lambda m: (-(m.parameters or 0), -m.size, m.name))
    pairs: list[FoundPair] = []
    for t in targets:
        pairs.extend(_drafts_for(t, found, min_ratio))
    return pairs


def find_draft(target: Union[PathLike, FoundModel], found: Sequence[FoundModel], *,
               min_ratio: float = MIN_RATIO) -> Optional[FoundPair]:
    """The best draft on this machine for ``target`` (see ``pair_models`` for the ranking), or None.

    Args:
        target: a model from the scan, or any GGUF path (its header is read).
        found: the scan's models.
        min_ratio: how many times smaller a draft must be.

    Raises:
        ModelFileError: ``target`` is a path that is not a readable GGUF language model.
    """
    if not isinstance(target, FoundModel):
        path = Path(target).expanduser()
        split = _split_parts(path)
        if split is not None:
            path = split[1][0]  # a split model is known by its first part
        match = _same_file(path, found)
        if match is None:
            result = _inspect(str(path), path, "path", {})
            if isinstance(result, Skipped):
                raise ModelFileError(result.why)
            assert result is not None
            match = result
        target = match
    drafts = _drafts_for(target, found, min_ratio)
    return drafts[0] if drafts else None


def _same_file(path: Path, found: Sequence[FoundModel]) -> Optional[FoundModel]:
    for m in found:
        try:
            if m.path == path or os.path.samefile(m.path, path):
                return m
        except OSError:
            continue
    return None


# -- names ------------------------------------------------------------------------


def pair_name(pair: FoundPair, taken: Iterable[str] = ()) -> str:
    """A name for ``localspec add``: the target's file or model name, lower case, made unique against ``taken``."""
    base = re.sub(r"[^\w.-]+", "-", re.sub(r"\.gguf$", "", pair.target.name.split("/")[-1])).strip("-").lower()
    base, taken = base or "model", set(taken)
    return next(name for name in (base if i == 1 else f"{base}-{i}" for i in range(1, len(taken) + 2))
                if name not in taken)


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
            repo, file = "/".join(parts[:2]), _REV.sub(r"\1", "/".join(parts[2:]))
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
            result = _ollama_blob(root, manifest, ollama_name(full[0], full[1], full[2], tag))
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
    m = _REV.match(rel)
    if m:
        rel, want_rev = m.group(1), m.group(2)
    for root in roots:
        repo_dir = root / f"models--{org}--{repo}"
        snapshots = repo_dir / "snapshots"
        try:
            revs = sorted(os.listdir(snapshots))
        except OSError:
            continue
        main = _read_ref(repo_dir / "refs" / "main")
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
