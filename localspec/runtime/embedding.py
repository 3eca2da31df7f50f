"""One loaded embedding or reranking GGUF: token sequences in, one pooled vector (or score) per sequence out.

An embedding model (nomic-bert, bert, a decoder with last-token pooling such as Qwen3-Embedding) and a reranker
(rank pooling: one relevance score per query and document) run on a context of their own, in embedding mode.
Several inputs go into one llama.cpp decode, each under its own sequence id, as many as fit ``n_batch``
tokens; every input must fit one decode whole (a non-causal model attends over the whole sequence at once).
What the inputs mean (texts, normalisation, a reranker's query and document) is the API's business.
"""

from __future__ import annotations

import ctypes
import os
import time
from typing import Any, Optional, Sequence, Union

import llama_cpp as ll
import numpy as np

from ..errors import BackendError, ContextOverflowError, ModelFileError
from .gguf_metadata import check_gguf
from .process import LlamaLog, default_threads, gpu_offload_supported, load_weights
from .vocabulary import ModelVocabulary

#: The most inputs one decode holds (each its own sequence id).
MAX_INPUTS = 64

#: The longest input by default, in tokens, for a model trained on longer ones: every input is read whole in
#: one pass, whose scratch memory grows with its square (set ``n_ctx`` for more).
DEFAULT_MAX_CTX = 8192

#: On the CPU, inputs up to this many tokens are read without flash attention, exactly as llama-cpp-python
#: reads them by default; longer ones with it, which keeps the pass's memory linear in the input.
EXACT_CTX = 2048

#: llama.cpp's pooling types, by the name the docs and the API use.
POOLING = {ll.LLAMA_POOLING_TYPE_NONE: "none", ll.LLAMA_POOLING_TYPE_MEAN: "mean",
           ll.LLAMA_POOLING_TYPE_CLS: "cls", ll.LLAMA_POOLING_TYPE_LAST: "last",
           ll.LLAMA_POOLING_TYPE_RANK: "rank"}


class EmbeddingModel(ModelVocabulary):
    """A GGUF loaded for embeddings (or reranking scores), with its pooling read from the file.

    Args:
        path: the .gguf file.
        n_ctx: the longest input in tokens (0: the model's training context, at most ``DEFAULT_MAX_CTX``).
        n_threads: CPU threads (default: all available cores).
        n_gpu_layers: layers to offload; -1 for all. Default: all on a GPU build, none on a CPU-only build.
        verbose: let llama.cpp print its log to stderr.

    Raises:
        ModelFileError: the file is missing, not a GGUF, cannot be loaded, or pools nothing (one vector per
            token, which localspec does not hand out).
        BackendError: the context cannot be created.
    """

    def __init__(self, path: Union[str, os.PathLike], *, n_ctx: int = 0, n_threads: Optional[int] = None,
                 n_gpu_layers: Optional[int] = None, verbose: bool = False):
        self.path = check_gguf(path)
        self._log = LlamaLog(verbose)
        self._model: Optional[ll.llama_model_p] = None
        self._ctx: Optional[ll.llama_context_p] = None
        self._batch: Optional[ll.llama_batch] = None
        if n_gpu_layers is None:
            n_gpu_layers = -1 if gpu_offload_supported() else 0
        self._gpu_layers = n_gpu_layers
        self._model = load_weights(self.path, n_gpu_layers, self._log)
        self._init_vocabulary()
        try:
            self._open(n_ctx, n_threads or default_threads())
        except BaseException:
            self.close()
            raise

    def _open(self, n_ctx: int, n_threads: int) -> None:
        """The embedding context: every input whole in one decode (``n_ubatch`` = ``n_batch`` = ``n_ctx``)."""
        train = int(ll.llama_model_n_ctx_train(self._model))
        n_ctx = min(n_ctx or min(train, DEFAULT_MAX_CTX), train) if train else n_ctx or 2048
        cparams = ll.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = cparams.n_ubatch = n_ctx
        cparams.n_seq_max = MAX_INPUTS
        cparams.kv_unified = True  # a decoder's inputs share its cells, as they share the batch
        cparams.embeddings = True
        cparams.pooling_type = ll.LLAMA_POOLING_TYPE_UNSPECIFIED  # the model's own
        cparams.n_threads = cparams.n_threads_batch = n_threads
        if not (self._gpu_layers != 0 and gpu_offload_supported()) and n_ctx <= EXACT_CTX:
            cparams.flash_attn_type = 0  # its f16 rounding would cost exactness for little at these lengths
        with self._log:
            self._ctx = ll.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            raise BackendError(f"llama.cpp could not create a {n_ctx}-token embedding context for "
                               f"{self.path.name}; try a smaller context length.")
        pooling = int(ll.llama_pooling_type(self._ctx))
        if pooling not in POOLING or pooling == ll.LLAMA_POOLING_TYPE_NONE:
            raise ModelFileError(f"{self.path.name} pools no vector per input (its pooling type is {pooling}); "
                                 "give an embedding model (mean, CLS or last-token pooling) or a reranker.")
        #: How the model pools a sequence's tokens: "mean", "cls", "last", or "rank" for a reranker.
        self.pooling = POOLING[pooling]
        #: The longest input in tokens (llama.cpp may round its context up; positions stop at the model's).
        self.n_ctx = n_ctx
        #: The length of a vector (a reranker's: its scores per input, usually 1).
        self.dim = int(ll.llama_model_n_cls_out(self._model)) if self.pooling == "rank" \
            else int(ll.llama_model_n_embd_out(self._model))
        self._mem = ll.llama_get_memory(self._ctx)  # None for an encoder (bert): nothing to clear
        self._batch = ll.llama_batch_init(int(ll.llama_n_ctx(self._ctx)), 0, 1)
        #: Seconds spent in llama.cpp's decodes.
        self.busy_seconds = 0.0

    @property
    def closes_input(self) -> bool:
        """Whether the vocabulary ends a text with a special token (BERT's [SEP], an EOS): a text cut to fit
        keeps it."""
        vocab = self.vocab_pointer
        return bool(ll.llama_vocab_get_add_eos(vocab) or ll.llama_vocab_get_add_sep(vocab))

    @property
    def is_reranker(self) -> bool:
        """Whether the model scores a query and a document (rank pooling) rather than embedding a text."""
        return self.pooling == "rank"

    def vectors(self, inputs: Sequence[np.ndarray]) -> np.ndarray:
        """One pooled vector per token sequence (rows in the order given), as llama.cpp gives it (not
        normalised). Each sequence holds 1 to ``n_ctx`` token ids of this model (the caller checks).

        Raises:
            BackendError: llama.cpp failed to decode.
        """
        out = np.zeros((len(inputs), self.dim), dtype=np.float32)
        group: list[int] = []
        used = 0
        for i, tokens in enumerate(inputs):
            if group and (used + len(tokens) > self.n_ctx or len(group) == MAX_INPUTS):
                self._decode(inputs, group, out)  # the batch is full: decode what it holds
                group, used = [], 0
            group.append(i)
            used += len(tokens)
        if group:
            self._decode(inputs, group, out)
        return out

    def _decode(self, inputs: Sequence[np.ndarray], group: list[int], out: np.ndarray) -> None:
        """One decode of the inputs ``group`` names, each its own sequence; their rows of ``out`` filled."""
        batch: Any = self._batch  # ctypes arrays, written element by element
        assert batch is not None and self._ctx is not None
        n = 0
        for seq, i in enumerate(group):
            for pos, token in enumerate(inputs[i]):
                batch.token[n], batch.pos[n], batch.n_seq_id[n] = int(token), pos, 1
                batch.seq_id[n][0], batch.logits[n] = seq, True  # every token an output: pooling reads them all
                n += 1
        batch.n_tokens = n
        t0 = time.perf_counter()
        with self._log:
            if self._mem:  # a decoder keeps its inputs' cells: the last group's go first
                ll.llama_memory_clear(self._mem, True)
            rc = int(ll.llama_decode(self._ctx, batch))
        self.busy_seconds += time.perf_counter() - t0
        if rc != 0:
            raise BackendError(f"llama.cpp failed to embed {len(group)} input(s) with {self.path.name} "
                               f"(code {rc}).")
        for seq, i in enumerate(group):
            row = ll.llama_get_embeddings_seq(self._ctx, seq)
            if not row:
                raise BackendError(f"llama.cpp gave no pooled vector for input {i} with {self.path.name}.")
            out[i] = np.ctypeslib.as_array(ctypes.cast(row, ctypes.POINTER(ctypes.c_float)), shape=(self.dim,))

    def pair_tokens(self, query: str, doc: str, limit: Optional[int] = None) -> np.ndarray:
        """A query and a document as the reranker reads them: its own template where the GGUF has one, else
        the query and the document between the special tokens its vocabulary adds (as llama.cpp's server).
        With ``limit``, a pair longer than that many tokens keeps its query and closing tokens and loses the
        document's end.

        Raises:
            ContextOverflowError: the query and the pair's fixed tokens alone exceed ``limit``.
        """
        head, tail = self._pair_parts(query)
        if isinstance(head, str) and isinstance(tail, str):  # a template's text, read whole as llama.cpp's server
            whole = self.tokenize(head + doc + tail, add_special=False, parse_special=True)
            if limit is None or len(whole) <= limit:
                return np.array(whole, dtype=np.int32)
            fixed = (self.tokenize(head, add_special=False, parse_special=True),
                     self.tokenize(tail, add_special=False, parse_special=True))
            body = self.tokenize(doc, add_special=False, parse_special=False)
        else:
            assert not isinstance(head, str) and not isinstance(tail, str)
            fixed = (head, tail)
            body = self.tokenize(doc, add_special=False, parse_special=False)
            if limit is None or len(head) + len(body) + len(tail) <= limit:
                return np.array(head + body + tail, dtype=np.int32)
        room = limit - len(fixed[0]) - len(fixed[1])
        if room < 1:
            raise ContextOverflowError(f"The query is {len(fixed[0]) + len(fixed[1])} tokens with the reranker's own, "
                                       f"leaving no room for a document in the {limit} {self.path.name} reads; "
                                       "shorten the query.")
        return np.array(fixed[0] + body[:room] + fixed[1], dtype=np.int32)

    def _pair_parts(self, query: str) -> tuple[Union[str, list[int]], Union[str, list[int]]]:
        """What comes before the document and after it: text of the GGUF's rerank template (the query put in),
        or token ids (BOS, the query, EOS, SEP as the vocabulary adds them; EOS after the document)."""
        template = ll.llama_model_chat_template(self._model, b"rerank")
        if template:
            text = template.decode("utf-8", "replace")
            before, _, after = text.partition("{document}")
            return before.replace("{query}", query), after.replace("{query}", query)
        vocab = self.vocab_pointer
        eos = int(ll.llama_vocab_eos(vocab))
        eos = eos if eos >= 0 else int(ll.llama_vocab_sep(vocab))
        head: list[int] = [int(ll.llama_vocab_bos(vocab))] if ll.llama_vocab_get_add_bos(vocab) else []
        head += self.tokenize(query, add_special=False, parse_special=False)
        if ll.llama_vocab_get_add_eos(vocab):
            head.append(eos)
        if ll.llama_vocab_get_add_sep(vocab):
            head.append(int(ll.llama_vocab_sep(vocab)))
        return head, [eos] if ll.llama_vocab_get_add_eos(vocab) else []

    def close(self) -> None:
        """Free the context and the model; the object cannot be used afterwards."""
        if self._batch is not None:
            ll.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            ll.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            ll.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> EmbeddingModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
