"""Embeddings and reranking: a vector per text from an embedding model, a relevance score per document from a
reranker, beside (not through) the speculative pair.

``load_embedding`` opens one GGUF in embedding mode; ``Embedder.embed`` turns texts (or token ids) into rows of
a numpy array, L2-normalised unless asked otherwise, several inputs per llama.cpp decode; ``Embedder.rank``
scores documents against a query with a reranker (llama.cpp's rank pooling). Bad input is refused in one
sentence before any work: no inputs, an empty one, one longer than the model reads (unless ``truncate``), a
``dimensions`` the model does not have.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from .catalog.hub import locate
from .catalog.naming import model_path, names_a_model
from .catalog.registry import load_embedding_registry
from .errors import ConfigError, ContextOverflowError, RegistryError
from .runtime.embedding import EmbeddingModel

#: What ``embed`` takes: a text, texts, token ids, or lists of them.
EmbeddingInput = Union[str, Sequence[str], Sequence[int], Sequence[Sequence[int]]]


def load_embedding(model: Union[str, os.PathLike], *, n_ctx: int = 0, n_threads: Optional[int] = None,
                   n_gpu_layers: Optional[int] = None, verbose: bool = False) -> Embedder:
    """Load an embedding model or a reranker.

    Args:
        model: a name from the catalog (``nomic-embed-text-v1.5``, downloaded by ``localspec pull``), a .gguf
            path, or a name of the model stores (``ollama:nomic-embed-text``, ``hf:ORG/REPO/FILE``).
        n_ctx: the longest input in tokens (0: what the model was trained for).
        n_threads: CPU threads (default: every core).
        n_gpu_layers: layers on the GPU (-1: all; default: all on a GPU build).
        verbose: llama.cpp's log on stderr.

    Returns:
        The ``Embedder``; ``close()`` it, or use it in a ``with`` block.

    Raises:
        ModelFileError: the file is missing, not a GGUF, cannot be loaded, or pools no vector per input.
        RegistryError: a name that is neither in the catalog nor a file, or one not downloaded yet.
    """
    path, name = _resolve(model)
    return Embedder(EmbeddingModel(path, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers,
                                   verbose=verbose), name)


def _resolve(model: Union[str, os.PathLike]) -> tuple[Path, str]:
    """The file ``model`` names, and the name the model goes by (a catalog name, a store's model name, else the
    file's name without ``.gguf``)."""
    text = os.fspath(model)
    if isinstance(model, str) and not names_a_model(text):
        known = load_embedding_registry()
        if text not in known:
            raise RegistryError(f"No embedding model named {text!r} in the catalog (known: {', '.join(sorted(known))}),"
                                " nor a file here; give a .gguf path or ollama:NAME.")
        path = locate(known[text].model)
        if path is None:
            raise RegistryError(f"The embedding model {text!r} is not downloaded; run `localspec pull {text}`.")
        return path, text
    path = model_path(model)
    if text.startswith("ollama:"):  # Ollama keeps its files by digest: the model's own name is the useful one
        return path, text.removeprefix("ollama:").removesuffix(":latest")
    return path, path.stem


class Embedder:
    """A loaded embedding model or reranker. Safe to call from several threads (one decode at a time).

    Attributes:
        name: what the model is called (its file's name without ``.gguf``).
        dim: the length of a vector.
        n_ctx: the longest input in tokens.
        pooling: how it pools a text's tokens: ``"mean"``, ``"cls"``, ``"last"``, or ``"rank"`` (a reranker).
    """

    def __init__(self, model: EmbeddingModel, name: str):
        self.model, self.name = model, name
        self.dim, self.n_ctx, self.pooling = model.dim, model.n_ctx, model.pooling
        self._lock = threading.Lock()

    @property
    def is_reranker(self) -> bool:
        """Whether it scores documents against a query (``rank``) rather than embedding texts."""
        return self.model.is_reranker

    def tokens(self, inputs: EmbeddingInput, *, truncate: bool = False) -> list[np.ndarray]:
        """The token ids of each input (texts tokenized as the model adds its special tokens), checked.

        Raises:
            ConfigError: no inputs, an empty one, or one of another type.
            TokenIdError: an id outside the vocabulary.
            ContextOverflowError: an input longer than ``n_ctx`` tokens, unless ``truncate`` (then cut to it).
        """
        items = _as_list(inputs)
        seqs = []
        for i, item in enumerate(items):
            if isinstance(item, str):
                if not item:
                    raise ConfigError(f"Input {i} is an empty string; give text to embed.")
                ids = np.array(self.model.tokenize(item, parse_special=False), dtype=np.int32)
                seqs.append(self._fit(ids, i, truncate, self.model.closes_input))
            else:
                ids = self.model.check_tokens(item)
                if not len(ids):
                    raise ConfigError(f"Input {i} is an empty list of token ids; give at least one.")
                seqs.append(self._fit(ids, i, truncate, False))
        return seqs

    def embed(self, inputs: EmbeddingInput, *, normalize: bool = True, truncate: bool = False,
              dimensions: Optional[int] = None) -> np.ndarray:
        """One vector per input, a row each, in order.

        Args:
            inputs: a text, a list of texts, token ids, or a list of lists of them.
            normalize: scale each vector to length 1 (cosine similarity is then a dot product).
            truncate: cut an input longer than the model reads to its first ``n_ctx`` tokens, instead of
                refusing it.
            dimensions: keep only the first this many numbers of each vector (then normalised, unless
                ``normalize`` is False), for models trained to allow it (Matryoshka embeddings such as
                nomic-embed-text-v1.5).

        Raises:
            ConfigError: a reranker, no inputs, an empty one, or ``dimensions`` out of 1..``dim``.
            ContextOverflowError: an input too long (and ``truncate`` not set).
        """
        return self.embed_tokens(self.tokens(inputs, truncate=truncate), normalize=normalize, dimensions=dimensions)

    def embed_tokens(self, seqs: Sequence[np.ndarray], *, normalize: bool = True,
                     dimensions: Optional[int] = None) -> np.ndarray:
        """``embed`` for inputs already made token ids by ``tokens``."""
        if self.is_reranker:
            raise ConfigError(f"{self.name} is a reranker: it scores documents against a query (rank), it gives "
                              "no embeddings; load an embedding model.")
        if dimensions is not None and not 1 <= dimensions <= self.dim:
            raise ConfigError(f"dimensions must be 1 to {self.dim} for {self.name}, got {dimensions}.")
        with self._lock:
            rows = self.model.vectors(seqs)
        if dimensions is not None:
            rows = rows[:, :dimensions]
        if normalize:
            norms = np.linalg.norm(rows, axis=1, keepdims=True)
            rows = rows / np.maximum(norms, 1e-12)
        return rows

    def rank(self, query: str, documents: Sequence[str], *, truncate: bool = True) -> np.ndarray:
        """The reranker's relevance score of each document for ``query`` (higher: more relevant), in order.

        Args:
            query: what is searched for.
            documents: the texts to score.
            truncate: a query and document longer than the model reads lose the document's end (False refuses
                them).

        Raises:
            ConfigError: not a reranker, no documents, or an empty query or document.
            ContextOverflowError: a pair too long (``truncate`` False), or a query that alone leaves no room.
        """
        return self.scores(self.pairs(query, documents, truncate=truncate))

    def pairs(self, query: str, documents: Sequence[str], *, truncate: bool = True) -> list[np.ndarray]:
        """The token ids of each query and document as the reranker reads them, checked (see ``rank``)."""
        if not self.is_reranker:
            raise ConfigError(f"{self.name} is an embedding model, not a reranker; load a reranker (rank pooling) "
                              "to score documents.")
        if not isinstance(query, str) or not query:
            raise ConfigError("The query must be a non-empty string.")
        if isinstance(documents, str) or not isinstance(documents, (list, tuple)) or not documents:
            raise ConfigError("Give the documents to score as a non-empty list of strings.")
        pairs = []
        for i, doc in enumerate(documents):
            if not isinstance(doc, str) or not doc:
                raise ConfigError(f"Document {i} must be a non-empty string.")
            ids = self.model.pair_tokens(query, doc, self.n_ctx if truncate else None)
            pairs.append(self._fit(ids, i, False, False, f"Document {i} with the query"))
        return pairs

    def scores(self, pairs: Sequence[np.ndarray]) -> np.ndarray:
        """``rank`` for pairs already made token ids by ``pairs``: the first score of each."""
        with self._lock:
            return self.model.vectors(pairs)[:, 0].copy()

    def _fit(self, ids: np.ndarray, i: int, truncate: bool, closed: bool, what: str = "") -> np.ndarray:
        """``ids`` if they fit, else cut to ``n_ctx`` (keeping a closing special token, ``closed``) where
        ``truncate`` asks, else refused."""
        if len(ids) <= self.n_ctx:
            return ids
        if truncate:
            return np.concatenate([ids[: self.n_ctx - 1], ids[-1:]]) if closed else ids[: self.n_ctx]
        raise ContextOverflowError(f"{what or f'Input {i}'} is {len(ids)} tokens, more than the {self.n_ctx} "
                                   f"{self.name} reads; shorten it, or ask for truncation.")

    def close(self) -> None:
        """Free the model."""
        self.model.close()

    def __enter__(self) -> Embedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _as_list(inputs: object) -> list:
    """``inputs`` as a list of inputs: a text or a flat list of ids is one input."""
    if isinstance(inputs, str):
        return [inputs]
    if isinstance(inputs, np.ndarray):
        inputs = inputs.tolist()
    if not isinstance(inputs, (list, tuple)):
        raise ConfigError(f"Give a text, a list of texts, token ids or lists of them, not {type(inputs).__name__}.")
    if not inputs:
        raise ConfigError("The input list is empty; give at least one text.")
    if all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in inputs):
        return [list(inputs)]  # one input of token ids
    bad = next((x for x in inputs if not isinstance(x, (str, list, tuple, np.ndarray))), None)
    if bad is not None:
        raise ConfigError(f"Each input must be a text or a list of token ids, not {type(bad).__name__}.")
    return list(inputs)
