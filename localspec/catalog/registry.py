"""Named target + draft pairs: the built-in ``models.toml`` and the user's own.

Schema (one table per pair)::

    [pairs."qwen2.5-coder-1.5b"]
    description = "Qwen2.5-Coder 1.5B Instruct, 0.5B coder draft"
    k = 4          # suggested draft length
    ctx = 4096     # suggested context length
    target = { repo = "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", file = "...gguf", sha256 = "..." }
    draft  = { repo = "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF", file = "...gguf" }

Embedding models and rerankers, loaded beside a pair (``localspec.load_embedding``, ``serve
--embedding-model``), have a table each too::

    [embeddings."nomic-embed-text-v1.5"]
    description = "nomic-embed-text v1.5 (F16), 768 numbers, Matryoshka"
    kind = "embedding"   # or "reranker"
    model = { repo = "nomic-ai/nomic-embed-text-v1.5-GGUF", file = "nomic-embed-text-v1.5.f16.gguf" }

A model is either on the Hugging Face Hub (``repo`` + ``file``, optional
``revision`` and ``sha256``) or a file already on disk (``path``, what
``localspec add`` writes). The user's ``models.toml`` lives in the localspec
home (see ``paths.home``); its pairs override built-in ones of the same name.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Optional

from ..errors import RegistryError
from ..methods import K_LIMIT
from ..paths import home, write_atomic

#: The pair offered for download when a command needs one and none is on disk.
DEFAULT_PAIR = "qwen2.5-coder-1.5b"

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass(frozen=True)
class ModelRef:
    """Where one GGUF comes from: a Hub file or a local path."""

    repo: Optional[str] = None
    file: Optional[str] = None
    revision: Optional[str] = None
    sha256: Optional[str] = None
    path: Optional[str] = None

    @property
    def is_local(self) -> bool:
        return self.path is not None

    def describe(self) -> str:
        if self.path:
            return self.path
        return f"{self.repo}/{self.file}" + (f"@{self.revision}" if self.revision else "")


@dataclass(frozen=True)
class PairSpec:
    """A named pair of models."""

    name: str
    target: ModelRef
    draft: ModelRef
    description: str = ""
    k: int = 4
    ctx: int = 4096
    source: str = ""  # the file that defined it
    mmproj: Optional[ModelRef] = None  # the target's vision projector, where it sees


@dataclass(frozen=True)
class EmbeddingSpec:
    """A named embedding model or reranker."""

    name: str
    model: ModelRef
    kind: str = "embedding"  # or "reranker"
    description: str = ""
    source: str = ""


#: The kinds an ``[embeddings.NAME]`` entry may be.
EMBEDDING_KINDS = ("embedding", "reranker")


def user_file() -> Path:
    """The user's models.toml."""
    return home() / "models.toml"


def builtin_text() -> str:
    """The models.toml shipped with localspec."""
    return resources.files("localspec").joinpath("data/models.toml").read_text(encoding="utf-8")


def parse(text: str, source: str) -> dict[str, PairSpec]:
    """Pairs defined in one models.toml text.

    Raises:
        RegistryError: malformed TOML (with the line) or a missing/invalid field (with its key).
    """
    return {name: _pair(name, body, source) for name, body in _tables(text, source, "pairs").items()}


def parse_embeddings(text: str, source: str) -> dict[str, EmbeddingSpec]:
    """Embedding models and rerankers defined in one models.toml text (its ``[embeddings.NAME]`` tables).

    Raises:
        RegistryError: malformed TOML or a missing or invalid field (with its key).
    """
    out = {}
    for name, body in _tables(text, source, "embeddings").items():
        where = f"{source}: embeddings.{name}"
        if not isinstance(body, dict) or "model" not in body:
            raise RegistryError(f"{where} needs model = {{ repo = ..., file = ... }} or {{ path = ... }}.")
        kind, description = body.get("kind", "embedding"), body.get("description", "")
        if kind not in EMBEDDING_KINDS:
            raise RegistryError(f"{where}.kind must be one of {', '.join(EMBEDDING_KINDS)}, got {kind!r}.")
        if not isinstance(description, str):
            raise RegistryError(f"{where}.description must be a str, got {description!r}.")
        out[name] = EmbeddingSpec(name, _ref(body["model"], f"{where}.model"), kind, description, source)
    return out


def load_embedding_registry() -> dict[str, EmbeddingSpec]:
    """Built-in embedding models and rerankers, overridden and extended by the user's models.toml."""
    found: dict[str, EmbeddingSpec] = {}
    for text, source in _texts():
        found.update(parse_embeddings(text, source))
    return found


def _tables(text: str, source: str, key: str) -> dict[str, Any]:
    """The ``[KEY.NAME]`` tables of one models.toml text, by name.

    Raises:
        RegistryError: malformed TOML (with the line), or ``KEY`` that is not a table of tables.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RegistryError(f"{source} is not valid TOML: {exc}; fix that line.") from exc
    tables = data.get(key, {})
    if not isinstance(tables, dict):
        raise RegistryError(f"{source}: '{key}' must be a table of [{key}.NAME] entries.")
    return tables


def _texts() -> list[tuple[str, str]]:
    """The built-in models.toml, then the user's where there is one, each with how errors name it.

    Raises:
        RegistryError: the user's file exists but cannot be read.
    """
    found = [(builtin_text(), "built-in models.toml")]
    path = user_file()
    if path.is_file():
        try:
            found.append((path.read_text(encoding="utf-8"), str(path)))
        except OSError as exc:
            raise RegistryError(f"Cannot read {path}: {exc.strerror}.") from exc
    return found


def _pair(name: str, body: Any, source: str) -> PairSpec:
    where = f"{source}: pairs.{name}"
    if not isinstance(body, dict):
        raise RegistryError(f"{where} must be a table.")
    refs = {}
    for role in ("target", "draft"):
        if role not in body:
            raise RegistryError(
                f"{where} has no '{role}'; add {role} = {{ repo = ..., file = ... }} or {{ path = ... }}.")
        refs[role] = _ref(body[role], f"{where}.{role}")
    mmproj = _ref(body["mmproj"], f"{where}.mmproj") if "mmproj" in body else None
    for key, kind in (("k", int), ("ctx", int), ("description", str)):
        if key in body and not isinstance(body[key], kind):
            raise RegistryError(f"{where}.{key} must be a {kind.__name__}, got {body[key]!r}.")
    k = body.get("k", 4)
    if not 1 <= k <= K_LIMIT:
        raise RegistryError(f"{where}.k must be a draft length from 1 to {K_LIMIT}, got {k}.")
    return PairSpec(name, refs["target"], refs["draft"], body.get("description", ""), k, body.get("ctx", 4096),
                    source, mmproj)


def _ref(value: Any, where: str) -> ModelRef:
    if not isinstance(value, dict):
        raise RegistryError(f"{where} must be a table such as {{ repo = ..., file = ... }}.")
    unknown = set(value) - {"repo", "file", "revision", "sha256", "path"}
    if unknown:
        raise RegistryError(f"{where} has unknown key(s) {', '.join(sorted(unknown))}.")
    for key, v in value.items():
        if not isinstance(v, str) or not v:
            raise RegistryError(f"{where}.{key} must be a non-empty string.")
    if "path" in value:
        if "repo" in value or "file" in value:
            raise RegistryError(f"{where} gives both a path and a repo/file; keep one.")
    else:
        for key in ("repo", "file"):
            if key not in value:
                raise RegistryError(f"{where} is missing '{key}' (or give a local 'path').")
    sha = value.get("sha256")
    if sha is not None and (len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha.lower())):
        raise RegistryError(f"{where}.sha256 is not a 64-digit hex sha256: {sha!r}.")
    return ModelRef(value.get("repo"), value.get("file"), value.get("revision"),
                    sha.lower() if sha else None, value.get("path"))


def load_registry() -> dict[str, PairSpec]:
    """Built-in pairs, overridden and extended by the user's models.toml."""
    pairs: dict[str, PairSpec] = {}
    for text, source in _texts():
        pairs.update(parse(text, source))
    return pairs


def get_pair(name: str) -> PairSpec:
    """The pair called ``name``.

    Raises:
        RegistryError: no such pair (the message lists the known names).
    """
    pairs = load_registry()
    if name not in pairs:
        known = ", ".join(sorted(pairs)) or "none"
        raise RegistryError(f"No model pair named {name!r}; known pairs: {known} (see `localspec models`).")
    return pairs[name]


def add_local_pair(name: str, target: Path, draft: Path, description: str = "", k: int = 4, ctx: int = 4096,
                   mmproj: Optional[Path] = None) -> Path:
    """Register GGUFs already on disk under ``name`` in the user's models.toml (nothing is copied); ``mmproj``:
    the target's vision projector.

    Returns:
        the models.toml written.
    """
    return add_pair(name, ModelRef(path=str(target.resolve())), ModelRef(path=str(draft.resolve())),
                    description or f"{target.name} with {draft.name} as draft", k, ctx,
                    ModelRef(path=str(mmproj.resolve())) if mmproj is not None else None)


def add_pair(name: str, target: ModelRef, draft: ModelRef, description: str, k: int = 4, ctx: int = 4096,
             mmproj: Optional[ModelRef] = None) -> Path:
    """Register a pair of local files or Hub files under ``name`` in the user's models.toml.

    Returns:
        the models.toml written.
    """
    import tomli_w

    path = user_file()
    data: dict[str, Any] = {}
    if path.is_file():
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        parse(path.read_text(encoding="utf-8"), str(path))  # refuse to extend a broken file
    entry = {"description": description, "k": k, "ctx": ctx, "target": _ref_table(target), "draft": _ref_table(draft)}
    if mmproj is not None:
        entry["mmproj"] = _ref_table(mmproj)
    data.setdefault("pairs", {})[name] = entry
    write_atomic(path, tomli_w.dumps(data))
    return path


def _ref_table(ref: ModelRef) -> dict[str, str]:
    fields = ("path",) if ref.is_local else ("repo", "file", "revision", "sha256")
    return {f: getattr(ref, f) for f in fields if getattr(ref, f)}
