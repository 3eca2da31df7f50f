"""The embedding model and the reranker a server loads beside its pair (``serve --embedding-model``,
``--rerank-model``), shared by the routes of every API that asks for vectors or scores.

They run on contexts of their own, off the event loop and outside the pair's worker: an embedding request
never waits for a generation's step, nor a generation for it. Each API's route checks its body, names the
model (``embedder_for``, ``reranker_for``) and answers in its own shape; the library's refusals (an empty
input, one too long, a bad ``dimensions``) become a 400 carrying the same sentence.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Optional, TypeVar

import numpy as np

from ..embeddings import Embedder, EmbeddingInput
from ..errors import BackendError, ContextOverflowError, LocalspecError
from .http import ApiError

T = TypeVar("T")


@dataclass(frozen=True)
class Vectors:
    """What an embedding or rerank request gets: a row per input (a reranker: a score per document), and the
    tokens they took."""

    rows: np.ndarray
    tokens: int


class EmbeddingService:
    """The embedding model and reranker beside the pair (either may be None).

    Args:
        embedder: the embedding model.
        reranker: the reranker.
    """

    def __init__(self, embedder: Optional[Embedder] = None, reranker: Optional[Embedder] = None):
        self.embedder, self.reranker = embedder, reranker
        # a thread each, of their own: a burst of embedding requests queues here, not in the event loop's
        # default pool, where every request's body is read
        self._threads = {id(m): ThreadPoolExecutor(1, thread_name_prefix=f"localspec-{m.name}")
                         for m in (embedder, reranker) if m is not None}

    @property
    def names(self) -> tuple[str, ...]:
        """Their names, as the model lists show them."""
        return tuple(e.name for e in (self.embedder, self.reranker) if e is not None)

    def embedder_for(self, name: Optional[str]) -> Embedder:
        """The embedding model a request names (None, or an Ollama-style ``:latest`` tag, names it too).

        Raises:
            ApiError: no embedding model was loaded (400), or ``name`` is another model (404).
        """
        return self._named(self.embedder, name, "embedding model", "--embedding-model")

    def reranker_for(self, name: Optional[str]) -> Embedder:
        """The reranker a request names; see ``embedder_for``."""
        return self._named(self.reranker, name, "reranker", "--rerank-model")

    @staticmethod
    def _named(model: Optional[Embedder], name: Optional[str], noun: str, flag: str) -> Embedder:
        if model is None:
            raise ApiError(400, f"This server has no {noun}; start it with {flag} NAME_OR_PATH to serve one.",
                           param="model", code="model_not_found")
        if name and name.removesuffix(":latest") != model.name:
            raise ApiError(404, f"The model {name!r} does not exist; this server's {noun} is {model.name!r}.",
                           param="model", code="model_not_found")
        return model

    async def embed(self, model: Embedder, inputs: EmbeddingInput, *, normalize: bool = True,
                    truncate: bool = False, dimensions: Optional[int] = None) -> Vectors:
        """``model.embed`` on the model's thread, its refusals as a 400."""
        def run() -> Vectors:
            seqs = model.tokens(inputs, truncate=truncate)
            rows = model.embed_tokens(seqs, normalize=normalize, dimensions=dimensions)
            return Vectors(rows, sum(len(s) for s in seqs))
        return await self._run(model, run, "input")

    async def rank(self, model: Embedder, query: str, documents: list[str]) -> Vectors:
        """``model.rank`` on the model's thread (pairs too long lose their document's end): a score per
        document, and the tokens the pairs took; its refusals as a 400."""
        def run() -> Vectors:
            pairs = model.pairs(query, documents)
            return Vectors(model.scores(pairs), sum(len(p) for p in pairs))
        return await self._run(model, run, "documents")

    async def _run(self, model: Embedder, fn: Callable[[], T], param: str) -> T:
        """``fn()`` on ``model``'s thread; the library's refusals as a 400, llama.cpp's failures as a 500."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._threads[id(model)], fn)
        except ContextOverflowError as exc:
            raise ApiError(400, str(exc), param=param, code="context_length_exceeded") from None
        except BackendError as exc:
            raise ApiError(500, str(exc), type="server_error") from None
        except LocalspecError as exc:
            raise ApiError(400, str(exc), param=param) from None

    def close(self) -> None:
        """Stop the models' threads (the models are their owner's to close)."""
        for pool in self._threads.values():
            pool.shutdown(wait=True)
