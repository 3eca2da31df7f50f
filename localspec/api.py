"""The Python API: load a target (and optionally a draft) and generate.

Layers, each built on the one before: ``engine.generate_events`` (token
events over token ids) -> ``Pair.stream`` (text prompt, options checked,
events with text) -> ``Pair.generate`` (a finished ``Result``) -> the CLI.

Example:
    >>> import localspec
    >>> pair = localspec.load(target="t.gguf", draft="d.gguf")
    >>> r = pair.generate("def fib(n):", max_tokens=64, method="draft", k=4)
    >>> r.text, r.finish_reason, r.stats.acceptance_rate
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional, Sequence, Union

import numpy as np

from .acceptance import SamplingParams
from .auto import KMAX, CostProfile, auto_drafter, calibrate
from .backend import Model, read_vocab
from .compat import check_vocab
from .drafters import Drafter, ModelDrafter, PromptLookupDrafter
from .engine import Generation, GenerationStats, TokenEvent, check_prompt, generate_events
from .errors import ConfigError

PathLike = Union[str, os.PathLike]
METHODS = ("auto", "plain", "draft", "lookup")
#: Draft length used when ``k`` is not given (for auto: the longest it considers).
DEFAULT_K = {"auto": KMAX, "plain": 0, "draft": 4, "lookup": 8}


@dataclass
class Result:
    """A finished generation.

    Attributes:
        text: the generated text (end-of-generation token not included).
        tokens: the generated token ids.
        finish_reason: "stop" (the model ended its answer), "length"
            (max_tokens reached or the context is full) or "interrupted".
        stats: counts and timings.
        prompt_tokens: the prompt's token ids.
    """

    text: str
    tokens: list[int]
    finish_reason: Optional[str]
    stats: GenerationStats
    prompt_tokens: list[int]

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape printed by ``localspec generate --json``."""
        return {"text": self.text, "tokens": self.tokens, "finish_reason": self.finish_reason,
                "stats": self.stats.to_dict()}


class Stream:
    """Iterator over ``TokenEvent``s of one generation; ``result`` once it is done.

    Leaving the loop early (``break``, an exception, Ctrl-C) stops the
    generation and leaves both models' caches consistent.
    """

    def __init__(self, generation: Generation, prompt_tokens: list[int]):
        self._g = generation
        self._prompt_tokens = prompt_tokens
        self._text: list[str] = []

    def __iter__(self) -> Iterator[TokenEvent]:
        try:
            for ev in self._g:
                self._text.append(ev.text)
                yield ev
        finally:
            self._g.close()
            self._text.append(self._g.tail_text)  # an incomplete final character, if any

    @property
    def result(self) -> Result:
        """The generation so far (final once iteration has ended)."""
        return Result("".join(self._text), list(self._g.tokens), self._g.finish_reason,
                      self._g.stats, self._prompt_tokens)


class Pair:
    """A target model and an optional draft model, ready to generate.

    Use ``load`` to create one. Each method call generates once; the models'
    caches keep the longest shared prefix between calls, so a follow-up on
    the same text (a chat turn) only processes what is new.
    """

    def __init__(self, target: Model, draft: Optional[Model] = None):
        self.target = target
        self.draft = draft
        self._profile: Optional[CostProfile] = None

    def calibrate(self, refresh: bool = False) -> CostProfile:
        """The machine's cost profile for auto mode (cached on disk; measured on first use).

        Args:
            refresh: measure again instead of reusing the cached profile.
        """
        if self._profile is None or refresh:
            self._profile = calibrate(self.target, self.draft, KMAX, refresh=refresh)
        return self._profile

    def set_profile(self, profile: Optional[CostProfile]) -> None:
        """Use this cost profile for auto mode instead of measuring (e.g. to simulate a GPU).

        None forgets it: the next auto generation uses the calibration again.
        """
        self._profile = profile

    def close(self) -> None:
        """Free both models."""
        self.target.close()
        if self.draft is not None:
            self.draft.close()

    def __enter__(self) -> Pair:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- text ------------------------------------------------------------------

    def tokenize(self, text: str) -> list[int]:
        """Raw text to target token ids (BOS added if the model wants it, special tokens parsed)."""
        return self.target.tokenize(text)

    def format_chat(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
        """Render chat messages with the chat template stored in the target GGUF.

        Raises:
            ConfigError: the GGUF has no chat template, or the template rejects the messages.
        """
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        template = self.target.chat_template()
        if not template:
            raise ConfigError(
                f"{self.target.path.name} has no chat template in its metadata; "
                "use a raw prompt (--prompt) instead of chat messages."
            )
        formatter = Jinja2ChatFormatter(
            template=template,
            eos_token=self.target.special_text(self.target.eos),
            bos_token=self.target.special_text(self.target.bos),
            add_generation_prompt=add_generation_prompt,
        )
        try:
            return formatter(messages=[dict(m) for m in messages]).prompt  # type: ignore[misc]
        except Exception as exc:  # jinja2 errors and the template's own raise_exception
            raise ConfigError(f"The chat template of {self.target.path.name} rejected the messages: {exc}") from exc

    def chat_tokens(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """Chat messages to prompt token ids (the template writes any BOS itself)."""
        return self.target.tokenize(self.format_chat(messages), add_special=False)

    # -- generation ----------------------------------------------------------

    def stream(self, prompt: Union[str, Sequence[int]], **options: Any) -> Stream:
        """Generate after a raw prompt, yielding TokenEvents as they are decided.

        Args:
            prompt: raw text (tokenized with BOS if the model wants it) or token ids.
            **options: see ``generate``.
        """
        if isinstance(prompt, str):
            return self._start(self.tokenize(prompt), prompt, **options)
        tokens = [int(t) for t in prompt]
        return self._start(tokens, None, **options)

    def generate(self, prompt: Union[str, Sequence[int]], **options: Any) -> Result:
        """Generate after a raw prompt and return the finished result.

        Args:
            prompt: raw text or token ids.
            max_tokens: most tokens to generate (default 256).
            temperature: 0 for greedy decoding (default), otherwise sampling.
            top_k, top_p, min_p: sampling filters (defaults 0, 1.0, 0.0: off).
            seed: seed for sampling (default: random).
            method: "auto" (default: picks lookup, the draft model or plain
                decoding and K each round from measured costs), "draft"
                (needs a draft model), "lookup" or "plain".
            k: tokens drafted per round (defaults: draft 4, lookup 8; for auto
                the most it may draft, 8).
            ngram: (min, max) n-gram lengths for lookup (default (1, 3)).

        Returns:
            the Result: text, tokens, finish_reason, stats.
        """
        s = self.stream(prompt, **options)
        for _ in s:
            pass
        return s.result

    def chat(self, messages: Sequence[Mapping[str, str]], **options: Any) -> Result:
        """Generate the assistant's reply to chat ``messages`` (dicts with role and content)."""
        s = self.stream_chat(messages, **options)
        for _ in s:
            pass
        return s.result

    def stream_chat(self, messages: Sequence[Mapping[str, str]], **options: Any) -> Stream:
        """Like ``chat``, yielding TokenEvents."""
        text = self.format_chat(messages)
        return self._start(self.target.tokenize(text, add_special=False), text, **options)

    def _start(
        self,
        prompt_tokens: list[int],
        prompt_text: Optional[str],
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        seed: Optional[int] = None,
        method: Optional[str] = None,
        k: Optional[int] = None,
        ngram: tuple[int, int] = (1, 3),
    ) -> Stream:
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
        check_prompt(self.target, len(prompt_tokens))  # before any work, calibration included
        drafter, k = self.drafter(method, k, params, ngram, prompt_text, prompt_tokens)
        g = generate_events(self.target, prompt_tokens, drafter=drafter, k=k, params=params,
                            max_tokens=max_tokens, rng=np.random.default_rng(seed))
        return Stream(g, prompt_tokens)

    def drafter(
        self,
        method: Optional[str],
        k: Optional[int],
        params: SamplingParams,
        ngram: tuple[int, int] = (1, 3),
        prompt_text: Optional[str] = None,
        prompt_tokens: Sequence[int] = (),
    ) -> tuple[Optional[Drafter], int]:
        """The drafter and draft length for a method name (None means auto).

        Auto calibrates on first use and reads the prompt to set its priors.
        """
        if method is None:
            method = "auto"
        if method not in METHODS:
            raise ConfigError(f"Unknown method {method!r}; choose one of {', '.join(METHODS)}.")
        if k is None:
            k = DEFAULT_K[method]
        if isinstance(k, bool) or not isinstance(k, int) or k < 0 or k > 64:
            raise ConfigError(f"The draft length k must be a whole number from 0 to 64, got {k!r}.")
        if method == "plain":
            return None, 0
        if method == "auto":
            if k == 0:
                return None, 0
            text = prompt_text if prompt_text is not None else self.target.detokenize(prompt_tokens)
            drafter = auto_drafter(self.calibrate(), self.draft, params, text,
                                   np.asarray(prompt_tokens, dtype=np.int32), k)
            return drafter, k
        if method == "draft":
            if self.draft is None:
                raise ConfigError("Method 'draft' needs a draft model; load one (--draft) or use 'lookup'.")
            return ModelDrafter(self.draft, params), k
        lo, hi = ngram
        if not 1 <= lo <= hi:
            raise ConfigError(f"Lookup n-gram range must satisfy 1 <= min <= max, got {ngram}.")
        return PromptLookupDrafter(max_ngram=hi, min_ngram=lo), k


def load(
    target: PathLike,
    draft: Optional[PathLike] = None,
    *,
    n_ctx: int = 4096,
    n_threads: Optional[int] = None,
    n_gpu_layers: Optional[int] = None,
    verbose: bool = False,
) -> Pair:
    """Load a target model and, optionally, a draft model of the same family.

    Args:
        target: the target .gguf.
        draft: the draft .gguf (same vocabulary); None for lookup/plain only.
        n_ctx: context length for both models (0: the target's training context).
        n_threads: CPU threads for both (default: all available cores).
        n_gpu_layers: layers to offload for both; -1 all (default on GPU builds), 0 none.
        verbose: show llama.cpp's log.

    Raises:
        ModelFileError: a file is missing, not a GGUF, or fails to load.
        VocabMismatchError: the draft's vocabulary differs from the target's.
    """
    t = Model(target, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers, verbose=verbose)
    d = None
    if draft is not None:
        try:
            check_vocab(t.vocab_info(), read_vocab(draft))  # before the draft's weights are loaded
            d = Model(draft, n_ctx=t.n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers, verbose=verbose)
        except BaseException:
            t.close()
            if d is not None:
                d.close()
            raise
    return Pair(t, d)
