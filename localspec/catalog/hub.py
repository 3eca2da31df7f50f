"""Downloads of registered pairs from the Hugging Face Hub, checked by sha256.

Files go into the ordinary Hugging Face cache through ``hf_hub_download``,
so they are shared with other tools, a dropped connection is resumed with a
range request within the pull, and downloads honour ``HF_ENDPOINT``, ``HF_HOME``/``HF_HUB_CACHE``, ``HF_TOKEN`` and
``HF_HUB_OFFLINE`` (read at call time, so they can change within a process).

Every file is checked against the sha256 in models.toml. A file with no
listed checksum has its sha256 recorded on first download (trust on first
use) in ``checksums.json`` in the localspec home, and later pulls are
checked against that. A mismatch refuses the file and deletes nothing.

A file obtained some other way can be ``adopt``ed: if its sha256 is the one
models.toml lists, it counts as that file's download from then on (nothing
is copied; ``adopted.json`` in the localspec home says where it is).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, NoReturn, Optional

from ..errors import HubError, LocalspecError, RegistryError
from ..paths import home, write_atomic
from .registry import ModelRef, PairSpec

Say = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def hub_cache_dir() -> Path:
    """The Hugging Face cache directory, as huggingface_hub would choose it now."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    hf_home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "huggingface")
    return Path(hf_home).expanduser() / "hub"


def _key(ref: ModelRef) -> str:
    return f"{ref.repo}/{ref.file}@{ref.revision or 'main'}"


def _checksums_file() -> Path:
    return home() / "checksums.json"


def _adopted_file() -> Path:
    return home() / "adopted.json"


def _identity(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_json(path: Path, data: dict) -> None:
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True))


def expected_sha256(ref: ModelRef) -> tuple[Optional[str], str]:
    """The checksum a file must have, and where it comes from ("models.toml", "recorded" or "none")."""
    if ref.sha256:
        return ref.sha256, "models.toml"
    recorded = _read_json(_checksums_file()).get("recorded", {}).get(_key(ref))
    return (recorded, "recorded") if recorded else (None, "none")


def sha256_of(path: Path) -> str:
    """sha256 of a file, remembered per (path, size, mtime) so a verified file is not hashed again."""
    ident = _identity(path)
    store = _read_json(_checksums_file())
    known = store.get("hashed", {}).get(ident)
    if known:
        return str(known)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    digest = h.hexdigest()
    store.setdefault("hashed", {})[ident] = digest
    _write_json(_checksums_file(), store)
    return digest


def locate(ref: ModelRef) -> Optional[Path]:
    """The file on disk for ``ref`` if it is there (no network), else None."""
    if ref.path is not None:
        p = Path(ref.path).expanduser()
        return p if p.is_file() else None
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(ref.repo or "", ref.file or "", cache_dir=hub_cache_dir(), revision=ref.revision)
    return Path(found) if isinstance(found, str) else _adopted_path(ref)


def _adopted_path(ref: ModelRef) -> Optional[Path]:
    """Where an adopted file of ``ref`` is, if it is still there at the recorded size."""
    adopted = _read_json(_adopted_file()).get(_key(ref))
    if isinstance(adopted, dict) and isinstance(adopted.get("path"), str):
        p = Path(adopted["path"])
        if p.is_file() and p.stat().st_size == adopted.get("bytes"):
            return p
    return None


def adopt(ref: ModelRef, path: Path, sha256: Optional[str] = None) -> None:
    """Make ``path``, a file already on disk, count as the download of ``ref`` (nothing is copied).

    Args:
        ref: a Hub file listed with a sha256 in models.toml.
        path: the file.
        sha256: its checksum if the caller has just computed it (saves hashing it again).

    Raises:
        HubError: ``ref`` lists no sha256, or the file's differs.
    """
    path = Path(path).resolve()
    if not ref.sha256:
        raise HubError(f"{_key(ref)} lists no sha256 in models.toml, so {path} cannot be checked against it; "
                       "pull it instead.")
    if sha256:
        store = _read_json(_checksums_file())
        store.setdefault("hashed", {})[_identity(path)] = sha256.lower()
        _write_json(_checksums_file(), store)
    _verify(ref, path, _quiet)
    adopted = _read_json(_adopted_file())
    adopted[_key(ref)] = {"path": str(path), "bytes": path.stat().st_size}
    _write_json(_adopted_file(), adopted)


@contextlib.contextmanager
def _progress_bars(enabled: bool) -> Iterator[None]:
    """huggingface_hub's progress bars on or off for one download, restored afterwards."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    was_disabled = are_progress_bars_disabled()
    if not enabled:
        disable_progress_bars()
    try:
        yield
    finally:
        if not enabled and not was_disabled:
            enable_progress_bars()


def download(ref: ModelRef, say: Say = _quiet, progress: bool = True) -> Path:
    """Download (or find in the cache) one registered file and verify its checksum.

    Raises:
        HubError: network failure, unknown repo or file, gated or private repo,
            offline with nothing cached, or a checksum mismatch.
    """
    if ref.path is not None:
        p = locate(ref)
        if p is None:
            raise HubError(f"The registered file {ref.path} is missing; re-add the pair with `localspec add`.")
        return p
    adopted = _adopted_path(ref)
    if adopted is not None:
        _verify(ref, adopted, say)
        return adopted
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled

    what = _key(ref)
    offline = truthy("HF_HUB_OFFLINE")
    try:
        with _progress_bars(progress):
            path = Path(hf_hub_download(
                ref.repo or "", ref.file or "", revision=ref.revision, cache_dir=hub_cache_dir(),
                endpoint=os.environ.get("HF_ENDPOINT") or None, token=os.environ.get("HF_TOKEN") or None,
                local_files_only=offline,
            ))  # type: ignore[arg-type]
    except HfHubHTTPError as exc:
        return raise_http(exc, ref, what)
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as exc:
        cause = _http_cause(exc)
        if cause is not None:  # the Hub answered, with an error: say which
            return raise_http(cause, ref, what)
        if offline:
            raise HubError(f"{what} is not in the local cache and HF_HUB_OFFLINE is set; "
                           "unset it to download.") from exc
        raise HubError(f"Could not reach the Hub for {what} (network error); check your connection "
                       "or HF_ENDPOINT, then run the pull again.") from exc
    except OSError as exc:
        raise HubError(f"Downloading {what} failed ({exc}); run the pull again to resume.") from exc
    _verify(ref, path, say)
    return path


def _http_cause(exc: BaseException) -> Optional[Exception]:
    """The Hub's HTTP error behind a 'not in the local cache' error, if there was one."""
    from huggingface_hub.errors import HfHubHTTPError

    seen = exc.__cause__ or exc.__context__
    while seen is not None:
        if isinstance(seen, HfHubHTTPError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def raise_http(exc: Exception, ref: ModelRef, what: str) -> NoReturn:
    """One sentence for each way the Hub can refuse a file."""
    from huggingface_hub.errors import (
        GatedRepoError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    status = _status(exc)
    if isinstance(exc, GatedRepoError) or status == "HTTP 403":
        raise HubError(f"{ref.repo} is gated or private ({status}): accept its licence on the Hub, then set "
                       "HF_TOKEN to a token with access (or run `hf auth login`).") from exc
    if isinstance(exc, RepositoryNotFoundError) or status == "HTTP 401":
        raise HubError(f"The Hub refused {ref.repo} ({status}): no repository has that name, or it is private "
                       "or gated; check the name in models.toml, or set HF_TOKEN to a token with access.") from exc
    if isinstance(exc, RevisionNotFoundError):
        raise HubError(f"{ref.repo} has no revision {ref.revision!r}; fix 'revision' in models.toml.") from exc
    if isinstance(exc, RemoteEntryNotFoundError):
        raise HubError(f"{ref.repo} has no file {ref.file} ({status}); fix 'file' in models.toml.") from exc
    raise HubError(f"Downloading {what} failed ({status}); run the pull again.") from exc


def _status(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    code = getattr(response, "status_code", None)
    return f"HTTP {code}" if code else type(exc).__name__


def _verify(ref: ModelRef, path: Path, say: Say) -> None:
    expected, origin = expected_sha256(ref)
    actual = sha256_of(path)
    if expected is None:
        store = _read_json(_checksums_file())
        store.setdefault("recorded", {})[_key(ref)] = actual
        _write_json(_checksums_file(), store)
        say(f"note: models.toml lists no sha256 for {ref.file}; recorded {actual} (later pulls must match it).")
        return
    if actual != expected:
        raise HubError(
            f"{ref.file} from {ref.repo} has sha256 {actual}, but {origin} says {expected}; the file was "
            f"refused and left untouched at {path}: delete it and pull again, or fix the checksum in models.toml."
        )


@dataclass
class PulledPair:
    """Paths of a pair's two files on disk."""

    name: str
    target: Path
    draft: Path
    mmproj: Optional[Path] = None


def pull(spec: PairSpec, say: Say = _quiet, progress: bool = True) -> PulledPair:
    """Download the files of a pair (its target's vision projector too, where it names one), resuming partial
    downloads, and verify them."""
    paths = []
    for role, ref in _files(spec):
        say(f"{role}: {ref.describe()}")
        paths.append(download(ref, say, progress))
    return PulledPair(spec.name, paths[0], paths[1], paths[2] if spec.mmproj is not None else None)


def _files(spec: PairSpec) -> list[tuple[str, ModelRef]]:
    """A pair's files by role: target, draft, and the target's vision projector where it names one."""
    return [("target", spec.target), ("draft", spec.draft)] + ([("vision projector", spec.mmproj)]
                                                               if spec.mmproj is not None else [])


def resolve(spec: PairSpec) -> PulledPair:
    """The pair's files if both are on disk; no network.

    Raises:
        RegistryError: a file is not downloaded yet (the message says how to get it).
    """
    roles = _files(spec)
    found = [locate(ref) for _, ref in roles]
    if len(found) > 2 and found[2] is None:  # its projector not downloaded: the pair still reads text
        roles, found = roles[:2], found[:2]
    for (role, ref), path in zip(roles, found, strict=True):
        if path is None:
            if ref.is_local:
                raise RegistryError(f"The {role} of pair {spec.name!r}, {ref.path}, does not exist; "
                                    "re-register the pair with `localspec add`.")
            raise RegistryError(f"The {role} of pair {spec.name!r} ({ref.describe()}) is not downloaded; "
                                f"run `localspec pull {spec.name}`.")
    for (_, ref), path in zip(roles, found, strict=True):
        assert path is not None
        if not ref.is_local and expected_sha256(ref)[0]:
            _verify(ref, path, _quiet)  # a cached file fetched by another tool is checked once
    assert found[0] is not None and found[1] is not None
    return PulledPair(spec.name, found[0], found[1], found[2] if len(found) > 2 else None)


def is_downloaded(spec: PairSpec) -> bool:
    """Whether both of the pair's files are on disk (and match their checksums); no network."""
    try:
        resolve(spec)
    except LocalspecError:
        return False
    return True


def first_downloaded(specs: Mapping[str, PairSpec]) -> Optional[str]:
    """The name of the first pair in ``specs`` whose files are all on disk, or None."""
    return next((name for name, spec in specs.items() if is_downloaded(spec)), None)
