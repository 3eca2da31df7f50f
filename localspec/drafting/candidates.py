"""What auto mode chooses among: each method's drafter with its acceptance estimates, and the built-in ones.

A method registered with a ``candidate`` factory (see ``localspec.methods``) is offered to auto through a
``Candidate``; this module defines and attaches the factories of the built-in methods.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from ..methods import DRAFT, HISTORY, LOOKUP, MTP, PREDICTION, REGISTRY, Method
from ..runtime.model import Model
from .costs import CostProfile, best_k
from .drafters import (
    EMPTY_DRAFT,
    Draft,
    Drafter,
    DraftingContext,
    ModelDrafter,
    MtpDrafter,
    build_lookup,
    build_prediction,
)
from .estimates import (
    ALPHA_CEILING,
    HISTORY_BANDS,
    HISTORY_CARRY_WEIGHT,
    LOOKUP_PRIOR_WEIGHT,
    LOOKUP_SOURCES,
    AcceptanceEstimate,
    history_band,
    history_estimates,
    lookup_source,
    prompt_prior,
)
from .history.drafter import HistoryDrafter


class Candidate:
    """A method as auto offers it each round: its drafter and the acceptance estimates behind its choice.

    A drafter that guesses for free (a search: lookup, history) guesses before auto chooses, and the
    estimate is picked by what backs the guess (``key``: the length of the match); one that runs a
    model guesses only once chosen. See the ``*_candidate`` factories for the built-in ones.

    Args:
        method: the registered method.
        drafter: its drafter.
        estimates: acceptance estimates by key; updated in place (a caller may keep them).
        free: guessing costs nothing, so the guess is made before choosing (False: a model runs).
        key: the estimate that backs the drafter's last guess, by what backs it (lookup: the match's length and
            where its source lies; default: the first).
        names: how the report names each estimate (default: the method's name).
        ceiling: the most of its guessed tokens it is taken to keep when auto chooses (see ``ALPHA_CEILING``).
    """

    def __init__(self, method: Method, drafter: Drafter, estimates: dict[Any, AcceptanceEstimate], free: bool = True,
                 key: Optional[Callable[[], Any]] = None, names: Optional[Callable[[Any], str]] = None,
                 ceiling: float = ALPHA_CEILING):
        self.method = method
        self.drafter = drafter
        self.estimates = estimates
        self.free = free
        self.key = key
        self.names = names
        self.ceiling = ceiling
        self.models: tuple[Model, ...] = drafter.models

    @property
    def name(self) -> str:
        return self.method.name

    def offer(self, context: np.ndarray, kmax: int, rng: np.random.Generator
              ) -> Optional[tuple[AcceptanceEstimate, Draft]]:
        """The estimate to decide by, and the free guess (empty for a model); None: nothing to offer."""
        if not self.free:
            return next(iter(self.estimates.values())), EMPTY_DRAFT
        guess = self.drafter.propose(context, kmax, rng)
        if not guess.tokens:
            return None
        return self.estimates[self.key() if self.key else next(iter(self.estimates))], guess

    def alphas(self) -> dict[str, float]:
        """The estimates, rounded, by their report names."""
        return {(self.names(k) if self.names else self.name): round(e.alpha, 3) for k, e in self.estimates.items()}


# -- the built-in candidates, registered with their methods (see ``localspec.methods``) ----------------


def lookup_candidate(ctx: DraftingContext, prior: Optional[float] = None) -> Candidate:
    """Prompt lookup, with one estimate per n-gram length of the match and where its source lies (see
    ``LOOKUP_SOURCES``), their priors read from the prompt."""
    lookup = build_lookup(ctx)
    if prior is None:
        prior = prompt_prior(ctx.prompt_text(), ctx.prompt_tokens)
    prompt_len = len(ctx.prompt_tokens)
    # lookup acceptance depends on the n-gram length of the match (1, 2, 3...) and on what it copies
    estimates = {(n, where): AcceptanceEstimate(max(0.05, min(0.95, prior + 0.1 * (n - 1) + lower)),
                                                LOOKUP_PRIOR_WEIGHT)
                 for n in range(1, lookup.max_ngram + 1) for where, lower in LOOKUP_SOURCES.items()}
    return Candidate(LOOKUP, lookup, estimates,
                     key=lambda: (lookup.last_match, lookup_source(lookup.last_source, prompt_len)),
                     names=lambda key: f"{LOOKUP.name}{key[0]}" + ("" if key[1] == "text" else f" {key[1]}"))


def prediction_candidate(ctx: DraftingContext) -> Optional[Candidate]:
    """The request's predicted output, when it gave one: a free guesser trusted as a near copy at first
    (it is the caller's own guess of the output), one estimate per n-gram length of the alignment. No ceiling
    caps it: a true copy is the case it exists for, and the recordings that judged the ceiling have none."""
    if ctx.prediction is None or not len(ctx.prediction):
        return None
    drafter = build_prediction(ctx)
    estimates = {n: AcceptanceEstimate(min(0.95, 0.7 + 0.05 * (n - 1))) for n in range(1, drafter.max_ngram + 1)}
    return Candidate(PREDICTION, drafter, estimates, key=lambda: drafter.last_match,
                     names=lambda n: f"{PREDICTION.name}{n}", ceiling=1.0)


def history_candidate(ctx: DraftingContext) -> Optional[Candidate]:
    """History, with one estimate per match-length band, carried over from the pair's earlier generations."""
    if ctx.history is None:
        return None
    estimates = ctx.history_alpha if ctx.history_alpha is not None else history_estimates()
    for est in estimates.values():
        est.shrink(HISTORY_CARRY_WEIGHT)
    drafter = HistoryDrafter(ctx.history)
    return Candidate(HISTORY, drafter, estimates, key=lambda: history_band(drafter.last_match),
                     names=lambda band: f"{HISTORY.name}{HISTORY_BANDS[band]}+")


def model_candidate(ctx: DraftingContext) -> Optional[Candidate]:
    """The draft model, unless it could not pay even if it were always right (then it is never run, nor
    fed the prompt: on a compute-bound CPU the usual case)."""
    if ctx.draft is None:
        return None
    return drafting_model_candidate(ctx, ModelDrafter(ctx.draft, ctx.options.sampling))


def mtp_candidate(ctx: DraftingContext) -> Optional[Candidate]:
    """The target's MTP head, unless the target has none (or this build cannot run it), its step was not
    measured, or it could not pay even if it were always right."""
    if ctx.head is None or ctx.profile is None:
        return None
    profile = _decided_profile(ctx)
    head = ctx.head()
    if head is None or not profile.mtp_step or best_k(profile, MTP, ALPHA_CEILING, ctx.k)[0] == 0:
        return None
    return Candidate(MTP, MtpDrafter(head, ctx.options.sampling), {0: AcceptanceEstimate(0.6)}, free=False)


def drafting_model_candidate(ctx: DraftingContext, drafter: Drafter) -> Optional[Candidate]:
    """A candidate for the draft-model method with this drafter (the replay's recorded draft, or the model)."""
    if ctx.profile is None or best_k(_decided_profile(ctx), DRAFT, ALPHA_CEILING, ctx.k)[0] == 0:
        return None  # best_k stops at the profile's longest K
    return Candidate(DRAFT, drafter, {0: AcceptanceEstimate(0.6)}, free=False)


def _decided_profile(ctx: DraftingContext) -> CostProfile:
    """The pair's profile, corrected by the rounds it has timed."""
    assert ctx.profile is not None
    return ctx.correction.apply(ctx.profile) if ctx.correction is not None else ctx.profile


REGISTRY.attach(LOOKUP.name, candidate=lookup_candidate)
REGISTRY.attach(PREDICTION.name, candidate=prediction_candidate)
REGISTRY.attach(HISTORY.name, candidate=history_candidate)
REGISTRY.attach(DRAFT.name, candidate=model_candidate)
REGISTRY.attach(MTP.name, candidate=mtp_candidate)
