"""``Model``'s evaluation of prompts that hold images' placeholder ids (see ``runtime.vision``).

A target with a projector decodes each image's placeholders as the image's embeddings, in a decode of its own
on the thread that runs the model's calls (between a step loop's joint steps, where sequences decode together);
a model without one (the draft model beside such a target) reads its ``stand_in`` token in their place, so
that its positions keep matching the target's. The record (``tokens``) holds the placeholders either way.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from ..errors import BackendError, ConfigError, ContextOverflowError, GenerationCancelled
from . import memory

if TYPE_CHECKING:  # defined by ``Model``
    from pathlib import Path

    from .vision import Projector


class ImageRuns:
    """Mixin of ``Model``: images' placeholders in ``eval``, and cuts that never land inside an image."""

    #: The projector that decodes images into this model's memory (None: this model sees no images).
    projector: Optional[Projector] = None
    #: For a model without a projector beside one that has it: the token read where an image lies.
    stand_in: Optional[int] = None

    if TYPE_CHECKING:
        path: Path
        n_ctx: int
        n_seq: int
        seq: int
        n_vocab: int
        n_batch: int
        _n: int
        _tokens: np.ndarray
        _dirty: bool
        _inflight: Optional[np.ndarray]
        _ctx: Any
        _ext: Optional[Any]
        _batcher: Any
        hidden: np.ndarray
        memory: memory.MemoryInfo
        writes: int
        decode_calls: int
        busy_seconds: float

        def _eval_chunks(self, arr: np.ndarray, logits: Any, abort: Optional[threading.Event]
                         ) -> Optional[np.ndarray]: ...

        def _llama(self, fn: Any, *args: Any) -> Any: ...

        def _repair(self, failed: bool = False) -> None: ...

        def _after_decode(self, m: int) -> None: ...

    @property
    def sees_images(self) -> bool:
        """Whether ids of images may reach this model (it has a projector, or reads a stand-in for them)."""
        return self.projector is not None or self.stand_in is not None

    def accepts_images(self, ids: np.ndarray) -> bool:
        """Whether the negative ids in ``ids`` are placeholders this model can read."""
        if self.projector is not None:
            return self.projector.accepts(ids)
        return self.stand_in is not None

    @property
    def cells(self) -> int:
        """The cells this sequence holds: one a position, and an image's extra embeddings under M-RoPE."""
        return self.prompt_cells(self._tokens[: self._n])

    def prompt_cells(self, prompt: Any) -> int:
        """The cells reading ``prompt`` (ids) takes, as ``cells`` counts them."""
        projector = self.projector
        if projector is None or not projector.mrope:
            return len(prompt)
        return len(prompt) + projector.extra_cells(np.asarray(prompt, dtype=np.int64))

    def image_start(self, tokens: np.ndarray, n: int) -> int:
        """``n``, or where the image starts that position ``n`` of ``tokens`` lies inside: a cut is never made
        inside an image (its positions are read whole)."""
        if self.projector is None or n <= 0 or n >= len(tokens) or tokens[n] >= 0:
            return n
        return n - self.projector.offset(int(tokens[n]))

    def _eval_images(self, arr: np.ndarray, logits: Any, abort: Optional[threading.Event]) -> Optional[np.ndarray]:
        """``eval`` of ids that hold placeholders: runs of text and runs of images, in order."""
        bounds = np.flatnonzero(np.diff((arr < 0).astype(np.int8))) + 1
        rows: list[np.ndarray] = []
        out: Optional[np.ndarray] = None
        runs = np.split(arr, bounds)
        for i, run in enumerate(runs):
            last = i == len(runs) - 1
            if run[0] >= 0:
                out = self._eval_chunks(run, logits if last or logits == "all" else "none", abort)
            elif self.projector is None:  # a draft model: the stand-in token at each position, the record as given
                start = self._n
                out = self._eval_chunks(np.full(len(run), self.stand_in, dtype=np.int32),
                                        logits if last or logits == "all" else "none", abort)
                self._tokens[start:start + len(run)] = run
            else:
                if last and logits == "last":
                    raise ConfigError("A prompt cannot end with an image: the model answers after text "
                                      "(a chat template adds the reply's opening).")
                self._decode_images(run, abort)
                out = np.zeros((len(run), self.n_vocab), dtype=np.float32) if logits == "all" else None
            if logits == "all" and out is not None:
                rows.append(np.array(out) if not last else out)
        if logits == "all":
            return np.concatenate(rows) if rows else None
        return out

    def _decode_images(self, run: np.ndarray, abort: Optional[threading.Event]) -> None:
        """Decode the whole images of ``run`` (placeholders) at the next positions, each encoded (unless its
        embeddings are kept) just before its decode call, ``abort`` looked at before each."""
        projector = self.projector
        assert projector is not None
        for chunk in projector.chunks(run):
            if abort is not None and abort.is_set():
                raise GenerationCancelled(f"Cancelled before an image at position {self._n} of {self.path.name}.")
            n = len(chunk.ids)
            if self.cells + chunk.n_tokens > self.n_ctx:
                raise ContextOverflowError(
                    f"An image of {chunk.n_tokens} embeddings does not fit after the {self.cells} cells held in the "
                    f"{self.n_ctx}-token context of {self.path.name}; shorten the input or raise the context length.")
            embd = self._encoded(chunk)
            t0 = time.perf_counter()
            rc = self._decode_image(chunk, embd)
            if rc == 1 and self._batcher is not None and self._batcher.room is not None and self._batcher.room(self):
                self._repair(failed=True)  # the image's batches that did fit go before it is decoded again
                rc = self._decode_image(chunk, embd)  # an idle sequence gave its cells: once more
            if rc != 0:
                self._repair(failed=True)
                if rc == 1:
                    raise ContextOverflowError(
                        f"The {self.n_ctx}-token context of {self.path.name} has no room for an image of {n} "
                        "positions beside the other requests; shorten the input or raise the context length.")
                raise BackendError(f"llama.cpp failed to decode an image into {self.path.name} (code {rc}).")
            self._tokens[self._n:self._n + n] = chunk.ids
            if self._ext is not None:  # an MTP head reads no hidden state at an image's positions
                self.hidden[self._n:self._n + n] = 0.0
            self._n += n
            self.writes += 1
            self._dirty = False
            if self.memory.kind != memory.FULL:
                self._after_decode(n)
            self.busy_seconds += time.perf_counter() - t0
            self.decode_calls += 1

    def _encoded(self, chunk: Any) -> np.ndarray:
        """``chunk``'s embeddings. Encoding one takes a while (a second or more on a CPU): in a step loop, the
        projector's own thread encodes it while this generation pauses and the others go on stepping."""
        projector, batcher, kept = self.projector, self._batcher, chunk.embd
        assert projector is not None
        if kept is not None:  # encoded for an earlier prompt: no wait for the encoder
            return kept
        if batcher is None or not batcher.inside():
            return projector.embedding(chunk)
        future = projector.encode_later(chunk)
        batcher.pause(future.done, future)  # the loop steps the others, or waits for it where none can step
        return future.result()

    def _decode_image(self, chunk: Any, embd: np.ndarray) -> int:
        """One image chunk's embeddings decoded at the next positions: llama.cpp's code (0: done, 1: no room)."""
        assert self.projector is not None
        self._inflight, self._dirty = None, True  # a failure leaves nothing of the image (see ``_repair``)
        return int(self._llama(self.projector.decode_chunk, self._ctx, chunk, embd, self._n, self.seq, self.n_batch))
