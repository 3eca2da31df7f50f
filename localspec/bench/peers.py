"""What a user would run instead: llama-cpp-python's high-level ``Llama``, as bench rows.

``PeerRunner`` loads the bench's target file into llama-cpp-python's own
``Llama`` with the same threads, context and GPU layers, once plain and once
per draft length with its built-in ``LlamaPromptLookupDecoding`` draft, and
generates with ``Llama.generate`` (the loop under ``create_completion``) so
its runs are timed like localspec's: prefill up to the first token, then
each token's step (the one that finds the end-of-generation token included).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Optional, Sequence

from ..events import GenerationStats
from ..runtime.model import Model

#: Bench method names of the peer rows.
PEER_PLAIN = "llama-cpp-python"
PEER_LOOKUP = "llama-cpp-python-lookup"
PEER_METHODS = (PEER_PLAIN, PEER_LOOKUP)


class PeerRunner:
    """llama-cpp-python's ``Llama`` on ``target``'s file and settings.

    Args:
        target: localspec's loaded target (its path, context, threads and GPU
            layers are copied; its cache is not touched).
    """

    def __init__(self, target: Model):
        from llama_cpp import Llama

        self._settings: dict[str, Any] = dict(n_ctx=target.n_ctx, n_threads=target.n_threads,
                                              n_threads_batch=target.n_threads_batch,
                                              n_gpu_layers=target.n_gpu_layers, flash_attn=bool(target.flash_attn),
                                              verbose=False)
        self.settings = {k: v for k, v in self._settings.items() if k != "verbose"}
        self._path = str(target.path)
        self.plain = Llama(self._path, **self._settings)
        self._lookups: dict[int, Any] = {}  # one Llama per draft length, loaded when first asked for
        self._is_eog = target.is_eog

    def close(self) -> None:
        for llama in (self.plain, *self._lookups.values()):
            llama.close()

    def _lookup(self, k: int) -> Any:
        """llama-cpp-python's ``Llama`` with its prompt-lookup draft of ``k`` tokens: one per K, so that the rows
        of two lengths can run side by side."""
        if k not in self._lookups:
            from llama_cpp import Llama
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            # A draft model makes Llama keep logits for every position, but it sizes that buffer from the
            # logits_all argument (n_batch rows otherwise), so past n_batch positions it fails unless asked
            # for explicitly (a buffer of the context's size, whose pages are touched only as used).
            self._lookups[k] = Llama(self._path, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=k),
                                     logits_all=True, **self._settings)
        return self._lookups[k]

    def generate(self, method: str, k: int, prompt: Sequence[int], temperature: float, seed: int,
                 max_tokens: int, top_p: float = 1.0,
                 grammar: Optional[str] = None) -> tuple[list[int], GenerationStats]:
        """One timed generation from an empty cache; returns the tokens (end token excluded) and stats.

        Args:
            grammar: GBNF text to decode under, with llama-cpp-python's own grammar sampler.
        """
        run = self.start(method, k, prompt, temperature, seed, max_tokens, top_p, grammar)
        while run.advance():
            pass
        return run.outcome()

    def start(self, method: str, k: int, prompt: Sequence[int], temperature: float, seed: int,
              max_tokens: int, top_p: float = 1.0, grammar: Optional[str] = None) -> PeerRun:
        """A generation from an empty cache, to be advanced a token at a time (see ``generate``)."""
        from llama_cpp.llama_grammar import LlamaGrammar

        llama = self.plain if method == PEER_PLAIN else self._lookup(k)
        parsed = LlamaGrammar.from_string(grammar, verbose=False) if grammar is not None else None
        llama.reset()  # an empty cache: the whole prompt is processed, as in localspec's rows
        llama.set_seed(seed)
        tokens = llama.generate(list(prompt), temp=temperature, top_k=0, top_p=top_p, min_p=0.0, typical_p=1.0,
                                repeat_penalty=1.0, reset=True, grammar=parsed)
        return PeerRun(tokens, GenerationStats(method=method, k=k, prompt_tokens=len(prompt)), max_tokens,
                       self._is_eog)


class PeerRun:
    """One of llama-cpp-python's generations under way, timed call by call as localspec's engine times its own:
    the prompt up to the first token, then each token's step (the one that finds the end token included), not
    the time between them, which another run may be using (the bench's lockstep mode)."""

    def __init__(self, tokens: Iterator[int], stats: GenerationStats, max_tokens: int,
                 is_eog: Callable[[int], bool]):
        self._next = tokens
        self.stats = stats
        self.tokens: list[int] = []
        self._max = max_tokens
        self._is_eog = is_eog
        self._started = False
        self._done = False

    def advance(self) -> bool:
        """Decide the next token (the first one: process the prompt too); False once the generation has ended."""
        if self._done:
            return False
        t0 = time.perf_counter()
        tok = next(self._next, None)
        seconds = time.perf_counter() - t0
        if self._started:
            self.stats.decode_seconds += seconds
        else:
            self.stats.prefill_seconds, self._started = seconds, True
        if tok is None or self._is_eog(int(tok)):
            self._done = True
        else:
            self.tokens.append(int(tok))
            self._done = len(self.tokens) >= self._max
        self.stats.generated_tokens = len(self.tokens)
        return not self._done

    def outcome(self) -> tuple[list[int], GenerationStats]:
        """The tokens (the end token excluded) and the stats, so far."""
        return self.tokens, self.stats

    def close(self) -> None:
        """End the generation here (llama-cpp-python's generator is left where it stopped)."""
        self._done = True
