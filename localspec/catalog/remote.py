"""Hub files checked before they are downloaded: GGUF headers read with HTTP range requests.

A GGUF starts with its metadata, the vocabulary included (a few MB at most),
and its weights follow; reading the header through ranged GETs
(``localspec.runtime.gguf_metadata.parse`` asks for growing chunks, only as far as the
key/value section goes) tells a file's architecture, size and vocabulary
before any weight is downloaded. ``find_drafts`` uses that to find drafts for
a target: the catalog's drafts and the same family's smaller GGUFs on the Hub,
each checked by its header, and reports how many bytes that took.

Requests go to ``HF_ENDPOINT`` with ``HF_TOKEN`` when set, read at call time.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence

from ..errors import HubError, ModelFileError, VocabMismatchError
from ..runtime.gguf_metadata import GGUFHeader, parse, parse_size_label, read_local, same_vocabulary
from ..runtime.vocab_match import VocabInfo
from ..sizes import human_bytes
from .hub import locate, raise_http, truthy
from .pairing import MIN_RATIO, rank_key, small_enough
from .registry import ModelRef, PairSpec
from .stores.layouts import best_projector

Say = Callable[[str], None]
#: Hub repositories looked at per search, and candidate files whose headers are read.
SEARCH_LIMIT = 20
CANDIDATE_LIMIT = 8
_TIMEOUT = 30.0
#: The most a header check reads from one file, and how long it may take (a 150k-token header is ~8 MB).
MAX_HEADER_BYTES = 128 << 20
DEADLINE = 120.0
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+)$")
_FIRST_CHUNK = 64 * 1024  # most headers are larger (a vocabulary of 150k tokens is ~3 MB): reads double from here
_SIZE_IN_NAME = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)[bB](?![a-zA-Z])")


def parse_hf(text: str) -> ModelRef:
    """``hf:ORG/REPO/FILE.gguf`` (optionally ``@REVISION``) as a Hub reference.

    Raises:
        HubError: not of that form.
    """
    body = text[3:] if text.startswith("hf:") else text
    body, _, revision = body.partition("@")
    parts = body.split("/")
    if len(parts) < 3 or any(p in ("", ".", "..") for p in parts) or "\\" in body or not parts[-1].endswith(".gguf"):
        raise HubError(f"{text!r} is not a Hub file reference; write hf:ORG/REPO/FILE.gguf "
                       "(for example hf:Qwen/Qwen2.5-0.5B-Instruct-GGUF/qwen2.5-0.5b-instruct-q4_k_m.gguf).")
    return ModelRef(repo="/".join(parts[:2]), file="/".join(parts[2:]), revision=revision or None)


@dataclass
class RemoteGGUF:
    """A Hub GGUF known by its header.

    Attributes:
        ref: where it is.
        header: its header and metadata.
        size: the whole file's size in bytes.
    """

    ref: ModelRef
    header: GGUFHeader
    size: int

    @property
    def bytes_read(self) -> int:
        return self.header.bytes_read

    @property
    def name(self) -> str:
        return self.describe()

    @property
    def architecture(self) -> Optional[str]:
        return self.header.architecture

    @property
    def quantization(self) -> Optional[str]:
        return self.header.quantization

    @property
    def parameters(self) -> Optional[int]:
        """Parameter count from the header, else from a size in the file or repository name (``0.5B``)."""
        return self.header.parameters or _size_in_name(self.ref)

    def describe(self) -> str:
        return f"hf:{self.ref.describe()}"


def _endpoint() -> Optional[str]:
    return os.environ.get("HF_ENDPOINT") or None


def _token() -> Optional[str]:
    return os.environ.get("HF_TOKEN") or None


def remote_header(ref: ModelRef) -> RemoteGGUF:
    """Read a Hub GGUF's header with range requests; nothing past its key/value section is fetched.

    Each reply is read only as far as the bytes asked for, all of them together
    at most ``MAX_HEADER_BYTES``, within ``DEADLINE`` seconds: a server cannot
    make the check download a model, or wait forever.

    Raises:
        HubError: the Hub cannot be reached, refuses the file, ignores range requests, or sends too much.
        ModelFileError: the file is not a GGUF, or its header is damaged.
    """
    if truthy("HF_HUB_OFFLINE"):
        raise HubError(f"hf:{ref.describe()} is not in the local cache and HF_HUB_OFFLINE is set; unset it to "
                       "read its header from the Hub.")
    reader = _RangeReader(ref)
    first = reader.read(0, 1)  # learns the size, so no later read goes past the end
    header = parse(reader.read, reader.size, name=reader.what, first_chunk=_FIRST_CHUNK)
    header.bytes_read += len(first)
    return RemoteGGUF(ref, header, reader.size)


class _RangeReader:
    """``read(offset, n)`` over HTTP range requests to one Hub file, with a byte budget and a deadline."""

    def __init__(self, ref: ModelRef):
        from huggingface_hub import get_session, hf_hub_url
        from huggingface_hub.utils import build_hf_headers

        self.ref, self.what = ref, f"hf:{ref.describe()}"
        self.url = hf_hub_url(ref.repo or "", ref.file or "", revision=ref.revision, endpoint=_endpoint())
        self.session, self.headers = get_session(), build_hf_headers(token=_token())
        self.size = 0  # known after the first read
        self.spent = 0
        self.deadline = time.monotonic() + DEADLINE

    def read(self, offset: int, n: int) -> bytes:
        if self.size and offset >= self.size:
            return b""
        end = offset + n - 1 if not self.size else min(offset + n, self.size) - 1
        if self.spent + (end + 1 - offset) > MAX_HEADER_BYTES:
            raise HubError(f"The header of {self.what} goes on past {MAX_HEADER_BYTES >> 20} MiB, far more than any "
                           "model's metadata; it was not read further.")
        try:
            return self._get(offset, end)
        except (HubError, ModelFileError):
            raise
        except Exception as exc:
            _fail(exc, self.ref, self.what)
            raise  # unreachable: _fail raises

    def _get(self, offset: int, end: int) -> bytes:
        from huggingface_hub.utils import hf_raise_for_status

        headers = {**self.headers, "Range": f"bytes={offset}-{end}"}
        with self.session.stream("GET", self.url, headers=headers, timeout=_TIMEOUT, follow_redirects=True) as r:
            if r.status_code >= 400:
                r.read()  # the error's body names it
                hf_raise_for_status(r)
            got = _CONTENT_RANGE.match(r.headers.get("Content-Range", ""))
            if r.status_code != 206 or got is None or int(got.group(1)) != offset:
                raise HubError(f"The Hub did not answer {self.what} with the bytes asked for (HTTP {r.status_code}, "
                               f"Content-Range {r.headers.get('Content-Range')!r}); its header cannot be checked "
                               "before downloading.")
            self.size = self.size or int(got.group(3))
            want, data = end + 1 - offset, bytearray()
            for chunk in r.iter_bytes():
                data += chunk[: want - len(data)]  # never more than asked for, whatever the server sends
                if len(data) >= want:
                    break
                if time.monotonic() > self.deadline:
                    raise HubError(f"Reading the header of {self.what} took over {DEADLINE:.0f} s; try again later.")
        self.spent += len(data)
        return bytes(data)


def _fail(exc: Exception, ref: ModelRef, what: str) -> None:
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(exc, HfHubHTTPError):
        raise_http(exc, ref, what)
    raise HubError(f"Could not reach the Hub for {what} ({type(exc).__name__}); check your connection or "
                   "HF_ENDPOINT, and try again.") from exc


@dataclass
class DraftMatch:
    """A Hub GGUF that can draft for the target, and why."""

    remote: RemoteGGUF
    reason: str
    padded: bool = False


def _size_in_name(ref: ModelRef) -> Optional[int]:
    for name in (ref.file or "", ref.repo or ""):
        m = _SIZE_IN_NAME.search(name)
        if m:
            return parse_size_label(f"{m.group(1)}B")
    return None


def find_drafts(target: RemoteGGUF, catalog: Iterable[ModelRef] = (), say: Say = lambda _: None,
                search: bool = True) -> tuple[list[DraftMatch], int]:
    """Drafts for a Hub target: candidates from the catalog and the Hub, each checked by its header.

    A candidate qualifies when its vocabulary is the target's (or differs only
    by padding) and it is at least ``pairing.MIN_RATIO`` times smaller, as on
    disk. Catalog drafts are tried when their repository names the target's
    family; a candidate whose name already says it is too large is not read,
    and the smallest by name are read first. Best first, as
    ``pairing.rank_key`` ranks drafts on disk.

    Returns:
        The matches, and the bytes read from the Hub to check them all.
    """
    family = _family(target)
    word = family.split("-")[0].lower().rstrip("0123456789.")  # "qwen" of "Qwen2.5-Coder"
    kin = [c for c in catalog if word and word in (c.repo or "").lower()]
    candidates = list(dict.fromkeys([*kin, *(_search(target, family, say) if search else [])]))
    limit = (target.parameters or 0) / MIN_RATIO
    candidates = [c for c in candidates if (c.repo, c.file) != (target.ref.repo, target.ref.file)
                  and not (limit and (_size_in_name(c) or 0) > limit)]
    candidates.sort(key=lambda c: (_size_in_name(c) is None, _size_in_name(c) or 0))
    matches, spent = [], 0
    for ref in candidates[:CANDIDATE_LIMIT]:
        try:
            remote = remote_header(ref)
            spent += remote.bytes_read
            verdict = same_vocabulary(target.header, remote.header)
        except (HubError, ModelFileError) as exc:  # one unreadable candidate does not end the search
            say(f"skipped hf:{ref.describe()}: {exc}")
            continue
        if not verdict.ok:
            say(f"not a draft: {remote.describe()}: {verdict.message}")
        elif not small_enough(target, remote):
            say(f"not a draft: {remote.describe()} is not {MIN_RATIO:g} times smaller than the target")
        else:
            params = remote.parameters
            size = f"{params / 1e9:.1f}B" if params else human_bytes(remote.size)
            matches.append(DraftMatch(remote, f"{'vocabulary padded' if verdict.padded else 'same vocabulary'}, "
                                              f"{remote.header.architecture}, {size}; read "
                                              f"{human_bytes(remote.bytes_read)} of {human_bytes(remote.size)}",
                                      verdict.padded))
    matches.sort(key=lambda m: rank_key(target, m.remote, m.padded))
    return matches, spent


def _family(target: RemoteGGUF) -> str:
    """The target's model family: ``general.basename`` (``Qwen2.5-Coder``), else its repository's name up to the
    first size or version number."""
    basename = target.header.metadata.get("general.basename")
    if isinstance(basename, str) and basename.strip():
        return basename.strip()
    name = (target.ref.repo or "/").split("/")[1]
    return re.split(r"[-_]\d", name)[0]


def _search(target: RemoteGGUF, family: str, say: Say) -> list[ModelRef]:
    """The family's GGUF files on the Hub from the target's publisher: the quantization the target has, one
    file per repository."""
    from huggingface_hub import HfApi

    org = (target.ref.repo or "").split("/")[0]
    api = HfApi(endpoint=_endpoint(), token=_token())
    try:
        repos = [m.id for m in api.list_models(search=family, author=org or None, limit=SEARCH_LIMIT)]
        found = []
        for repo in repos:
            if repo == target.ref.repo or "gguf" not in repo.lower():
                continue
            files = [f for f in api.list_repo_files(repo) if f.endswith(".gguf")]
            pick = _same_quant(files, target.ref.file or "")
            if pick:
                found.append(ModelRef(repo=repo, file=pick))
        return found
    except Exception as exc:  # the search is a convenience: the catalog's candidates still count
        say(f"could not search the Hub for {family} drafts ({type(exc).__name__}: {exc})")
        return []


def _same_quant(files: list[str], target_file: str) -> Optional[str]:
    """The file with the target file's quantization tag (e.g. ``q4_k_m``), else None; split files never."""
    m = re.search(r"(i?q\d[\w]*?|f16|bf16|f32)(?=\.gguf$)", target_file, re.IGNORECASE)
    tag = m.group(1).lower() if m else ""
    usable = [f for f in files if not re.search(r"-\d{5}-of-\d{5}\.gguf$", f) and "mmproj" not in f.lower()]
    return next((f for f in usable if tag and f.lower().endswith(f"{tag}.gguf")), None)


def check_before_download(spec: PairSpec, say: Say = lambda _: None) -> None:
    """Before a pair's missing Hub files are downloaded, compare the two vocabularies from their headers.

    Offline, or with both files on disk, there is nothing to check here (loading checks them).

    Raises:
        VocabMismatchError: the headers say the draft cannot draft for the target (nothing was downloaded).
    """
    on_disk = [locate(spec.target), locate(spec.draft)]
    if all(on_disk) or truthy("HF_HUB_OFFLINE"):
        return
    headers, read = [], 0
    for ref, path in zip((spec.target, spec.draft), on_disk, strict=True):
        if path is not None or ref.is_local:
            local = path or ref.path
            assert local is not None  # a local reference always has its path
            headers.append(read_local(local))
        else:
            remote = remote_header(ref)
            headers.append(remote.header)
            read += remote.bytes_read
    verdict = same_vocabulary(headers[0], headers[1])
    if not verdict.ok:
        raise VocabMismatchError(f"{verdict.message} (pair {spec.name!r}; nothing was downloaded)")
    say(f"checked the vocabularies from the headers first ({human_bytes(read)} read): {verdict.message}")


def hub_pair(target: str, draft: Optional[str], catalog: Sequence[ModelRef], search: bool = True,
             say: Say = lambda _: None) -> tuple[RemoteGGUF, RemoteGGUF]:
    """A Hub target (``hf:ORG/REPO/FILE.gguf``) and its draft, given or found (``find_drafts``), both checked by
    their headers before any download.

    Raises:
        HubError: no draft was found, or a file cannot be read from the Hub.
        VocabMismatchError: the given draft's vocabulary is not the target's.
    """
    t = remote_header(parse_hf(target))
    say(f"target {t.describe()}: {t.header.architecture}, {t.header.size_label or '?'} "
        f"(read {human_bytes(t.bytes_read)} of {human_bytes(t.size)})")
    if draft is not None:
        d = remote_header(parse_hf(draft))
        verdict = same_vocabulary(t.header, d.header)
        if not verdict.ok:
            raise VocabMismatchError(verdict.message)
        say(f"draft {d.describe()}: {verdict.message} (read {human_bytes(d.bytes_read)} of {human_bytes(d.size)})")
        return t, d
    matches, spent = find_drafts(t, catalog, say=say, search=search)
    for m in matches:
        say(f"  candidate {m.remote.describe()}: {m.reason}")
    if not matches:
        raise HubError(f"No draft for {t.describe()} was found in the catalog{' or on the Hub' if search else ''}; "
                       "give one of the same family with --draft hf:ORG/REPO/FILE.gguf.")
    say(f"draft: {matches[0].remote.describe()} (checked by header, {human_bytes(spent)} read in all)")
    return t, matches[0].remote


def projector_of(target: ModelRef, say: Say = lambda _: None) -> Optional[ModelRef]:
    """The vision projector in a Hub target's repository, beside its file (an ``mmproj`` GGUF: the one whose
    name shares most with the target's, F16 first), or None where there is none or the listing fails."""
    from huggingface_hub import HfApi

    folder, _, name = (target.file or "").rpartition("/")
    try:
        files = HfApi(endpoint=_endpoint(), token=_token()).list_repo_files(target.repo or "",
                                                                            revision=target.revision)
    except Exception as exc:  # the target is what was asked for: a projector is a convenience
        say(f"could not list {target.repo} for a vision projector ({type(exc).__name__}: {exc})")
        return None
    best = best_projector([f.rpartition("/")[2] for f in files if f.rpartition("/")[0] == folder], name)
    if best is None:
        return None
    return ModelRef(repo=target.repo, file=f"{folder}/{best}" if folder else best, revision=target.revision)


def vocab_of(ref: str) -> tuple[VocabInfo, str]:
    """A model's vocabulary, and where it was read: a Hub file's (``hf:ORG/REPO/FILE.gguf``) from the local
    cache, else from its header (saying how much was read); any other name's from its file, by llama.cpp."""
    from ..runtime.process import read_vocab
    from .naming import model_path

    if not ref.startswith("hf:"):
        return read_vocab(model_path(ref)), ""
    cached = locate(parse_hf(ref))
    if cached is not None:
        return read_vocab(cached), " (in the local Hugging Face cache)"
    remote = remote_header(parse_hf(ref))
    return remote.header.vocab(), f" (header read: {human_bytes(remote.bytes_read)} of {human_bytes(remote.size)})"
