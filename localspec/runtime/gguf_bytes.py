"""The GGUF container's bytes, read safely: header, key/value section, and nothing after it.

Every count in the file is checked before it is used: a string longer than
what is left (or than 1 GiB), an array claiming more elements than could fit,
or a truncated file raise ``ModelFileError`` with one sentence saying which
file and what to do; nothing is allocated from an unchecked count.

Layout facts come from the GGUF specification (ggml's ``docs/gguf.md``):
little-endian; ``uint32`` magic and version, ``uint64`` tensor and key/value
counts (versions 2 and 3); a string is a ``uint64`` length and that many
UTF-8 bytes; a key/value is a string key, a ``uint32`` value type and the
value; an array is a ``uint32`` element type, a ``uint64`` count and the
elements.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional

from ..errors import ModelFileError

#: ``read(offset, size)``: up to ``size`` bytes from ``offset`` (fewer only at the end of the file).
Read = Callable[[int, int], bytes]

MAGIC = b"GGUF"
FIRST_CHUNK = 256 * 1024
MAX_STRING = 1 << 30  # no single GGUF string is anywhere near this long
MAX_CHUNK = 64 << 20  # reads grow by doubling up to this
MAX_KEY = 65535  # the specification's limit on key length
MAX_ELEMENTS = 1 << 32
MAX_KV = 1 << 20
MAX_TENSORS = 1 << 32
MAX_DEPTH = 3  # nested arrays: the format allows them, no model uses more than one level

# value type -> (struct format, size in bytes); strings (8) and arrays (9) are handled apart
_SCALARS: dict[int, tuple[str, int]] = {
    0: ("B", 1), 1: ("b", 1), 2: ("H", 2), 3: ("h", 2), 4: ("I", 4), 5: ("i", 4),
    6: ("f", 4), 7: ("?", 1), 10: ("Q", 8), 11: ("q", 8), 12: ("d", 8),
}
_STRING, _ARRAY = 8, 9

#: Arrays whose values are skipped (still walked past): large, and not needed for listing or pairing.
SKIP_VALUES = frozenset({"tokenizer.ggml.merges", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"})


@dataclass(frozen=True)
class SkippedValue:
    """Stands in for an array whose elements were walked past, not kept (see ``SKIP_VALUES``)."""

    elem_type: int
    count: int


class Section(NamedTuple):
    """What ``read_section`` read: the key/value section and where it ends."""

    metadata: dict[str, Any]
    version: int
    n_tensors: int
    bytes_read: int
    kv_end: int


class _Cursor:
    """Sequential reads over ``read`` with a growing window; knows how far the source goes when told."""

    def __init__(self, read: Read, name: str, total: Optional[int], first_chunk: int):
        self._read, self.name = read, name
        self.pos = 0
        self._base = 0  # offset of _buf[0]
        self._buf = b""
        self._chunk = max(64, first_chunk)
        self.bytes_read = 0
        self.eof: Optional[int] = total  # set when a read comes back short

    def _fail(self, what: str) -> ModelFileError:
        return ModelFileError(f"{self.name} is truncated inside its GGUF header ({what}); "
                              "the download is incomplete or the file is damaged: re-download it.")

    def remaining(self) -> Optional[int]:
        """Bytes left after the position, when the source's size is known."""
        return None if self.eof is None else max(0, self.eof - self.pos)

    def need(self, n: int, what: str) -> memoryview:
        """The next ``n`` bytes (not consumed), fetching more from the source when needed."""
        if n > MAX_STRING:
            raise ModelFileError(f"{self.name} declares a {what} of {n} bytes, which no GGUF header has; "
                                 "the file is damaged: re-download it.")
        if self.eof is not None and self.pos + n > self.eof:
            raise self._fail(what)
        while self.pos + n > self._base + len(self._buf):
            end = self._base + len(self._buf)
            start = max(end, self.pos)
            if self.eof is not None:  # the bytes are known to be there: ask for all that is missing at once
                size = min(max(self._chunk, self.pos + n - start), self.eof - start)
            else:  # a count may lie: ask in doubling chunks until the source runs out
                size = self._chunk
            data = self._read(start, size) if size > 0 else b""
            if not isinstance(data, (bytes, bytearray)):
                raise TypeError("read() must return bytes")
            data = bytes(data[:size])  # a source that returns more than asked must not widen the window
            self.bytes_read += len(data)
            keep = self._buf[self.pos - self._base:] if self.pos < end else b""
            self._buf, self._base = keep + data, self.pos
            self._chunk = min(self._chunk * 2, MAX_CHUNK)
            if len(data) < size:
                self.eof = start + len(data)
            if not data or (self.eof is not None and self.pos + n > self.eof):
                raise self._fail(what)
        i = self.pos - self._base
        return memoryview(self._buf)[i:i + n]

    def peek(self) -> bytes:
        """Whatever is buffered from the position on (for messages about a short file)."""
        return self._buf[max(0, self.pos - self._base):]

    def take(self, n: int, what: str) -> bytes:
        data = bytes(self.need(n, what))
        self.pos += n
        return data

    def unpack(self, fmt: str, size: int, what: str) -> Any:
        value = struct.unpack_from("<" + fmt, self.need(size, what))[0]
        self.pos += size
        return value

    def skip(self, n: int, what: str) -> None:
        """Move past ``n`` bytes without fetching them (the next read checks they existed)."""
        if self.eof is not None and self.pos + n > self.eof:
            raise self._fail(what)
        self.pos += n


class _Parser:
    def __init__(self, cur: _Cursor):
        self.cur = cur

    def bad(self, what: str) -> ModelFileError:
        return ModelFileError(f"{self.cur.name} has a malformed GGUF header ({what}); "
                              "the file is damaged or not a model: re-download it.")

    def count(self, n: int, min_size: int, limit: int, what: str) -> int:
        """Check a declared element count against a hard limit and what is left of the source."""
        left = self.cur.remaining()
        if n > limit or (left is not None and n * min_size > left):
            raise ModelFileError(f"{self.cur.name} declares {n} {what}, more than the file could hold; "
                                 "the file is damaged: re-download it.")
        return n

    def string(self, what: str, keep: bool = True, limit: int = MAX_STRING) -> Optional[str]:
        n = self.cur.unpack("Q", 8, f"length of {what}")
        if n > limit:
            raise self.bad(f"{what} claims {n} bytes")
        if not keep:
            self.cur.skip(n, what)
            return None
        return self.cur.take(n, what).decode("utf-8", "surrogateescape")

    def value(self, vtype: int, key: str, keep: bool, depth: int = 0) -> Any:
        if vtype in _SCALARS:
            fmt, size = _SCALARS[vtype]
            if not keep:
                self.cur.skip(size, key)
                return None
            return self.cur.unpack(fmt, size, key)
        if vtype == _STRING:
            return self.string(f"value of {key}", keep)
        if vtype == _ARRAY:
            if depth >= MAX_DEPTH:
                raise self.bad(f"{key} nests arrays more than {MAX_DEPTH} deep")
            etype = self.cur.unpack("I", 4, f"element type of {key}")
            n = self.cur.unpack("Q", 8, f"length of {key}")
            if etype in _SCALARS:
                fmt, size = _SCALARS[etype]
                self.count(n, size, MAX_ELEMENTS, f"elements in {key}")
                if not keep:
                    self.cur.skip(n * size, key)
                    return SkippedValue(etype, n)
                raw = self.cur.take(n * size, key)  # the bytes exist: need() checked them first
                return list(struct.unpack(f"<{n}{fmt}", raw))
            if etype not in (_STRING, _ARRAY):
                raise self.bad(f"{key} has unknown element type {etype}")
            self.count(n, 8 if etype == _STRING else 12, MAX_ELEMENTS, f"elements in {key}")
            if etype == _STRING and not keep:
                for _ in range(n):
                    self.string(f"element of {key}", keep=False)
                return SkippedValue(etype, n)
            out = []
            for _ in range(n):
                out.append(self.value(etype, key, keep, depth + 1))
            return out if keep else SkippedValue(etype, n)
        raise self.bad(f"{key} has unknown value type {vtype}")


def read_section(read: Read, total_size: Optional[int] = None, *, name: str = "<bytes>",
                 first_chunk: int = FIRST_CHUNK, skip: frozenset[str] = SKIP_VALUES) -> Section:
    """Parse a GGUF header and key/value section through ``read``; nothing after it is read.

    Args:
        read: ``read(offset, size)`` returning up to ``size`` bytes from ``offset``
            (fewer only at the end of the source).
        total_size: the source's size in bytes, when known: then no read goes past it,
            and counts are checked against it.
        name: the file's path or URL, for messages and ``GGUFHeader.source``.
        first_chunk: bytes asked for by the first read.
        skip: keys whose array values are walked past, not kept.

    Returns:
        The metadata, the version, the tensor count, the bytes read and where the section ends.

    Raises:
        ModelFileError: not a GGUF, an unsupported version, truncated, or absurd counts.
    """
    cur = _Cursor(read, name, total_size, first_chunk)
    try:
        magic = cur.take(4, "magic")
    except ModelFileError:
        magic = bytes(cur.peek())
    if magic != MAGIC:
        raise ModelFileError(f"{name} is not a GGUF file (it starts with {magic[:4]!r}, not b'GGUF'); "
                             "localspec needs llama.cpp GGUF models.")
    version = cur.unpack("I", 4, "version")
    if version not in (2, 3):
        hint = ("a big-endian GGUF" if version & 0xFFFF == 0 and version >> 16 else f"GGUF version {version}")
        raise ModelFileError(f"{name} is {hint}, which llama.cpp cannot load (it needs little-endian "
                             "version 2 or 3); download a current GGUF of this model.")
    p = _Parser(cur)
    n_tensors = p.count(cur.unpack("Q", 8, "tensor count"), 0, MAX_TENSORS, "tensors")
    n_kv = p.count(cur.unpack("Q", 8, "key/value count"), 13, MAX_KV, "metadata keys")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = p.string("a metadata key", limit=MAX_KEY)
        assert key is not None
        if key in metadata:
            raise p.bad(f"key {key!r} appears twice")  # llama.cpp refuses such a file too
        vtype = cur.unpack("I", 4, f"type of {key}")
        metadata[key] = p.value(vtype, key, keep=key not in skip)
    return Section(metadata, version, n_tensors, cur.bytes_read, cur.pos)
