"""The prompt cache's disk files: one saved model state each, checked before anything is loaded.

A file is a fixed head (magic, format version, header length), a JSON header
(the model's state identity, the token count, the state's size and SHA-256),
the tokens as little-endian int32 and the state. It is written under a
temporary name in the same folder, flushed to disk and renamed, so a reader
sees a whole file or none, and a process killed while writing leaves only a
temporary file, which is never read as an entry and is removed once it is old.
Files live in one folder per model identity, under a folder named for the
format version, so another version's files are neither read nor deleted.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np

MAGIC = b"LSPC"
FORMAT_VERSION = 1
SUFFIX = ".lspc"
_HEAD = struct.Struct("<4sII")  # magic, version, header length
#: A temporary file older than this is a write that will never finish (its process died).
STALE_TMP_SECONDS = 600.0
#: Read errors that mean "not a whole entry": the file is set aside, never the process stopped.
_UNREADABLE = (OSError, ValueError, KeyError, TypeError, AttributeError, struct.error, MemoryError)

State = Union[bytes, bytearray]


class BadFile(Exception):
    """A file that is not a whole entry of this format for the model asked about; ``str`` says why."""


def version_folder(folder: Path) -> Path:
    """Where this format version's files live under the cache's folder."""
    return folder / f"v{FORMAT_VERSION}"


def model_folder(folder: Path, identity: str) -> Path:
    """The folder of one model identity's files."""
    return version_folder(folder) / hashlib.sha256(identity.encode()).hexdigest()[:20]


def file_name(tokens: np.ndarray) -> str:
    """An entry's file name: a hash of its tokens (the same prefix of the same model is the same file)."""
    return hashlib.sha256(np.ascontiguousarray(tokens, dtype="<i4").tobytes()).hexdigest()[:32] + SUFFIX


def private_folders(model: Path) -> None:
    """Make a model's folder, and the version and cache folders above it, readable by the user alone."""
    model.mkdir(parents=True, exist_ok=True, mode=0o700)
    for folder in (model, model.parent, model.parent.parent):  # the model's, the version's, the cache's
        if folder.stat().st_mode & 0o077:
            os.chmod(folder, 0o700)  # also folders an older version left open to others


def write(path: Path, identity: str, tokens: np.ndarray, data: State) -> int:
    """Write an entry atomically (temporary file, fsync, rename); its size in bytes.

    Raises:
        OSError: the folder cannot be made or the disk is full (no temporary file is left behind).
    """
    header = json.dumps({"identity": identity, "n_tokens": int(len(tokens)), "state_bytes": len(data),
                         "state_sha256": hashlib.sha256(data).hexdigest(), "saved_at": time.time()}).encode()
    head = _HEAD.pack(MAGIC, FORMAT_VERSION, len(header)) + header + np.asarray(tokens, dtype="<i4").tobytes()
    private_folders(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    try:
        # A state holds the prompt's text in its tokens: the user's alone to read, as the history store is.
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(head)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # whole or not at all, for every reader
    except BaseException:
        unlink(tmp)
        raise
    return len(head) + len(data)


def read_header(path: Path, identity: Optional[str] = None) -> tuple[dict, np.ndarray]:
    """An entry's header and tokens, without its state; checks the head, the identity (when given) and that
    the file is as long as its header says.

    Raises:
        BadFile: anything else.
        FileNotFoundError: the file is gone (another process evicted it): not a fault.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read(_HEAD.size)
            if len(raw) != _HEAD.size:
                raise BadFile("truncated")
            magic, version, n = _HEAD.unpack(raw)
            if magic != MAGIC or version != FORMAT_VERSION or n > 2**20:
                raise BadFile("not an entry of this format")
            header = json.loads(f.read(n))
            if not isinstance(header, dict):
                raise BadFile("unreadable header")
            if identity is not None and header.get("identity") != identity:
                raise BadFile("saved for another model or settings")
            count = int(header["n_tokens"])
            tokens = np.frombuffer(f.read(4 * count), dtype="<i4").astype(np.int32)
            size = _HEAD.size + n + 4 * count + int(header["state_bytes"])
        if len(tokens) != count or path.stat().st_size != size:
            raise BadFile("truncated")
        header["_state_at"] = _HEAD.size + n + 4 * count
        return header, tokens
    except FileNotFoundError:
        raise
    except BadFile:
        raise
    except _UNREADABLE as exc:
        raise BadFile(f"unreadable: {exc}") from None


def read_state(path: Path, identity: str) -> bytes:
    """An entry's state, checked against its header's size and SHA-256.

    Raises:
        BadFile: the header or the state does not check out.
        FileNotFoundError: the file is gone.
    """
    header, _ = read_header(path, identity)
    try:
        with open(path, "rb") as f:
            f.seek(int(header["_state_at"]))
            data = f.read()
    except FileNotFoundError:
        raise
    except _UNREADABLE as exc:
        raise BadFile(f"unreadable: {exc}") from None
    if len(data) != int(header["state_bytes"]) or hashlib.sha256(data).hexdigest() != header.get("state_sha256"):
        raise BadFile("its state does not match its checksum")
    return data


def remove_stale_temporaries(folder: Path, older_than: float = STALE_TMP_SECONDS) -> int:
    """Delete temporary files of writes that never finished (older than ``older_than`` seconds); how many."""
    removed, now = 0, time.time()
    for f in folder.rglob(".*.tmp") if folder.is_dir() else ():
        try:
            if now - f.stat().st_mtime > older_than:
                f.unlink()
                removed += 1
        except OSError:
            pass
    return removed


def files_by_age(folder: Path) -> list[tuple[float, int, Path]]:
    """(modification time, size, path) of every file the cache's folder holds, entries and temporaries, oldest
    first: what the disk budget counts."""
    out = []
    for f in folder.rglob("*") if folder.is_dir() else ():
        try:
            st = f.stat()
        except OSError:
            continue
        if f.is_file():
            out.append((st.st_mtime, st.st_size, f))
    return sorted(out)


@dataclass(frozen=True)
class DiskEntry:
    """One file of the disk tier, as ``disk_entries`` lists it."""

    path: Path
    model: str
    tokens: int
    bytes: int
    modified: float


def disk_entries(folder: Path) -> list[DiskEntry]:
    """The disk tier's entries of this format under ``folder`` (newest first), without reading a state."""
    out = []
    root = version_folder(Path(folder))
    for f in root.rglob(f"*{SUFFIX}") if root.is_dir() else ():
        try:
            header, tokens = read_header(f)
            st = f.stat()
        except (BadFile, OSError):
            continue
        model = Path(str(header.get("identity", "?")).split("|", 1)[0]).name
        out.append(DiskEntry(f, model, len(tokens), st.st_size, st.st_mtime))
    return sorted(out, key=lambda e: -e.modified)


def touch(path: Path) -> None:
    """Mark a file used now (eviction goes by modification time)."""
    try:
        os.utime(path)
    except OSError:
        pass


def unlink(path: Optional[Path]) -> None:
    """Delete a file if it is there."""
    if path is None:
        return
    try:
        path.unlink()
    except OSError:
        pass


def remove_all(folder: Path) -> int:
    """Delete every entry file of this format under the cache's ``folder``, readable or not; how many."""
    root = version_folder(Path(folder))
    found = list(root.rglob(f"*{SUFFIX}")) if root.is_dir() else []
    for f in found:
        unlink(f)
    return sum(not f.exists() for f in found)
