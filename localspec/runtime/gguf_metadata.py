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

The bytes are read, every count checked, by ``gguf_bytes``. The vocabulary
rules in ``vocab()`` (tokenizer model names, default BOS/EOS ids) follow
llama.cpp's ``llama-vocab.cpp`` in the pinned release.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from ..errors import ModelFileError
from .gguf_bytes import FIRST_CHUNK, MAGIC, SKIP_VALUES, Read, SkippedValue, read_section
from .vocab_match import VOCAB_TYPES, Compatibility, VocabInfo, compare

__all__ = ["FIRST_CHUNK", "SKIP_VALUES", "GGUFHeader", "Read", "SkippedValue", "check_gguf", "fingerprint",
           "parse", "parse_size_label", "read_local", "same_vocabulary", "vocab_type_name"]
MAX_VOCAB = 1 << 24  # the largest vocabularies are a few hundred thousand tokens

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

    def kv_bytes_per_token(self, cache_bytes: float = 2.0) -> Optional[int]:
        """Bytes of attention KV cache one token of context takes (``cache_bytes`` a value: 2 for f16).

        Counts only the layers that attend: a hybrid model's recurrent layers (no KV heads in a per-layer
        ``head_count_kv``, or all but every ``full_attention_interval``-th layer) keep a fixed-size state
        instead. None when the header lacks the attention's shape.
        """
        shape = self._attention()
        if shape is None:
            return None
        kv_heads, k, v = shape
        interval = self._int(f"{self.architecture}.full_attention_interval")
        if interval and not any(h == 0 for h in kv_heads):  # every interval-th layer attends, the rest recur
            kv_heads = [h if (i + 1) % interval == 0 else 0 for i, h in enumerate(kv_heads)]
        return int(sum(kv_heads) * (k + v) * cache_bytes)

    def mtp_bytes_per_token(self, cache_bytes: float = 2.0) -> int:
        """Bytes one token of one sequence takes for the MTP head, beside the KV cache: the hidden row the target
        keeps for the head (float32) and the head's own cache of its next-n layers. 0 without a head."""
        arch, n = self.architecture, self.mtp_layers
        layers, embd = self._int(f"{arch}.block_count"), self._int(f"{arch}.embedding_length")
        if not n or not layers or not embd:
            return 0
        shape = self._attention()
        # the last layers are the head's
        head_cache = sum(shape[0][-n:]) * (shape[1] + shape[2]) * cache_bytes if shape is not None else 0
        return int(embd * 4 + head_cache)

    def _attention(self) -> Optional[tuple[list[int], int, int]]:
        """The attention's shape: KV heads per layer, key and value lengths; None when the header lacks it."""
        arch = self.architecture
        layers, embd = self._int(f"{arch}.block_count"), self._int(f"{arch}.embedding_length")
        heads = _per_layer(self.metadata.get(f"{arch}.attention.head_count"), layers)
        kv_heads = _per_layer(self.metadata.get(f"{arch}.attention.head_count_kv"), layers) or heads
        if not layers or not embd or not heads or not kv_heads or not max(heads):
            return None
        width = embd // max(heads)
        k = self._int(f"{arch}.attention.key_length") or width
        v = self._int(f"{arch}.attention.value_length") or width
        return kv_heads, k, v

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
            path: the path to put in the result (default: ``source``); ``vocab_match.compare``
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

        Two files with the same fingerprint have vocabularies ``vocab_match.compare``
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
    """Whether ``b`` can draft for ``a``: ``vocab_match.compare`` on both headers' vocabularies.

    ``ok`` with ``padded`` set means identical except padding at the end.

    Raises:
        ModelFileError: either file has no usable tokenizer.
    """
    return compare(a.vocab(), b.vocab())


def _per_layer(value: Any, layers: Optional[int]) -> Optional[list[int]]:
    """A per-layer count given once for every layer, or as a list with one a layer."""
    if isinstance(value, int) and not isinstance(value, bool) and layers:
        return [value] * layers
    if isinstance(value, list) and value and all(isinstance(n, int) for n in value):
        return list(value)
    return None


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
    """``1`` -> ``SPM`` and so on (``vocab_match.VOCAB_TYPES``)."""
    return VOCAB_TYPES.get(vtype, "?")


def parse(read: Read, total_size: Optional[int] = None, *, name: str = "<bytes>",
          first_chunk: int = FIRST_CHUNK, skip: frozenset[str] = SKIP_VALUES) -> GGUFHeader:
    """Parse a GGUF header and key/value section through ``read`` (see ``gguf_bytes.read_section``).

    Raises:
        ModelFileError: not a GGUF, an unsupported version, truncated, or absurd counts.
    """
    s = read_section(read, total_size, name=name, first_chunk=first_chunk, skip=skip)
    return GGUFHeader(metadata=s.metadata, version=s.version, n_tensors=s.n_tensors, bytes_read=s.bytes_read,
                      source=name, kv_end=s.kv_end)


def check_gguf(path: Union[str, os.PathLike]) -> Path:
    """Return ``path`` as a Path if it is a readable GGUF file, else raise ModelFileError."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelFileError(f"Model file {p} does not exist; check the path or download it first.")
    if not p.is_file():
        raise ModelFileError(f"Model path {p} is not a file; pass the .gguf file itself.")
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise ModelFileError(f"Model file {p} cannot be read ({exc.strerror}); check its permissions.") from exc
    if magic != MAGIC:
        raise ModelFileError(
            f"Model file {p} is not a GGUF file (it starts with {magic!r}, not b'GGUF'); "
            "localspec needs llama.cpp GGUF models."
        )
    return p


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
