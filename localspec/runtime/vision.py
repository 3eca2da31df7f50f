"""Images in a target's memory: a vision projector (an ``mmproj`` GGUF) through llama.cpp's ``libmtmd``.

A prompt with images is still a list of ids. Each image becomes as many *placeholder ids* as the positions it
takes in the target's memory: negative numbers derived from the image's content (and the projector's file), so
the same image gives the same ids in any prompt and any process. Everything that reasons about prompts as ids
keeps working: a prompt cache finds a follow-up about the same screenshot by its prefix and restores it without
encoding the image again, and two requests about one image share its cells. What reads ids knows the few things
that differ: llama.cpp decodes an image's placeholders as its projected embeddings (``decode_chunk``, called by
``image_runs.ImageRuns``), a draft model without a projector reads a stand-in token in their place, a drafter
never proposes them, and a cut never lands inside an image.
"""

from __future__ import annotations

import collections
import concurrent.futures
import ctypes
import hashlib
import os
import secrets
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence, Union

import llama_cpp as ll
import numpy as np

from ..errors import ModelFileError, NotInstalledError
from .gguf_metadata import check_gguf
from .image_files import MAX_IMAGE_BYTES, MAX_PROMPT_PIXELS, ImageError, readable
from .process import LlamaLog, log_callback

__all__ = ["MAX_IMAGE_BYTES", "MAX_IMAGES", "ImageError", "ImageIds", "Projector"]

#: The most images one prompt may hold.
MAX_IMAGES = 16

#: Image chunks kept after their prompt's generation (their preprocessed pixels, and their embeddings while
#: ``HELD_EMBEDDING_BYTES`` allows), newest last: a follow-up about a recent image needs no encoding even where
#: its cells went to other requests. A prompt being generated holds its own chunks whatever this says.
HELD_CHUNKS = 32
#: Bytes of encoded image embeddings kept on the held chunks; the oldest go first.
HELD_EMBEDDING_BYTES = 256 << 20

_TEXT_CHUNK = 0  # mtmd_input_chunk_type values
_ID_RANGE = (2, (1 << 31) - 1)  # placeholder ids are minus a number in this range


def _mtmd() -> Any:
    """llama-cpp-python's ``mtmd`` binding, or a clear error where this build has no ``libmtmd``."""
    try:
        from llama_cpp import mtmd_cpp
    except (ImportError, OSError, FileNotFoundError) as exc:
        raise NotInstalledError(
            "This llama-cpp-python was built without libmtmd, which images need; reinstall it with "
            "scripts/install.sh (it builds libmtmd), or with CMAKE_ARGS including -DLLAVA_BUILD=ON.") from exc
    return mtmd_cpp


@dataclass(eq=False)
class _Chunk:
    """One image chunk of a prompt: an image, or one tile of one. Its mtmd chunk is freed with it."""

    key: bytes  # the image's digest, the projector's and the tile's index: what its ids derive from
    ptr: Any  # the mtmd chunk, owned here
    ids: np.ndarray  # its placeholder ids, one per position it takes
    n_tokens: int  # embeddings it decodes to (positions can be fewer, under M-RoPE)
    free: Any  # mtmd_input_chunk_free
    embd: Optional[np.ndarray] = None  # its encoded embeddings, while kept

    def __del__(self) -> None:
        if self.ptr:
            self.free(self.ptr)
            self.ptr = None


class ImageIds(list):  # type: ignore[type-arg]
    """A prompt's ids (``list[int]``) that holds its images' chunks for as long as the prompt lives, so that a
    busy server's later images cannot evict them before its generation reads them."""

    chunks: list[_Chunk]


class Projector:
    """A vision projector loaded beside a target model.

    Args:
        path: the ``mmproj`` GGUF made for the target's family.
        model: the target (a ``runtime.model.Model``); the projector's output width must be its input width.
        n_threads: CPU threads for encoding images (default: the target's batch threads).
        verbose: let libmtmd print its log.

    Raises:
        ModelFileError: the file is missing, not a GGUF, not a vision projector, or not made for this model.
        NotInstalledError: llama-cpp-python was built without libmtmd.
    """

    def __init__(self, path: Union[str, os.PathLike], model: Any, *, n_threads: Optional[int] = None,
                 verbose: bool = False):
        mt = _mtmd()
        from PIL import Image  # reads image headers: its format plugins loaded now, not on the first request's time

        Image.init()
        self.path = check_gguf(path)
        self._mt = mt
        self._log = LlamaLog(verbose)
        #: Text that stands for an image in a prompt given to ``tokenize``; random, so no user text holds it.
        self.marker = f"<__localspec_image_{secrets.token_hex(6)}__>"
        params = mt.mtmd_context_params_default()
        params.n_threads = n_threads or model.n_threads_batch
        params.print_timings = verbose
        params.warmup = False  # the first image pays its own graph, as llama-server's do by default
        params.media_marker = self.marker.encode()
        with self._logging():
            self._ctx = mt.mtmd_init_from_file(str(self.path).encode(), model._model, params)
        if not self._ctx:
            detail = self._log.last_error()
            raise ModelFileError(f"{self.path.name} could not be loaded as a vision projector for "
                                 f"{model.path.name}{': ' + detail if detail else ''}; give the mmproj file made "
                                 "for this model (from the same repository).")
        if not mt.mtmd_support_vision(self._ctx):
            self.close()
            raise ModelFileError(f"{self.path.name} is a projector without vision (audio only); localspec reads "
                                 "images only.")
        st = self.path.stat()
        # a file's identity, as its ids carry it: another projector's embeddings must never be restored
        self._identity = hashlib.sha256(f"{self.path.name}|{st.st_size}|{st.st_mtime_ns}".encode()).digest()
        #: Width of an image embedding: the target's input width.
        self.n_embd = int(ll.llama_model_n_embd_inp(model._model))
        #: The token a model without a projector (the draft model, an MTP head) reads where an image lies.
        self.stand_in = (model.tokenize("\n", add_special=False, parse_special=False) or [model.eos])[0]
        #: Whether positions follow M-RoPE (an image takes fewer positions than embeddings).
        self.mrope = bool(mt.mtmd_decode_use_mrope(self._ctx))
        #: Images encoded so far (a cached prompt's images are not encoded again).
        self.encodes = 0
        self._held: collections.OrderedDict[bytes, _Chunk] = collections.OrderedDict()  # the newest, kept
        self._live: weakref.WeakValueDictionary[bytes, _Chunk] = weakref.WeakValueDictionary()  # held, or in use
        self._where: dict[int, tuple[weakref.ref[_Chunk], int]] = {}  # placeholder id: its chunk, position in it
        self._lock = threading.Lock()  # requests tokenize on their threads while the loop decodes
        self._encoding = threading.Lock()  # one encode at a time: the loop's own, or the encoder thread's
        self._encoder: Optional[concurrent.futures.ThreadPoolExecutor] = None

    def _logging(self) -> Any:
        """Route libmtmd's log (and llama.cpp's) to this projector's ``LlamaLog`` for one call."""
        self._mt.mtmd_helper_log_set(log_callback, ctypes.c_void_p(id(self._log)))
        return self._log

    def close(self) -> None:
        """Free the projector and the chunks it holds."""
        if self._encoder is not None:
            self._encoder.shutdown(wait=True)
            self._encoder = None
        with self._lock:
            self._held.clear()  # each chunk frees its mtmd chunk once no prompt holds it
            self._where.clear()
            if getattr(self, "_ctx", None):
                self._mt.mtmd_free(self._ctx)
                self._ctx = None
            self._mt.mtmd_helper_log_set(log_callback, ctypes.c_void_p(0))

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # -- prompts ----------------------------------------------------------------------

    def tokenize(self, text: str, images: Sequence[bytes], *, add_special: bool = False,
                 parse_special: bool = True) -> ImageIds:
        """``text`` with ``marker`` where each of ``images`` goes, as ids: text tokens, and each image's
        placeholder ids where the projector wraps it (with the model's own image tokens around it, and tiles).
        The ids hold the images' chunks: keep them until the generation has read the prompt.

        Raises:
            ImageError: too many images, one too large or unreadable, or markers and images that do not match.
        """
        if len(images) > MAX_IMAGES:
            raise ImageError(f"A prompt may hold at most {MAX_IMAGES} images; this one has {len(images)}: send "
                             "fewer (a conversation's older images can go).")
        if text.count(self.marker) != len(images):
            raise ImageError(f"The chat template wrote {text.count(self.marker)} image place(s) for {len(images)} "
                             "image(s): it drops or repeats a message's content; give the images in user turns.")
        checked = [readable(i, data) for i, data in enumerate(images)]
        if sum(p for _, p in checked) > MAX_PROMPT_PIXELS:
            raise ImageError(f"The images of this prompt have more than {MAX_PROMPT_PIXELS / 1e6:.0f} million pixels "
                             "in all; send fewer or smaller ones.")
        mt = self._mt
        bitmaps: list[Any] = []
        chunks = mt.mtmd_input_chunks_init()
        try:
            bitmaps += [self._bitmap(i, data) for i, (data, _) in enumerate(checked)]
            raw = text.encode()
            inp = mt.mtmd_input_text(raw, len(raw), add_special, parse_special)
            array = (mt.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
            with self._lock, self._logging():
                rc = mt.mtmd_tokenize(self._ctx, chunks, ctypes.byref(inp), array, len(bitmaps))
                if rc != 0:
                    raise ImageError(f"The images could not be prepared for {self.path.name} (libmtmd code {rc}"
                                     f"{': ' + self._log.last_error() if self._log.last_error() else ''}).")
                return self._ids(chunks)
        finally:
            mt.mtmd_input_chunks_free(chunks)
            for b in bitmaps:
                mt.mtmd_bitmap_free(b)

    def _bitmap(self, i: int, data: bytes) -> Any:
        """Image ``i`` (checked by ``image_files.readable``) decoded by stb_image into a bitmap."""
        mt = self._mt
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        with self._logging():
            bitmap = mt.mtmd_helper_bitmap_init_from_buf(self._ctx, buf, len(data), False, None)
        if not bitmap:
            raise ImageError(f"Image {i + 1} could not be decoded (a corrupt or cut-short file); send the PNG or "
                             "JPEG file's bytes whole.")
        mt.mtmd_bitmap_set_id(bitmap, hashlib.sha256(data).hexdigest().encode())
        return bitmap

    def _ids(self, chunks: Any) -> ImageIds:
        """The ids of tokenized ``chunks``: text chunks' tokens, image chunks' placeholders (registered)."""
        mt = self._mt
        out = ImageIds()
        out.chunks = []
        tiles: collections.Counter[bytes] = collections.Counter()
        for c in range(mt.mtmd_input_chunks_size(chunks)):
            ptr = mt.mtmd_input_chunks_get(chunks, c)
            if mt.mtmd_input_chunk_get_type(ptr) == _TEXT_CHUNK:
                n = ctypes.c_size_t()
                toks = mt.mtmd_input_chunk_get_tokens_text(ptr, ctypes.byref(n))
                out.extend(toks[i] for i in range(n.value))
                continue
            digest = mt.mtmd_input_chunk_get_id(ptr) or b""
            key = hashlib.sha256(self._identity + digest + tiles[digest].to_bytes(4, "little")).digest()
            tiles[digest] += 1  # an image in tiles: one chunk per tile, each with ids of its own
            chunk = self._register(key, ptr)
            out.chunks.append(chunk)
            out.extend(chunk.ids.tolist())
        return out

    def _register(self, key: bytes, ptr: Any) -> _Chunk:
        """The chunk for ``key`` (a copy of ``ptr`` unless one is alive), newest of those held."""
        mt = self._mt
        chunk = self._live.get(key)
        if chunk is None:
            n_pos = int(mt.mtmd_input_chunk_get_n_pos(ptr))
            chunk = _Chunk(key, mt.mtmd_input_chunk_copy(ptr), self._new_ids(key, n_pos),
                           int(mt.mtmd_input_chunk_get_n_tokens(ptr)), mt.mtmd_input_chunk_free)
            self._live[key] = chunk
            ref = weakref.ref(chunk)
            for j, t in enumerate(chunk.ids.tolist()):
                self._where[t] = (ref, j)
        self._held[key] = chunk
        self._held.move_to_end(key)
        while len(self._held) > HELD_CHUNKS:
            self._held.popitem(last=False)  # freed once no prompt holds it either
        return chunk

    def _new_ids(self, key: bytes, n: int) -> np.ndarray:
        """``n`` placeholder ids drawn from ``key`` (the same image, the same ids, in any process), none another
        live chunk holds (the few that would are drawn again)."""
        for t in [t for t, (ref, _) in self._where.items() if ref() is None]:
            del self._where[t]  # the ids of chunks no prompt holds any more
        rng = np.random.default_rng(int.from_bytes(key[:16], "little"))
        ids = -rng.integers(*_ID_RANGE, size=n, dtype=np.int64).astype(np.int32)
        for j in range(n):
            while int(ids[j]) in self._where or int(ids[j]) in ids[:j]:
                ids[j] = -int(rng.integers(*_ID_RANGE))
        return ids

    # -- what reads ids ---------------------------------------------------------------

    def _find(self, token: int) -> Optional[tuple[_Chunk, int]]:
        with self._lock:
            where = self._where.get(token)
        chunk = where[0]() if where is not None else None
        return (chunk, where[1]) if chunk is not None and where is not None else None

    def accepts(self, ids: np.ndarray) -> bool:
        """Whether every negative id of ``ids`` is a placeholder of an image this projector holds."""
        return all(self._find(int(t)) is not None for t in ids[ids < 0])

    def offset(self, token: int) -> int:
        """Where in its image a placeholder id lies (0: the image's first position); 0 for any other id."""
        where = self._find(int(token))
        return where[1] if where is not None else 0

    def extra_cells(self, ids: np.ndarray) -> int:
        """The cells the images of ``ids`` take beyond their positions (under M-RoPE an image's embeddings
        outnumber its positions; 0 otherwise, and for an image no longer held)."""
        if not self.mrope:
            return 0
        found = (self._find(int(t)) for t in ids[ids < 0])
        return sum(chunk.n_tokens - len(chunk.ids) for chunk, j in filter(None, found) if j == 0)

    def chunks(self, run: np.ndarray) -> Iterator[_Chunk]:
        """The whole images a run of placeholder ids holds, in order.

        Raises:
            ImageError: the run starts or ends inside an image, or holds one no longer held.
        """
        at = 0
        while at < len(run):
            where = self._find(int(run[at]))
            if where is None:
                raise ImageError("An image of this prompt is no longer held by the projector; send the request "
                                 "again with its images.")
            chunk, j = where
            n = len(chunk.ids)
            if j != 0 or not np.array_equal(run[at:at + n], chunk.ids):
                raise ImageError("Part of an image cannot be read into the memory alone; an image is read whole.")
            yield chunk
            at += n

    def encode_later(self, chunk: _Chunk) -> concurrent.futures.Future[np.ndarray]:
        """``embedding(chunk)`` on the projector's own thread (its encoder has a context of its own: a model's
        decodes go on meanwhile)."""
        self._check_open()
        if self._encoder is None:
            self._encoder = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="localspec-image")
        return self._encoder.submit(self.embedding, chunk)

    def embedding(self, chunk: _Chunk) -> np.ndarray:
        """``chunk``'s embeddings, encoded now unless still kept."""
        with self._encoding:
            self._check_open()
            return self._encode(chunk)

    def _check_open(self) -> None:
        if not self._ctx:
            raise ImageError(f"The vision projector {self.path.name} was closed with its model; load it again.")

    def _encode(self, chunk: _Chunk) -> np.ndarray:
        if chunk.embd is not None:
            return chunk.embd
        with self._logging():
            rc = self._mt.mtmd_encode_chunk(self._ctx, chunk.ptr)
            if rc != 0:
                raise ImageError(f"{self.path.name} failed to encode an image (libmtmd code {rc}"
                                 f"{': ' + self._log.last_error() if self._log.last_error() else ''}).")
            out = self._mt.mtmd_get_output_embd(self._ctx)
            embd = np.ctypeslib.as_array(out, shape=(chunk.n_tokens * self.n_embd,))
            embd = embd.reshape(chunk.n_tokens, self.n_embd).copy()
        self.encodes += 1
        chunk.embd = embd
        with self._lock:  # the held chunks' embeddings within their budget, the oldest dropped first
            kept = sum(c.embd.nbytes for c in self._held.values() if c.embd is not None)
            for other in self._held.values():
                if kept <= HELD_EMBEDDING_BYTES:
                    break
                if other.embd is not None and other is not chunk:
                    kept -= other.embd.nbytes
                    other.embd = None
        return embd

    def decode_chunk(self, ctx: Any, chunk: _Chunk, embd: np.ndarray, n_past: int, seq: int, n_batch: int) -> int:
        """Decode ``chunk``'s embeddings into sequence ``seq`` of llama.cpp context ``ctx`` at ``n_past`` (llama.cpp's
        return code: 0 decoded, 1 no room). Positions, M-RoPE and non-causal attention are libmtmd's.

        Raises:
            ImageError: the image needs non-causal attention over more embeddings than one decode takes.
        """
        mt = self._mt
        self._check_open()
        if chunk.n_tokens > n_batch and mt.mtmd_decode_use_non_causal(self._ctx, chunk.ptr):
            raise ImageError(f"An image of {chunk.n_tokens} embeddings must be read in one batch, larger than the "
                             f"{n_batch} tokens this model reads at once; send a smaller image.")
        new_past = ctypes.c_int32(0)
        ptr = embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        with self._logging():
            return int(mt.mtmd_helper_decode_image_chunk(self._ctx, ctx, chunk.ptr, ptr, n_past, seq, n_batch,
                                                         ctypes.byref(new_past), mt.mtmd_helper_post_decode_callback(),
                                                         None))
