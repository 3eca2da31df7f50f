"""Read a GGUF file's metadata without loading its weights, from any byte source.

A GGUF file starts with a small header (magic ``GGUF``, version, tensor and
key/value counts) and a key/value section holding everything about the model
except its tensors: architecture, name, size label, context length and the
whole tokenizer. This module parses exactly that much and stops: tensor infos
and tensor data are never read.

The parser reads through a callable ``read(offset, size) -> bytes``, so the
same code reads a local file (``read_local``) or a remote one over HTTP range
requests. It asks for 256 KiB first and for more only when the key/value
section goes on (each further request at least doubles what it holds), and
reports how many bytes it read in ``GGUFHeader.bytes_read``.

Every count in the file is checked before it is used: a string longer than
what is left (or than 1 GiB), an array claiming more elements than could fit,
or a truncated file raise ``ModelFileError`` with one sentence saying which
file and what to do; nothing is allocated from an unchecked count.

Layout facts come from the GGUF specification (ggml's ``docs/gguf.md``):
little-endian; ``uint32`` magic and version, ``uint64`` tensor and key/value
counts (versions 2 and 3); a string is a ``uint64`` length and that many
UTF-8 bytes; a key/value is a string key, a ``uint32`` value type and the
value; an array is a ``uint32`` element type, a ``uint64`` count and the
elements. The vocabulary rules in ``vocab()`` (tokenizer model names, default
BOS/EOS ids) follow llama.cpp's ``llama-vocab.cpp`` in the pinned release.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

from .backend import VocabInfo
from .compat import VOCAB_TYPES, Compatibility, compare
from .errors import ModelFileError

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
MAX_VOCAB = 1 << 24  # the largest vocabularies are a few hundred thousand tokens
MAX_DEPTH = 3  # nested arrays: the format allows them, no model uses more than one level

# value type -> (struct format, size in bytes); strings (8) and arrays (9) are handled apart
_SCALARS: dict[int, tuple[str, int]] = {
    0: ("B", 1), 1: ("b", 1), 2: ("H", 2), 3: ("h", 2), 4: ("I", 4), 5: ("i", 4),
    6: ("f", 4), 7: ("?", 1), 10: ("Q", 8), 11: ("q", 8), 12: ("d", 8),
}
_STRING, _ARRAY = 8, 9

#: Arrays whose values are skipped (still walked past): large, and not needed for listing or pairing.
SKIP_VALUES = frozenset({"tokenizer.ggml.merges", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"})

#: tokenizer.ggml.model -> (llama_vocab_type, default BOS id, default EOS id), as llama.cpp sets them.
_TOKENIZERS: dict[str, tuple[int, int, int]] = {
    "llama": (1, 1, 2),
    "gpt2": (2, 11, 11), "hybriddna": (2, 11, 11), "whitespace": (2, 11, 11), "gemma4": (2, -1, -1),
    "bert": (3, 101, -1),
    "t5": (4, -1, 1),
    "rwkv": (5, -1, -1),
    "plamo2": (6, 1, 2),
    "test": (7, -1, -1),
}
_NO_VOCAB = ("none", "no_vocab")
_NO_BOS_PRE = ("chatglm-bpe", "glm4", "glm5")  # BPE pre-tokenizers for which llama.cpp drops the default BOS

#: general.file_type (llama_ftype) -> quantization name.
FILE_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
    36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE",
}

_SIZE_LABEL = re.compile(r"^(?:(\d+)x)?(\d+(?:\.\d+)?)([KMBT])$", re.IGNORECASE)
_SCALE = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}


@dataclass(frozen=True)
class SkippedValue:
    """Stands in for an array whose elements were walked past, not kept (see ``SKIP_VALUES``)."""

    elem_type: int
    count: int


@dataclass
class GGUFHeader:
    """A GGUF file's header and key/value metadata.

    Attributes:
        metadata: every key/value; strings as ``str`` (undecodable bytes kept as
            surrogate escapes), arrays as lists, skipped arrays as ``SkippedValue``.
        version: the GGUF format version (2 or 3).
        n_tensors: how many tensors the file declares (their infos are not read).
        bytes_read: how many bytes the parse read from the source.
        source: the file's path or URL, for messages.
        kv_end: the offset just past the key/value section.
    """

    metadata: dict[str, Any]
    version: int
    n_tensors: int
    bytes_read: int
    source: str = "<bytes>"
    kv_end: int = 0
    _vocab: Optional[VocabInfo] = field(default=None, init=False, repr=False, compare=False)
    _fingerprint: Optional[str] = field(default=None, init=False, repr=False, compare=False)

    def _str(self, key: str) -> Optional[str]:
        value = self.metadata.get(key)
        return value if isinstance(value, str) else None

    def _int(self, key: str) -> Optional[int]:
        value = self.metadata.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def architecture(self) -> Optional[str]:
        """``general.architecture`` (e.g. ``qwen2``, ``llama``)."""
        return self._str("general.architecture")

    @property
    def name(self) -> Optional[str]:
        """``general.name``."""
        return self._str("general.name")

    @property
    def model_type(self) -> Optional[str]:
        """``general.type``: ``model``, ``adapter``, ``mmproj``... (None when absent)."""
        return self._str("general.type")

    @property
    def size_label(self) -> Optional[str]:
        """``general.size_label`` (e.g. ``1.5B``, ``8x7B``), or None."""
        return self._str("general.size_label")

    @property
    def parameter_count(self) -> Optional[int]:
        """``general.parameter_count`` when the file states it, else None."""
        return self._int("general.parameter_count")

    @property
    def parameters(self) -> Optional[int]:
        """The parameter count: stated, or estimated from the size label (``1.5B`` -> 1.5e9); None if neither."""
        return self.parameter_count or parse_size_label(self.size_label)

    @property
    def file_type(self) -> Optional[int]:
        """``general.file_type`` (a llama_ftype value), or None."""
        return self._int("general.file_type")

    @property
    def quantization(self) -> Optional[str]:
        """The file type's name (``Q4_K_M``, ``F16``...), or None when absent or unknown."""
        ft = self.file_type
        return FILE_TYPES.get(ft) if ft is not None else None

    @property
    def mtp_layers(self) -> int:
        """``{architecture}.nextn_predict_layers``: the model's MTP head (next-n layers); 0 when it has none."""
        return self._int(f"{self.architecture}.nextn_predict_layers") or 0

    @property
    def context_length(self) -> Optional[int]:
        """``{architecture}.context_length``: the training context, or None."""
        arch = self.architecture
        return self._int(f"{arch}.context_length") if arch else None

    @property
    def split_count(self) -> int:
        """How many files a split model (gguf-split) spans: ``split.count``, 1 when not split."""
        return self._int("split.count") or 1

    @property
    def source_hints(self) -> dict[str, str]:
        """Where the weights came from: every ``general.base_model.*``, ``general.source.*``,
        ``general.repo_url``/``general.url``/``general.organization``/``general.basename`` string present."""
        prefixes = ("general.base_model.", "general.source.")
        singles = ("general.repo_url", "general.url", "general.organization", "general.basename",
                   "general.finetune", "general.quantized_by")
        return {k: v for k, v in self.metadata.items()
                if isinstance(v, str) and (k.startswith(prefixes) or k in singles)}

    @property
    def tokenizer_model(self) -> Optional[str]:
        """``tokenizer.ggml.model`` (``gpt2``, ``llama``...), or None."""
        return self._str("tokenizer.ggml.model")

    @property
    def n_tokens(self) -> int:
        """The vocabulary's size (0 without a tokenizer)."""
        try:
            return self.vocab().n_tokens
        except ModelFileError:
            return 0

    def vocab(self, path: Union[str, os.PathLike, None] = None) -> VocabInfo:
        """The vocabulary as llama.cpp would load it: type, BOS/EOS ids and every token's text.

        Args:
            path: the path to put in the result (default: ``source``); ``compat.compare``
                names files by it.

        Raises:
            ModelFileError: the file has no tokenizer, an unknown tokenizer model, or a
                token list of the wrong type.
        """
        if self._vocab is None:
            self._vocab = self._read_vocab()
        if path is None:
            return self._vocab
        v = self._vocab
        return VocabInfo(Path(path), v.type, v.bos, v.eos, v.texts)

    def _read_vocab(self) -> VocabInfo:
        where = Path(self.source)
        model = self.tokenizer_model
        if model is None:
            raise ModelFileError(f"{self.source} has no tokenizer (tokenizer.ggml.model is missing); "
                                 "it is not a language model llama.cpp can run.")
        if model in _NO_VOCAB:
            size = (self._int(f"{self.architecture}.vocab_size") if self.architecture else None) or 0
            if size > MAX_VOCAB:
                raise ModelFileError(f"{self.source} declares a vocabulary of {size} tokens, which no model has; "
                                     "the file is damaged: re-download it.")
            return VocabInfo(where, 0, -1, -1, [b""] * size)  # llama.cpp's placeholder tokens
        if model not in _TOKENIZERS:
            raise ModelFileError(f"{self.source} uses tokenizer {model!r}, which this llama.cpp does not know; "
                                 "update localspec or pick another model.")
        vtype, bos, eos = _TOKENIZERS[model]
        if vtype == 2 and self._str("tokenizer.ggml.pre") in _NO_BOS_PRE:
            bos = -1
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise ModelFileError(f"{self.source} has no readable token list (tokenizer.ggml.tokens); "
                                 "the file is damaged: re-download it.")
        texts = [t.encode("utf-8", "surrogateescape") for t in tokens]
        n = len(texts)
        ids = []
        for default, key in ((bos, "tokenizer.ggml.bos_token_id"), (eos, "tokenizer.ggml.eos_token_id")):
            value = default if 0 <= default < n else -1  # llama.cpp disables an out-of-range default
            stated = self._int(key)
            if stated is not None and 0 <= stated < n:
                value = stated
            ids.append(value)
        return VocabInfo(where, vtype, ids[0], ids[1], texts)

    def vocab_fingerprint(self) -> Optional[str]:
        """A short stable hash of the vocabulary (tokenizer type, BOS, EOS, every token's text).

        Two files with the same fingerprint have vocabularies ``compat.compare``
        accepts without padding. None for a file without a usable tokenizer.
        """
        if self._fingerprint is None:
            try:
                self._fingerprint = fingerprint(self.vocab())
            except ModelFileError:
                return None
        return self._fingerprint


def fingerprint(v: VocabInfo) -> str:
    """sha256 (first 16 hex digits) over a vocabulary's type, BOS, EOS and length-prefixed token texts."""
    h = hashlib.sha256(struct.pack("<iiiQ", v.type, v.bos, v.eos, len(v.texts)))
    for t in v.texts:
        h.update(struct.pack("<I", len(t)))
        h.update(t)
    return h.hexdigest()[:16]


def same_vocabulary(a: GGUFHeader, b: GGUFHeader) -> Compatibility:
    """Whether ``b`` can draft for ``a``: ``compat.compare`` on both headers' vocabularies.

    ``ok`` with ``padded`` set means identical except padding at the end.

    Raises:
        ModelFileError: either file has no usable tokenizer.
    """
    return compare(a.vocab(), b.vocab())


def parse_size_label(label: Optional[str]) -> Optional[int]:
    """A size label's parameter count: ``"1.5B"`` -> 1_500_000_000, ``"8x7B"`` -> 56e9, ``"494M"``.

    Labels with a suffix (``"30B-A3B"``, ``"7B-Instruct"``) count their first part; anything
    else gives None.
    """
    if not label:
        return None
    m = _SIZE_LABEL.match(label.strip().split("-")[0].split(",")[0])
    if not m:
        return None
    experts = int(m.group(1)) if m.group(1) else 1
    return int(round(experts * float(m.group(2)) * _SCALE[m.group(3).upper()]))


def vocab_type_name(vtype: int) -> str:
    """``1`` -> ``SPM`` and so on (``compat.VOCAB_TYPES``)."""
    return VOCAB_TYPES.get(vtype, "?")


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


def parse(read: Read, total_size: Optional[int] = None, *, name: str = "<bytes>",
          first_chunk: int = FIRST_CHUNK, skip: frozenset[str] = SKIP_VALUES) -> GGUFHeader:
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
        The header, with ``bytes_read`` set.

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
    return GGUFHeader(metadata=metadata, version=version, n_tensors=n_tensors, bytes_read=cur.bytes_read,
                      source=name, kv_end=cur.pos)


def read_local(path: Union[str, os.PathLike], *, first_chunk: int = FIRST_CHUNK,
               skip: frozenset[str] = SKIP_VALUES) -> GGUFHeader:
    """Parse a local GGUF's header (see ``parse``); only the key/value section is read.

    Raises:
        ModelFileError: missing, unreadable, not a GGUF, truncated or damaged.
    """
    p = Path(path).expanduser()
    try:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size

            def read(offset: int, n: int) -> bytes:
                f.seek(offset)
                return f.read(n)

            return parse(read, size, name=str(p), first_chunk=first_chunk, skip=skip)
    except FileNotFoundError as exc:
        raise ModelFileError(f"Model file {p} does not exist; check the path or download it first.") from exc
    except IsADirectoryError as exc:
        raise ModelFileError(f"Model path {p} is a directory; pass the .gguf file itself.") from exc
    except OSError as exc:
        raise ModelFileError(f"Model file {p} cannot be read ({exc.strerror or exc}); check its permissions.") from exc
