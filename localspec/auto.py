"""Auto mode: choose prompt lookup, history, the draft model or plain decoding, and K, each round.

The choice maximises expected tokens per second under the cost model
(``localspec.costs``) with the machine's measured costs (``localspec.calibration``):

* each method's per-token acceptance alpha is **estimated online** with a
  prior (from a look at the prompt) and exponential decay, separately for
  lookup matches of each n-gram length and history matches of each length
  band (history's estimates outlive one generation: the pair keeps them).
  Lookup and history are also scored in rounds they sit out: their first
  guess is compared with the token the target chose, which costs nothing,
  so a guesser that starts to pay is noticed at once;
* every round takes the method and K with the highest predicted speed, or
  plain decoding unless something clears ``costs.MIN_GAIN``.

On a compute-bound CPU, verify(K+1) grows almost linearly with K, so only a
well-matched lookup pays; on a memory-bound GPU verify(K+1) ~ verify(1) and
long drafts win. Auto only chooses what to propose: acceptance is unchanged,
so the output stays exactly the target's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .backend import Model
from .costs import CostProfile, best_k
from .drafters import EMPTY_DRAFT, AutoChange, AutoReport, Draft, ModelDrafter, PromptLookupDrafter
from .history import HistoryDrafter, HistoryIndex
from .options import AUTO_KMAX, SamplingParams

KMAX = AUTO_KMAX


class AcceptanceEstimate:
    """Per-token acceptance alpha from decayed counts of kept tokens and rejections.

    A round that drafts K tokens and keeps ``kept`` contributes ``kept``
    successes and one failure if kept < K: the maximum-likelihood estimate
    of a geometric acceptance truncated at K. Old evidence fades by
    ``decay`` per drafted token, so the estimate spans the last ~1/(1-decay)
    guesses whatever K was.
    """

    def __init__(self, prior_alpha: float, prior_weight: float = 2.0, decay: float = 0.95):
        self.kept = prior_alpha * prior_weight
        self.rejected = (1.0 - prior_alpha) * prior_weight
        self.decay = decay

    @property
    def alpha(self) -> float:
        total = self.kept + self.rejected
        return self.kept / total if total > 0 else 0.0

    def update(self, drafted: int, kept: int) -> None:
        fade = self.decay ** drafted
        self.kept = self.kept * fade + kept
        self.rejected = self.rejected * fade + (1.0 if kept < drafted else 0.0)

    def shrink(self, weight: float) -> None:
        """Keep alpha but count the evidence as at most ``weight`` guesses, so new evidence moves it fast."""
        total = self.kept + self.rejected
        if total > weight:
            self.kept *= weight / total
            self.rejected *= weight / total


_COPY_CUES = re.compile(
    r"\b(rewrite|rephrase|fix|correct|edit|modify|refactor|rename|update|change|quote|copy|repeat|"
    r"return the (full|whole|complete|modified|updated)|keep(ing)? (everything|the rest))\b",
    re.IGNORECASE,
)


def prompt_prior(text: str, prompt_tokens: np.ndarray) -> float:
    """Prior acceptance for prompt lookup from a cheap look at the prompt.

    Copy-heavy requests (rewrite, edit, quote...) over a long supplied text
    make the answer repeat the prompt; otherwise lookup mostly finds
    incidental matches.
    """
    copy_request = bool(_COPY_CUES.search(text))
    long_material = len(prompt_tokens) > 120
    if copy_request and long_material:
        return 0.7
    if copy_request or long_material:
        return 0.45
    return 0.25


@dataclass
class Choice:
    """One candidate for a round: a method and K, the speedup it is predicted to give, and on what."""

    speed: float
    method: str
    k: int
    alpha: float
    estimate: Optional[AcceptanceEstimate] = None  # the estimate its outcome updates
    draft: Draft = EMPTY_DRAFT  # lookup's or history's guess, made before choosing (free)


PLAIN = Choice(1.0, "plain", 0, 0.0)

#: History matches are weighed by length band: 2-3, 4-7, 8-15 and 16 or more tokens.
HISTORY_BANDS = (2, 4, 8, 16)
#: Prior acceptance per band: a long match in earlier output is usually followed the same way. (Replaying
#: the related-requests workload gave per-token acceptance 0.74, 0.82, 0.88 and 0.96 by band; the priors
#: stay below that, since other workloads repeat less.)
HISTORY_PRIORS = (0.45, 0.6, 0.75, 0.9)
#: What one generation carries over of the estimates the last ones learned, in guesses: a new request may
#: be about something else, and two or three wasted history rounds should be enough to notice.
HISTORY_CARRY_WEIGHT = 4.0


def history_band(match: int) -> int:
    """The length band of a history match (an index into HISTORY_BANDS)."""
    return sum(match >= lo for lo in HISTORY_BANDS[1:])


def history_estimates() -> dict[int, AcceptanceEstimate]:
    """Fresh acceptance estimates for history matches, one per band (a pair keeps them across generations)."""
    return {i: AcceptanceEstimate(p) for i, p in enumerate(HISTORY_PRIORS)}


class AutoDrafter:
    """A drafter that picks lookup, history, the draft model, or nothing (plain) each round.

    Args:
        profile: the machine's costs (see ``calibrate``).
        lookup: the prompt-lookup drafter.
        model: the draft-model drafter, or None.
        kmax: the longest draft considered.
        lookup_prior: prior acceptance for lookup (see ``prompt_prior``).
        explore_every: at most one exploratory round per this many rounds,
            to re-check a method the estimates have ruled out.
        history: the history drafter, or None.
        history_alpha: its estimates by match band (see ``history_estimates``);
            updated in place, so a caller can keep them for the next generation.
    """

    name = "auto"

    def __init__(self, profile: CostProfile, lookup: PromptLookupDrafter, model: Optional[ModelDrafter],
                 kmax: int = KMAX, lookup_prior: float = 0.25, explore_every: int = 32,
                 history: Optional[HistoryDrafter] = None,
                 history_alpha: Optional[dict[int, AcceptanceEstimate]] = None):
        self.profile = profile
        self.lookup = lookup
        self.history = history
        self.history_alpha = history_alpha if history_alpha is not None else history_estimates()
        for est in self.history_alpha.values():
            est.shrink(HISTORY_CARRY_WEIGHT)
        self.kmax = min(kmax, profile.kmax)
        # A draft model that could not pay even if it were always right is never run
        # (nor fed the prompt): on a compute-bound CPU this is the usual case.
        self.draft_viable = model is not None and best_k(profile, "draft", 0.98, self.kmax)[0] > 0
        self.model = model if self.draft_viable else None
        self.models: tuple[Model, ...] = self.model.models if self.model is not None else ()
        self.explore_every = explore_every
        # lookup acceptance depends on the n-gram length of the match (1, 2, 3...)
        self.lookup_alpha = {n: AcceptanceEstimate(min(0.95, lookup_prior + 0.1 * (n - 1)))
                             for n in range(1, lookup.max_ngram + 1)}
        self.draft_alpha = AcceptanceEstimate(0.6)
        self._report = AutoReport(rounds={"plain": 0, "lookup": 0, "history": 0, "draft": 0},
                                  profile=profile.relative())
        self._pending: Optional[tuple[AcceptanceEstimate, str]] = None
        # lookup's and history's unused first guesses in a plain round, scored against the token that came
        self._shadows: list[tuple[AcceptanceEstimate, int, int]] = []
        self._last_tried = {"lookup": 0, "history": 0, "draft": 0}
        self._round = 0
        self._last_choice: Optional[tuple[str, int]] = None

    def prefill(self, context: np.ndarray) -> None:
        if self.model is not None:
            self.model.prefill(context)

    def propose(self, context: np.ndarray, k: int, rng: np.random.Generator) -> Draft:
        """Choose a method and K for this round and return its draft (empty for plain)."""
        self._round += 1
        for shadow_est, shadow_guess, at in self._shadows:
            if len(context) == at + 1:  # exactly the plain round's token was added
                shadow_est.update(1, int(context[-1] == shadow_guess))
        self._shadows = []
        kmax = min(k, self.kmax)
        choices = [PLAIN]
        if kmax > 0:
            guess = self.lookup.propose(context, kmax, rng)
            if guess.tokens:
                lk = self.lookup_alpha[self.lookup.last_match]
                kk, speed = best_k(self.profile, "lookup", lk.alpha, min(kmax, len(guess.tokens)))
                choices.append(Choice(speed, "lookup", kk, lk.alpha, lk, guess))
            if self.history is not None:
                recalled = self.history.propose(context, kmax, rng)
                if recalled.tokens:
                    hk = self.history_alpha[history_band(self.history.last_match)]
                    kk, speed = best_k(self.profile, "history", hk.alpha, min(kmax, len(recalled.tokens)))
                    choices.append(Choice(speed, "history", kk, hk.alpha, hk, recalled))
            if self.model is not None:
                kk, speed = best_k(self.profile, "draft", self.draft_alpha.alpha, kmax)
                choices.append(Choice(speed, "draft", kk, self.draft_alpha.alpha, self.draft_alpha))
        best = max(choices, key=lambda c: c.speed)
        if best.k == 0:  # nothing pays: plain, unless a method is due for a look
            best = self._explore(choices) or Choice(1.0, "plain", 0, best.alpha)
        if best.method == "plain":
            self._pending = None
            for choice in choices:
                if choice.draft.tokens and choice.estimate is not None:  # lookup's and history's guesses
                    self._shadows.append((choice.estimate, choice.draft.tokens[0], len(context)))
            self._note(best)
            return EMPTY_DRAFT
        self._last_tried[best.method] = self._round
        self._note(best)
        self._pending = (best.estimate, best.method) if best.estimate is not None else None
        if best.draft.tokens:
            return Draft(best.draft.tokens[: best.k], None, best.method)
        assert self.model is not None
        return self.model.propose(context, best.k, rng)

    def _explore(self, choices: list[Choice]) -> Optional[Choice]:
        """A cheap K=1 round of a method not tried for a while that could pay if alpha were higher."""
        for c in choices[1:]:
            stale = self._round - self._last_tried[c.method] >= self.explore_every
            optimistic = best_k(self.profile, c.method, min(0.98, c.alpha + 0.25), 1)[1] > 1.0
            if stale and optimistic:
                return Choice(c.speed, c.method, 1, c.alpha, c.estimate, c.draft)
        return None

    def observe(self, drafted: int, kept: int) -> None:
        """Feedback after verification: update the estimate of the method just used."""
        if self._pending is not None and drafted > 0:
            est, method = self._pending
            est.update(drafted, kept)
        self._pending = None

    def settle(self, context: np.ndarray) -> None:
        if self.model is not None:
            self.model.settle(context)
        self._report.alpha = {"draft": round(self.draft_alpha.alpha, 3)} if self.model else {}
        for n, est in self.lookup_alpha.items():
            self._report.alpha[f"lookup{n}"] = round(est.alpha, 3)
        if self.history is not None:
            for band, est in self.history_alpha.items():
                self._report.alpha[f"history{HISTORY_BANDS[band]}+"] = round(est.alpha, 3)

    def report(self) -> AutoReport:
        """Rounds per method, the choices made and the estimates behind them."""
        return self._report

    def _note(self, choice: Choice) -> None:
        self._report.rounds[choice.method] += 1
        if self._last_choice != (choice.method, choice.k):
            self._last_choice = (choice.method, choice.k)
            if len(self._report.changes) < 50:
                self._report.changes.append(AutoChange(self._round, choice.method, choice.k, round(choice.alpha, 3),
                                                       round(choice.speed, 3)))


def auto_drafter(profile: CostProfile, draft_model: Optional[Model], params: SamplingParams,
                 prompt_text: str, prompt_tokens: np.ndarray, kmax: int = KMAX,
                 history: Optional[HistoryIndex] = None,
                 history_alpha: Optional[dict[int, AcceptanceEstimate]] = None) -> AutoDrafter:
    """An AutoDrafter for one generation, with the lookup prior set from the prompt.

    Args:
        history: the index of earlier generations to draft from (None: no history).
        history_alpha: history's acceptance estimates, kept by the caller across generations.
    """
    model = ModelDrafter(draft_model, params) if draft_model is not None else None
    return AutoDrafter(profile, PromptLookupDrafter(), model, kmax=kmax,
                       lookup_prior=prompt_prior(prompt_text, prompt_tokens),
                       history=HistoryDrafter(history) if history is not None else None,
                       history_alpha=history_alpha)
