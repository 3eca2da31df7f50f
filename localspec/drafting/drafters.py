"""Drafters: cheap guesses at the target's next K tokens.

A drafter looks at the whole context (prompt plus everything generated so
far, as an int32 array) and proposes up to K tokens, with the probabilities it
drew them from when it sampled (``probs``), or ``None`` when its guess is a
single token per position (one-hot: prompt lookup, a greedy draft model).

* ``ModelDrafter`` runs a small model of the same family for K steps. Its
  cache follows the context: each call keeps the longest cached prefix and
  evaluates only what changed, in one batch.
* ``PromptLookupDrafter`` finds the first earlier occurrence of the
  longest of the context's last n tokens (n from ``max_ngram`` down to
  ``min_ngram``) and proposes what followed it. Nothing to run, so it pays on copy-heavy text.

The third drafter, ``history.drafter.HistoryDrafter``, does the same over earlier
generations instead of the current context.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Optional, Sequence, Union

import numpy as np

from ..errors import ConfigError
from ..methods import DRAFT, LOOKUP, MTP, PREDICTION, REGISTRY
from ..options import LOOKUP_NGRAM, GenerationOptions, SamplingParams
from ..runtime.model import Model
from ..sampling.acceptance import choose
from ..structured.grammar import GrammarState
from .costs import CostCorrection, CostProfile, RoundTiming
from .history.index import HistoryIndex
from .mtp_head import MtpHead


class Draft(NamedTuple):
    """A proposal: token ids, one probability row per token for a sampled draft, who made it, how many
    draft-model steps it took (0 for a search or an MTP head: only a draft model's steps are counted there),
    and how many of its first tokens a grammar forced (drafted for free, before the drafter's guess)."""

    tokens: list[int]
    probs: Optional[np.ndarray]
    by: str = ""
    model_steps: int = 0
    forced: int = 0

    def cut(self, n: int) -> Draft:
        """The first ``n`` tokens of this draft (and their probability rows)."""
        return self._replace(tokens=self.tokens[:n], probs=None if self.probs is None else self.probs[:n],
                             forced=min(self.forced, max(n, 0)))

    def after(self, forced: list[int], by: str) -> Draft:
        """``forced`` (tokens a grammar forced, named ``by`` when nothing follows them), then this draft."""
        if not self.tokens:
            return Draft(list(forced), None, by, 0, len(forced))
        probs = self.probs
        if probs is not None:  # a forced token is guessed without sampling: a one-hot row (kept with p(x))
            width = max(probs.shape[1], max(forced) + 1)  # a forced id may lie past a shorter draft vocabulary
            certain = np.zeros((len(forced), width), dtype=probs.dtype)
            certain[np.arange(len(forced)), forced] = 1.0
            probs = np.concatenate([certain, np.pad(probs, ((0, 0), (0, width - probs.shape[1])))])
        return Draft([*forced, *self.tokens], probs, self.by, self.model_steps, len(forced))


EMPTY_DRAFT = Draft([], None)


class DraftGuide(NamedTuple):
    """What the output's grammar tells a drafter for one round (``Drafter.propose_guided``).

    Attributes:
        grammar: the grammar's state after the context the drafter continues. A drafter that advances it
            while it guesses (to mask a sampling model's steps) goes back before it returns.
        forced: how many tokens at the end of that context the grammar forced this round: they are in the
            same verification, free, so a guess after them is weighed as the rest of that batch.
    """

    grammar: GrammarState
    forced: int = 0


@dataclass
class AutoChange:
    """A round where auto changed its choice: which method and K, on what acceptance (the estimate, at most
    the candidate's ceiling), predicting what speedup."""

    round: int
    method: str
    k: int
    alpha: float
    predicted_speedup: float


@dataclass
class AutoReport:
    """What an adaptive drafter (auto mode) decided during one generation.

    Attributes:
        rounds: rounds per method ("plain" included).
        changes: each change of choice, at most the first 50.
        alpha: the final acceptance estimates by name ("lookup2", "history8+", "draft").
        profile: the cost profile decided by, relative to one target step.
    """

    rounds: dict[str, int] = field(default_factory=dict)
    changes: list[AutoChange] = field(default_factory=list)
    alpha: dict[str, float] = field(default_factory=dict)
    profile: dict[str, object] = field(default_factory=dict)


@dataclass
class DraftingContext:
    """What a method's builders may use for one generation.

    Attributes:
        options: the generation's options (sampling, n-gram range...).
        k: the draft length for this generation (the most, for auto).
        prompt_tokens: the prompt's token ids.
        prompt_text: the prompt as text, computed when asked for (auto reads it for its priors).
        draft: the draft model, if the pair has one.
        history: the history index to draft from (None: history is off for this call).
        history_alpha: auto's estimates of history's acceptance, kept by the pair across generations.
        profile: the machine's measured cost profile, what auto decides by (None for a method that decides nothing).
        correction: what real rounds have shown about that profile, kept by the pair across generations.
        head: the target's MTP head, opened on first call (None: the target has none).
        prediction: the predicted output's token ids (``GenerationOptions.prediction``), or None.
    """

    options: GenerationOptions
    k: int
    prompt_tokens: np.ndarray
    prompt_text: Callable[[], str]
    draft: Optional[Model] = None
    history: Optional[HistoryIndex] = None
    history_alpha: Optional[dict[Any, Any]] = None
    profile: Optional[CostProfile] = None
    correction: Optional[CostCorrection] = None
    head: Optional[Callable[[], Any]] = None
    prediction: Optional[np.ndarray] = None


class Drafter:
    """What the engine needs from a drafter, with nothing-to-do defaults: a drafter writes what it uses.

    Subclasses set ``name`` and write ``propose``; the rest is optional.
    """

    name: str = ""
    #: llama.cpp models the drafter runs (their decode time is not Python overhead).
    models: tuple[Model, ...] = ()

    def prefill(self, context: np.ndarray) -> None:
        """The prompt is ``context``: prepare for the first proposal (a draft model processes it now).

        A drafter that put off reading it (auto, for a draft model that may never pay) is called again with
        the context so far once ``deferred`` says so."""

    def deferred(self, context: np.ndarray, k: int) -> bool:
        """Whether ``prefill`` put off reading the prompt into a model that the round after ``context`` (of up
        to ``k`` drafted tokens) should have: the engine then calls ``prefill(context)`` before the round,
        timed as prompt processing. Never, by default."""
        return False

    def propose(self, context: np.ndarray, k: int, rng: np.random.Generator) -> Draft:
        """Up to ``k`` guessed tokens that continue ``context``."""
        raise NotImplementedError

    def propose_guided(self, context: np.ndarray, k: int, rng: np.random.Generator, guide: DraftGuide) -> Draft:
        """``propose`` under a grammar: by default the same guess (the engine ends it at its first token the
        grammar refuses, verified as a certain rejection); a drafter that samples masks its choices
        (``guide.grammar.mask``), so that q is what it really drew from."""
        return self.propose(context, k, rng)

    def settle(self, context: np.ndarray) -> None:
        """Generation ended at ``context``: drop any state past it."""

    def observe(self, drafted: int, kept: int) -> None:
        """Feedback after each verified round (adaptive drafters learn from it)."""

    def observe_timing(self, timing: RoundTiming) -> None:
        """What the round really cost (auto corrects its cost profile with it)."""

    def report(self) -> Optional[AutoReport]:
        """What the drafter decided during the generation, for stats (None: nothing to say)."""
        return None


class _GrammarWalk:
    """A model's guess under the output's grammar (or free, without one): each pick among the tokens the
    grammar allows there, each picked token walked past, and all of them given back by ``give_back``.

    Args:
        grammar: the grammar's state where the guess starts (None: no grammar).
        params: the sampling parameters the model picks by.
        rng: where a sample's randomness comes from.
        is_end: the model's end-of-generation test (such a token ends the guess, and is not walked past).
    """

    def __init__(self, grammar: Optional[GrammarState], params: SamplingParams, rng: np.random.Generator,
                 is_end: Callable[[int], bool]):
        self.grammar, self.params, self.rng, self.is_end = grammar, params, rng, is_end
        self.walked = 0

    def pick(self, logits: np.ndarray) -> Optional[tuple[int, Optional[np.ndarray]]]:
        """A token and the q it was drawn from (None for a greedy pick); None where the grammar allows only
        ids past this model's vocabulary."""
        if self.grammar is None:
            return choose(logits, self.params, self.rng)
        logits = self.grammar.mask(logits)
        if not np.isfinite(logits).any():
            return None
        tok, q = choose(logits, self.params, self.rng)
        if not self.ends(tok):  # the reply would end there: not walked
            self.grammar.consume([tok])
            self.walked += 1
        return tok, q

    def ends(self, tok: int) -> bool:
        """Whether ``tok`` ends the reply: the model's end token, or the grammar's."""
        return self.is_end(tok) or (self.grammar is not None and tok == self.grammar.end_token)

    def give_back(self) -> None:
        """Take the grammar back to where the guess started."""
        if self.grammar is not None:
            self.grammar.rollback(self.walked)


class ModelDrafter(Drafter):
    """Drafts with a small model that shares the target's vocabulary.

    Args:
        model: the loaded draft model (its own context and cache).
        params: sampling parameters; greedy parameters give greedy drafts
            (one-hot q), otherwise each token is sampled and q is returned.
    """

    name = "draft"

    def __init__(self, model: Model, params: SamplingParams):
        self.model = model
        self.models: tuple[Model, ...] = (model,)
        self.params = params

    def prefill(self, context: np.ndarray) -> None:
        """Bring the draft cache up to ``context`` (done during prompt processing)."""
        if len(context) > 1 and not self._foreign(context):
            m = self.model
            m.borrow(context[:-1])  # what another generation's draft sequence already read of it
            m.truncate(m.common_prefix(context[:-1]))
            m.prompt_read = len(context) - 1 - m.n_past  # as the target's: how long a step beside it may be
            m.eval(context[m.n_past : len(context) - 1], logits="none")

    def propose(self, context: np.ndarray, k: int, rng: np.random.Generator) -> Draft:
        """K draft-model steps after ``context``; stops early at an end-of-generation token."""
        return self._steps(context, k, rng, None)

    def propose_guided(self, context: np.ndarray, k: int, rng: np.random.Generator, guide: DraftGuide) -> Draft:
        """K draft-model steps, each choosing among the tokens the grammar allows there (q is that masked
        distribution); stops early where the grammar leaves the draft model nothing."""
        return self._steps(context, k, rng, guide.grammar)

    def _steps(self, context: np.ndarray, k: int, rng: np.random.Generator,
               grammar: Optional[GrammarState]) -> Draft:
        m = self.model
        room = m.n_ctx - len(context)  # the draft context may be smaller than the target's
        k = min(k, room + 1)
        if k <= 0 or self._foreign(context):
            return EMPTY_DRAFT
        logits = m.sync(context)
        m.checkpoint()  # a recurrent draft cannot cut its single steps back; going back here is then cheap
        tokens: list[int] = []
        rows: list[np.ndarray] = []
        walk = _GrammarWalk(grammar, self.params, rng, m.is_eog)
        try:
            for i in range(k):
                picked = walk.pick(logits)
                if picked is None:  # what the grammar allows lies past the draft's vocabulary
                    break
                tok, q = picked
                if q is not None:
                    rows.append(q)
                tokens.append(tok)
                if i == k - 1 or walk.ends(tok):
                    break
                logits = m.eval([tok], logits="last")[0]
        finally:
            walk.give_back()
        return Draft(tokens, np.stack(rows) if rows else None, "draft", len(tokens))

    def _foreign(self, context: np.ndarray) -> bool:
        """True when ``context`` holds an id past the draft's vocabulary (a padded target's): nothing to draft."""
        return bool(context.size) and int(context.max()) >= self.model.n_vocab

    def settle(self, context: np.ndarray) -> None:
        """Keep only the cached prefix shared with ``context``."""
        self.model.truncate(self.model.common_prefix(context))


def suffix_matches(source: np.ndarray, query: np.ndarray, max_ngram: int, min_ngram: int) -> tuple[np.ndarray, int]:
    """Where in ``source`` the longest n-gram ending ``query`` (``min_ngram`` <= n <= ``max_ngram``) occurs.

    Returns:
        The positions in ``source`` of each match's last token, in order, and n; (empty, 0) when none.
    """
    # Every position holding the query's last token ends a 1-gram match; matches are extended one token to
    # the left while the query's earlier tokens agree.
    ends = np.flatnonzero(source == query[-1])
    found, length, n = ends[:0], 0, 1
    while ends.size and n <= max_ngram:
        if n >= min_ngram:
            found, length = ends, n
        if n == max_ngram or n >= len(query):
            break
        ends = ends[ends >= n]
        ends = ends[source[ends - n] == query[-1 - n]]
        n += 1
    return found, length


class PromptLookupDrafter(Drafter):
    """Copies what followed the first earlier match of the context's longest matching last n-gram.

    The first match rather than the newest: an answer that copies its prompt
    (a rewrite, an edit, a quote) finds its source there, while a newer
    occurrence is usually a phrase the answer already repeated, followed by
    what came after it the first time (a replay of the bench suite's plain
    outputs favoured it on every copy-heavy prompt).

    Args:
        max_ngram: longest suffix tried first.
        min_ngram: shortest suffix accepted as a match.
    """

    name = "lookup"

    def __init__(self, max_ngram: int = LOOKUP_NGRAM[1], min_ngram: int = LOOKUP_NGRAM[0]):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.models: tuple[Model, ...] = ()
        #: Length of the n-gram behind the last proposal (0: no match).
        self.last_match = 0
        #: Where in the context the last proposal's match ends (-1: no match).
        self.last_source = -1

    def propose(self, context: np.ndarray, k: int, rng: np.random.Generator) -> Draft:
        """The ``k`` tokens after the first match of the longest n-gram, or none when nothing matches."""
        n_ctx = len(context)
        self.last_source = -1
        if k <= 0 or n_ctx < 2:
            self.last_match = 0
            return EMPTY_DRAFT
        # excluding the final position guarantees something follows each match
        ends, self.last_match = suffix_matches(context[: n_ctx - 1], context, self.max_ngram, self.min_ngram)
        if not ends.size:
            return EMPTY_DRAFT
        best = self.last_source = int(ends[0])  # the first match of the longest n-gram
        return Draft([int(t) for t in context[best + 1 : best + 1 + k]], None, "lookup")


class PredictionDrafter(Drafter):
    """Drafts from the output the caller predicted (OpenAI's Predicted Outputs).

    What was generated is aligned to the prediction by its longest last n-gram, as prompt lookup
    aligns a copy; among several matches, the one nearest to where the reply should be by now (the
    last alignment moved on by the tokens generated since) wins, so a prediction that repeats itself
    is followed in order. The prediction's next tokens are the guess.

    Args:
        prediction: the predicted output's token ids.
        max_ngram: longest n-gram tried first.
        min_ngram: shortest n-gram accepted as a match.
    """

    name = "prediction"

    def __init__(self, prediction: Union[Sequence[int], np.ndarray], max_ngram: int = LOOKUP_NGRAM[1],
                 min_ngram: int = LOOKUP_NGRAM[0]):
        self.prediction = np.asarray(prediction, dtype=np.int32)
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.models: tuple[Model, ...] = ()
        #: Length of the n-gram behind the last proposal (0: no match).
        self.last_match = 0
        self._start = 0  # where the output begins in the context
        self._at = 0  # the prediction's position after the last alignment
        self._out_at = 0  # the output's length then

    def prefill(self, context: np.ndarray) -> None:
        """The output starts after ``context`` (the prompt), and the alignment at the prediction's start."""
        self._start, self._at, self._out_at = len(context), 0, 0

    def propose(self, context: np.ndarray, k: int, rng: np.random.Generator) -> Draft:
        """The ``k`` predicted tokens after the best alignment of the output's end, or none."""
        out, pred = context[self._start:], self.prediction
        if k <= 0 or not len(out) or len(pred) < 2:
            self.last_match = 0
            return EMPTY_DRAFT
        found, self.last_match = suffix_matches(pred[:-1], out, self.max_ngram, self.min_ngram)  # each leaves a token
        if not found.size:
            return EMPTY_DRAFT
        expected = self._at + len(out) - self._out_at  # where the reply would be had it kept to the prediction
        i = int(found[np.argmin(np.abs(found + 1 - expected))]) + 1  # nearest; the first of equals
        self._at, self._out_at = i, len(out)
        return Draft([int(t) for t in pred[i:i + k]], None, self.name)


class MtpDrafter(Drafter):
    """Drafts with the target's own MTP head (``mtp_head.MtpHead``): no draft model, no search.

    Args:
        head: the target's head, which follows the target's cache.
        params: sampling parameters; greedy gives the head's argmax (one-hot q), otherwise q is its
            processed distribution, as for a draft model.
    """

    name = "mtp"

    def __init__(self, head: MtpHead, params: SamplingParams):
        self.head = head
        self.models: tuple[Model, ...] = (head,)  # type: ignore[assignment]  # timed like a model
        self.params = params

    def prefill(self, context: np.ndarray) -> None:
        """Give the head the prompt's rows now, in batches, not in round 1."""
        self.head.catch_up()

    def propose(self, context: np.ndarray, k: int, rng: np.random.Generator) -> Draft:
        """K head steps after ``context`` (the target holds all of it but the last token)."""
        return self._steps(context, k, rng, None)

    def propose_guided(self, context: np.ndarray, k: int, rng: np.random.Generator, guide: DraftGuide) -> Draft:
        """K head steps among the tokens the grammar allows; none after forced tokens, which the target has
        not evaluated yet (the head drafts from the target's hidden state)."""
        return EMPTY_DRAFT if guide.forced else self._steps(context, k, rng, guide.grammar)

    def _steps(self, context: np.ndarray, k: int, rng: np.random.Generator,
               grammar: Optional[GrammarState]) -> Draft:
        if k <= 0:
            return EMPTY_DRAFT
        walk = _GrammarWalk(grammar, self.params, rng, self.head.target.is_eog)

        def pick(logits: np.ndarray) -> tuple[int, Optional[np.ndarray]]:
            picked = walk.pick(logits)
            assert picked is not None  # the head's vocabulary is the target's, where the grammar allows some
            return picked

        try:
            tokens, rows = self.head.draft(int(context[-1]), k, pick)
        finally:
            walk.give_back()
        return Draft(tokens, np.stack(rows) if rows else None, "mtp")


def build_mtp(ctx: DraftingContext) -> MtpDrafter:
    """Method "mtp": the target's own MTP head, sampling as the target does."""
    if ctx.head is None:
        raise ConfigError("Method 'mtp' needs a target with an MTP head (next-n layers in its GGUF).")
    return MtpDrafter(ctx.head(), ctx.options.sampling)


def build_lookup(ctx: DraftingContext) -> PromptLookupDrafter:
    """Method "lookup": prompt lookup over the options' n-gram range."""
    lo, hi = ctx.options.ngram
    return PromptLookupDrafter(max_ngram=hi, min_ngram=lo)


def build_prediction(ctx: DraftingContext) -> PredictionDrafter:
    """Method "prediction": the request's predicted output, aligned over the options' n-gram range."""
    if ctx.prediction is None or not len(ctx.prediction):
        raise ConfigError("Method 'prediction' drafts from a predicted output; give one (prediction=..., "
                          "--prediction TEXT), or use 'auto' or 'lookup'.")
    lo, hi = ctx.options.ngram
    return PredictionDrafter(ctx.prediction, max_ngram=hi, min_ngram=lo)


def build_model_drafter(ctx: DraftingContext) -> ModelDrafter:
    """Method "draft": the pair's draft model, sampling as the target does (``Pair`` checks there is one)."""
    if ctx.draft is None:
        raise ConfigError("Method 'draft' needs a draft model; load one (--draft) or use 'lookup'.")
    return ModelDrafter(ctx.draft, ctx.options.sampling)


REGISTRY.attach(LOOKUP.name, build=build_lookup)
REGISTRY.attach(PREDICTION.name, build=build_prediction)
REGISTRY.attach(DRAFT.name, build=build_model_drafter)
REGISTRY.attach(MTP.name, build=build_mtp)
