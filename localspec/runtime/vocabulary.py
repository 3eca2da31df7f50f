"""A loaded model's vocabulary: ids checked before llama.cpp sees them, text to ids and back.

``Model`` gets these methods from ``ModelVocabulary``; a ``Detokenizer``
turns a stream of ids into text without splitting a character.
"""

from __future__ import annotations

import codecs
import ctypes
import functools
from pathlib import Path
from typing import Optional, Sequence, Union

import llama_cpp as ll
import numpy as np

from ..errors import ConfigError, TokenIdError
from .process import vocab_of_model
from .vocab_match import VocabInfo

#: Token ids as a list or a 1-D integer array.
Tokens = Union[Sequence[int], np.ndarray]


class ModelVocabulary:
    """The vocabulary methods of a loaded model (``model.Model``), over llama.cpp's vocabulary pointer."""

    path: Path
    n_vocab: int
    _model: Optional[ll.llama_model_p]
    _vocab: ll.llama_vocab_p

    def _init_vocabulary(self) -> None:
        """Read the vocabulary of the loaded ``_model`` (call once, after loading)."""
        self._vocab = ll.llama_model_get_vocab(self._model)
        self.n_vocab = int(ll.llama_vocab_n_tokens(self._vocab))
        self.bos = int(ll.llama_vocab_bos(self._vocab))
        self.eos = int(ll.llama_vocab_eos(self._vocab))
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}

    def check_tokens(self, tokens: Tokens) -> np.ndarray:
        """``tokens`` as an int32 array, once every id is known to be in this model's vocabulary.

        llama.cpp aborts the whole process on an id outside the vocabulary, so
        every call that hands ids to it checks them here first.

        Raises:
            TokenIdError: an id is not a whole number from 0 to ``n_vocab - 1``.
        """
        if type(tokens) is list and len(tokens) <= 16 and all(type(t) is int and 0 <= t < self.n_vocab
                                                               for t in tokens):
            return np.array(tokens, dtype=np.int32)  # a round's few ids: checked without numpy's overhead
        try:
            ids = np.asarray(tokens)
        except (OverflowError, ValueError):  # ragged, or an int too large for any integer dtype
            ids = np.asarray(list(tokens), dtype=object)
        if ids.ndim != 1:
            raise TokenIdError(f"Token ids must be a flat list of whole numbers, got an array of shape {ids.shape}.")
        if not ids.size:
            return ids.astype(np.int32)
        if ids.dtype.kind not in "iu":  # floats, bools, strings or huge Python ints: judged one by one
            ids = np.asarray([self._bad_token(t) for t in tokens], dtype=np.int64)
        if ids.max() >= self.n_vocab:
            self._bad_token(int(ids[ids >= self.n_vocab][0]))
        if ids.min() < 0 and not self.accepts_images(ids):  # negative ids are images' placeholders, if known
            self._bad_token(int(ids[ids < 0][0]))
        return ids.astype(np.int32)

    def accepts_images(self, ids: np.ndarray) -> bool:
        """Whether the negative ids in ``ids`` are images' placeholders this model reads (see ``runtime.vision``)."""
        return False

    def check_token(self, token: int) -> None:
        """Raise TokenIdError unless ``token`` is an id in this model's vocabulary."""
        if not (isinstance(token, (int, np.integer)) and 0 <= token < self.n_vocab):
            self._bad_token(token)

    def _bad_token(self, token: object) -> int:
        """Raise TokenIdError for ``token`` if it is not a valid id; otherwise return it."""
        if isinstance(token, np.generic):
            token = token.item()  # numpy scalars are judged, and named, as the Python values they hold
        whole = isinstance(token, int) and not isinstance(token, bool)
        if whole and 0 <= token < self.n_vocab:  # type: ignore[operator]
            return token  # type: ignore[return-value]
        if not whole:
            raise TokenIdError(f"Token id {token!r} is not a whole number; token ids are integers from 0 to "
                               f"{self.n_vocab - 1} for {self.path.name}.")
        raise TokenIdError(f"Token id {token!r} is outside the vocabulary of {self.path.name}, whose ids run from 0 "
                           f"to {self.n_vocab - 1} ({self.n_vocab} tokens); send ids this model knows, or text.")

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Text to token ids.

        Args:
            text: the text.
            add_special: add BOS (and EOS) if the model is configured to.
            parse_special: turn special-token text such as ``<|im_start|>`` into its id.
        """
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigError(f"The text is not valid Unicode: it has a lone surrogate (U+{ord(text[exc.start]):04X}) "
                              f"at character {exc.start}; send text that encodes as UTF-8.") from None
        cap = len(data) + 8
        while True:
            buf = (ll.llama_token * cap)()
            n = ll.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
            if n >= 0:
                return list(buf[:n])
            cap = -n  # too small: llama.cpp says how many it needs

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token stands for (special tokens give b'')."""
        piece = self._pieces.get(token)
        if piece is None:
            self.check_token(token)
            buf = ctypes.create_string_buffer(64)
            n = ll.llama_token_to_piece(self._vocab, token, buf, 64, 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = ll.llama_token_to_piece(self._vocab, token, buf, -n, 0, False)
            piece = buf.raw[:n]
            self._pieces[token] = piece
        return piece

    def detokenize(self, tokens: Tokens) -> str:
        """Token ids to text (invalid UTF-8 replaced; in a model that sees images, their placeholders give none).

        Raises:
            TokenIdError: an id outside the vocabulary (a placeholder where the model sees no images).
        """
        skip = self.sees_images  # an image's positions: negative ids, no text
        return b"".join(self.token_bytes(int(t)) for t in tokens if not (skip and t < 0)).decode(
            "utf-8", errors="replace")

    @property
    def sees_images(self) -> bool:
        """Whether images' placeholder ids may reach this model (``image_runs.ImageRuns`` says, for a model)."""
        return False

    def token_text(self, token: int) -> bytes:
        """The vocabulary's stored text of a token (as in the GGUF), for comparisons."""
        self.check_token(token)
        return ll.llama_vocab_get_text(self._vocab, token) or b""

    @property
    def vocab_pointer(self) -> ll.llama_vocab_p:
        """llama.cpp's vocabulary of this model (for a grammar engine that reads it; valid while the model is)."""
        return self._vocab

    def vocab_info(self) -> VocabInfo:
        """This model's vocabulary (for compatibility checks)."""
        return vocab_of_model(self.path, self._vocab)

    @functools.cached_property
    def longest_token_bytes(self) -> int:
        """The longest token's stored text in UTF-8 bytes: no token covers more bytes of a prompt."""
        return max(len(t) for t in self.vocab_info().texts)

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, <|im_end|>...)."""
        r = self._eog.get(token)
        if r is None:
            self.check_token(token)
            r = self._eog[token] = bool(ll.llama_vocab_is_eog(self._vocab, token))
        return r

    def chat_template(self) -> Optional[str]:
        """The Jinja2 chat template stored in the GGUF, if any."""
        raw = ll.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8") if raw else None

    @property
    def adds_bos(self) -> bool:
        """Whether the vocabulary puts BOS before a prompt (``tokenize`` with ``add_special``)."""
        return bool(ll.llama_vocab_get_add_bos(self._vocab))

    def fim_tokens(self) -> Optional[tuple[int, int, int]]:
        """The fill-in-the-middle tokens (prefix, suffix, middle) as llama.cpp finds them, or None without."""
        ids = tuple(int(f(self._vocab)) for f in (ll.llama_vocab_fim_pre, ll.llama_vocab_fim_suf,
                                                  ll.llama_vocab_fim_mid))
        return None if min(ids) < 0 else (ids[0], ids[1], ids[2])

    def special_text(self, token: int) -> str:
        """A special token's text as templates spell it (e.g. ``<|endoftext|>``)."""
        if token < 0:
            return ""
        return self.token_text(token).decode("utf-8", errors="replace")


class Detokenizer:
    """Turns a stream of token ids into text, holding back split UTF-8 sequences.

    A multi-byte character can be spread over several byte-level tokens; the
    incremental decoder emits it only once it is complete.
    """

    def __init__(self, model: ModelVocabulary):
        self._model = model
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token: int) -> str:
        """Text completed by this token (may be empty)."""
        return self._decoder.decode(self._model.token_bytes(token))

    def flush(self) -> str:
        """Whatever is still held back (an incomplete sequence becomes U+FFFD)."""
        return self._decoder.decode(b"", final=True)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two token arrays."""
    m = min(len(a), len(b))
    diff = np.flatnonzero(a[:m] != b[:m])
    return int(diff[0]) if diff.size else m
