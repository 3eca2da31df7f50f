"""Assembling a pair's generations: the drafter a call's options ask for, its grammar state, the target's MTP head."""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ..constraint import Constraint
from ..errors import ConfigError
from ..methods import get_method
from ..options import GenerationOptions
from ..runtime.model import Model
from ..structured.grammar import GrammarState, Matcher, TriggeredMatcher, tokenizer_for

# Imported for what importing it does: auto's module (with the drafters', history's and the candidates'
# it imports) attaches each built-in method's builder to the registry, where ``drafter`` finds them.
from . import auto  # noqa: F401
from .costs import CostCorrection, CostProfile
from .drafters import Drafter, DraftingContext
from .history import HistoryStore
from .mtp_head import MtpHead


class Assembly:
    """What a pair's generations are built from besides its models: the target's MTP head and grammar
    tokenizer, each opened on first use and kept, and the drafter each call's options ask for.

    Args:
        target: the pair's target model.
        draft: its draft model, or None.
    """

    def __init__(self, target: Model, draft: Optional[Model]):
        self.target = target
        self.draft = draft
        self._head: Optional[MtpHead] = None
        self._head_refused = False
        self._grammar_tokenizer: Optional[Any] = None

    @property
    def opened_head(self) -> Optional[MtpHead]:
        """The target's MTP head if it has been opened (None: not yet, or never)."""
        return self._head

    def head(self) -> MtpHead:
        """The target's MTP head, opened on first use (it keeps the target's hidden states from then on).

        Raises:
            ConfigError: the target has no MTP head, or this llama-cpp-python build cannot run one.
        """
        if self._head is None:
            self._head = MtpHead(self.target)
        return self._head

    def usable_head(self, notify: Callable[[str], None]) -> Optional[MtpHead]:
        """The target's MTP head for auto and calibration: None when it has none, or when this build cannot
        run it (said once; the other methods work as before).

        Args:
            notify: where the notice that the head cannot run goes.
        """
        if not self.target.n_nextn or self._head_refused:
            return self._head
        try:
            return self.head()
        except ConfigError as exc:
            self._head_refused = True
            notify(f"localspec: not drafting with the MTP head of {self.target.path.name}: {exc}")
            return None

    def matcher(self, constraint: Constraint) -> GrammarState:
        """A fresh grammar state for one generation under ``constraint``, over the target's vocabulary.

        Raises:
            ConfigError: the constraint does not compile, llguidance (the 'structured' extra) is missing,
                or its trigger is not one token of the target's vocabulary.
        """
        if self._grammar_tokenizer is None:
            self._grammar_tokenizer = tokenizer_for(self.target.vocab_pointer, self.target.eos)
        inner = Matcher(constraint, self._grammar_tokenizer, self.target.n_vocab)
        if constraint.trigger is None:
            return inner
        trigger = self.target.tokenize(constraint.trigger, add_special=False)
        if len(trigger) != 1:
            raise ConfigError(f"{self.target.path.name} has no single {constraint.trigger} token (its vocabulary "
                              f"spells it in {len(trigger)} tokens), which {constraint.describe()} starts with.")
        return TriggeredMatcher(inner, trigger[0])

    def drafter(self, opts: GenerationOptions, k: int, prompt_text: Optional[str] = None,
                prompt_tokens: Sequence[int] = (), *, notify: Callable[[str], None],
                history: Callable[[], Optional[HistoryStore]] = lambda: None,
                profile: Optional[CostProfile] = None, correction: Optional[CostCorrection] = None,
                history_alpha: Optional[dict[Any, Any]] = None) -> Optional[Drafter]:
        """The drafter for ``opts.method`` drafting up to ``k`` tokens, built by the registered method.

        Args:
            opts: the call's options.
            k: the draft length (``opts.draft_length`` of the pair's suggested one).
            prompt_text: the prompt's text, if known (else it is detokenized when a drafter asks for it).
            prompt_tokens: the prompt's token ids.
            notify: where a notice that the MTP head cannot run goes.
            history: the history store to draft from (None: history is off), asked for only when the method
                drafts and ``opts.history`` is on.
            profile: the machine's cost profile auto decides by, measured before this is called.
            correction: what real rounds have shown about ``profile``, kept across generations.
            history_alpha: auto's estimates of history's acceptance, kept across generations.

        Returns:
            The drafter, or None for plain decoding (the method drafts nothing, or ``k`` is 0).

        Raises:
            ConfigError: the method cannot run here (no draft model, no MTP head).
        """
        method = get_method(opts.method)
        if method.build is None or k == 0:
            return None
        if method.needs_draft and self.draft is None:
            raise ConfigError(f"Method {method.name!r} needs a draft model; load one (--draft) or use 'lookup'.")
        if method.needs_head and not self.target.n_nextn:
            raise ConfigError(f"Method {method.name!r} needs a target with an MTP head (next-n layers in its GGUF); "
                              f"{self.target.path.name} has none: use 'auto', 'lookup' or 'draft'.")
        store = history() if opts.history else None
        tokens = np.asarray(prompt_tokens, dtype=np.int32)
        text = functools.cache(lambda: prompt_text if prompt_text is not None else self.target.detokenize(tokens))
        ctx = DraftingContext(opts, k, tokens, text, draft=self.draft,
                              history=store.index if store is not None else None,
                              history_alpha=history_alpha, profile=profile,
                              # A seeded sample must come again: auto then decides by the profile alone, since
                              # choices that followed the timing of earlier rounds would draw differently. A greedy
                              # reply draws nothing, so its seed asks for nothing and real costs count.
                              correction=correction if opts.seed is None or opts.sampling.greedy else None,
                              # auto offers the head where it can run; --method mtp says why it cannot
                              head=(functools.partial(self.usable_head, notify) if method.adaptive else self.head)
                              if self.target.n_nextn else None,
                              prediction=self._prediction(opts))
        return method.build(ctx)

    def close(self) -> None:
        """Free the MTP head, if it was opened."""
        if self._head is not None:
            self._head.close()

    def _prediction(self, opts: GenerationOptions) -> Optional[np.ndarray]:
        """The predicted output's token ids (None: none given)."""
        if not opts.prediction:
            return None
        return np.asarray(self.target.tokenize(opts.prediction, add_special=False, parse_special=False),
                          dtype=np.int32)
