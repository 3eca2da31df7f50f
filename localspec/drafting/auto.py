"""Auto mode: choose prompt lookup, history, the draft model, the MTP head or plain decoding, and K, each round.

The choice maximises expected tokens per second under the cost model
(``localspec.drafting.costs``) with the machine's measured costs (``localspec.drafting.calibration``):

* each method's per-token acceptance alpha is **estimated online** with a
  prior (from a look at the prompt) and exponential decay, separately for
  lookup matches of each n-gram length and source (the supplied text, a
  long prompt's closing words, the reply) and history matches of each length
  band (history's estimates outlive one generation: the pair keeps them;
  see ``localspec.drafting.estimates``).
  Lookup and history are also scored in rounds they sit out: the first
  tokens of their guess are compared with the tokens the output then had,
  up to the first wrong one, as the round would have scored them, which
  costs nothing, so a guesser that starts to pay is noticed at once;
* every round takes the method and K with the highest predicted speed, or
  plain decoding unless something clears ``costs.MIN_GAIN``. What it chooses
  among are the registered methods' candidates
  (``localspec.drafting.candidates``).

On a compute-bound CPU, verify(K+1) grows almost linearly with K, so only a
well-matched lookup pays; on a memory-bound GPU verify(K+1) ~ verify(1) and
long drafts win. Auto only chooses what to propose: acceptance is unchanged,
so the output stays exactly the target's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..errors import ConfigError
from ..methods import AUTO, AUTO_KMAX, PLAIN, REGISTRY
from ..runtime.model import Model
from .candidates import Candidate  # importing it attaches the built-in methods' candidates
from .costs import (
    ALONE,
    MIN_GAIN,
    Beside,
    CostCorrection,
    CostProfile,
    RoundTiming,
    best_k,
    expected_tokens,
    round_cost,
    round_speedup,
)
from .drafters import (
    EMPTY_DRAFT,
    AutoChange,
    AutoReport,
    Draft,
    Drafter,
    DraftGuide,
    DraftingContext,
    ModelDrafter,
    MtpDrafter,
)
from .estimates import AcceptanceEstimate


@dataclass(frozen=True)
class Choice:
    """One candidate for a round: a method and K, the speedup it is predicted to give, and on what."""

    speed: float
    method: str
    k: int
    alpha: float
    estimate: Optional[AcceptanceEstimate] = None  # the estimate its outcome updates
    draft: Draft = EMPTY_DRAFT  # lookup's or history's guess, made before choosing (free)
    factor: float = 1.0  # the method's realized-gain factor, by which ``speed`` was scaled
    most: int = 0  # the longest draft on offer


PLAIN_CHOICE = Choice(1.0, PLAIN.name, 0, 0.0)


@dataclass
class _Bet:
    """A drafting round under way: what it was chosen for, and the tokens it gave once verified."""

    method: str
    predicted_tokens: float
    predicted_steps: float
    tokens: int = 0


#: How many tokens of a free guesser's unused guess are scored (see ``AutoDrafter._score_shadows``): about as
#: many as a drafting round on a CPU verifies, so the estimate says what such a round would keep.
SHADOW_K = 4

#: The fewest tokens a reply is expected to run on for (see ``AutoDrafter.deferred``): a reply is taken to go on
#: for as many tokens again as it has, and at least this many, within its ``max_tokens``.
MIN_HORIZON = 16

#: Rounds of two tokens that must have been timed before the profile's cost for them is taken on trust:
#: until then auto explores drafting now and then even where the profile says it cannot pay.
COST_EVIDENCE = 3


class AutoDrafter(Drafter):
    """A drafter that picks one of its candidates (lookup, history, the draft model...) or plain, each round.

    Args:
        profile: the machine's costs (see ``calibration.calibrate``).
        candidates: what auto may choose from, in order of preference on ties.
        kmax: the longest draft considered.
        explore_every: at most one exploratory round per this many rounds,
            to re-check a method the estimates have ruled out.
        correction: real rounds' costs, folded into ``profile`` when it is next read (see ``costs.CostCorrection``);
            shared with the caller, who may keep it for the next generation. None: the profile as it is.
        max_tokens: the most tokens the generation may give (None: no limit), which bounds what a draft model's
            reading of the prompt can pay back (see ``deferred``).
    """

    name = AUTO.name

    def __init__(self, profile: CostProfile, candidates: Sequence[Candidate], kmax: int = AUTO_KMAX,
                 explore_every: int = 32, correction: Optional[CostCorrection] = None,
                 max_tokens: Optional[int] = None):
        self.base_profile = profile
        self.correction = correction
        self._profile = correction.apply(profile) if correction is not None else profile
        self._profile_stale = False  # rounds were timed since: fold them in when the profile is next needed
        self.kmax = min(kmax, profile.kmax)
        self.candidates = list(candidates)
        self.models: tuple[Model, ...] = tuple(m for c in self.candidates for m in c.models)
        self.explore_every = explore_every
        self._report = AutoReport(rounds={m.name: 0 for m in REGISTRY if m.candidate or m.name == PLAIN.name},
                                  profile=profile.relative())
        self._pending: Optional[AcceptanceEstimate] = None
        # free guessers' unused guesses in plain rounds (estimate, guess, context length), scored once the
        # tokens they guessed have come
        self._shadows: list[tuple[AcceptanceEstimate, tuple[int, ...], int]] = []
        self._last_tried = {c.name: 0 for c in self.candidates}
        self._by_name = {c.name: c for c in self.candidates}
        self._round = 0
        self._last_choice: Optional[tuple[str, int]] = None
        # a free guesser's drafting round under way: the tokens and cost (in steps) it was chosen for, and
        # the tokens it gave once verified
        self._bet: Optional[_Bet] = None
        self.max_tokens = max_tokens
        self._prompt_len = 0
        # draft models that have not read the prompt (by candidate name), and those to read it before this round
        self._cold: dict[str, Candidate] = {}
        self._due: list[Candidate] = []
        # what other sequences put in the last decode (taken for what they will put in the next): a round in a
        # shared decode is weighed by the whole step's tokens per second
        self._beside: Beside = ALONE

    @property
    def profile(self) -> CostProfile:
        """The costs decided by: the profile, corrected by what real rounds cost."""
        if self._profile_stale and self.correction is not None:
            self._profile, self._profile_stale = self.correction.apply(self.base_profile), False
        return self._profile

    def prefill(self, context: np.ndarray) -> None:
        """A search notes where the prompt ends; a draft model reads it only once that pays (see ``deferred``),
        when it is called again with the context so far."""
        if self._due:  # the deferred reading: the engine's second call
            for c in self._due:
                c.drafter.prefill(context)
                self._cold.pop(c.name, None)
            self._due = []
            return
        if self.correction is not None:  # a generation starts: earlier generations' gains count less
            self.correction.new_generation()
        self._prompt_len, self._cold = len(context), {}
        for c in self.candidates:
            if isinstance(c.drafter, ModelDrafter) and not c.free:
                self._cold[c.name] = c
            else:
                c.drafter.prefill(context)

    def deferred(self, context: np.ndarray, k: int) -> bool:
        """Whether a draft model that has not read the context should now: when what it is predicted to save
        over the rest of the reply (as many tokens again as it has, at least ``MIN_HORIZON``, within
        ``max_tokens``) exceeds the reading's cost, estimated from its step and the target's batch curve. A
        prompt the prompt cache gave it costs almost nothing to finish; a 20k-token one on a CPU is never
        worth it for a short reply."""
        self._due = [c for c in self._cold.values() if self._reading_pays(c, context, min(k, self.kmax))]
        return bool(self._due)

    def _reading_pays(self, c: Candidate, context: np.ndarray, kmax: int) -> bool:
        profile = self.profile
        unread = max(len(context) - 1 - m.common_prefix(context[:-1]) for m in c.models)
        if unread <= kmax or not profile.draft_step:
            return True  # no more than a round's own catching up, or no cost known to weigh
        generated = len(context) - self._prompt_len
        horizon = max(generated, MIN_HORIZON)
        if self.max_tokens is not None:
            horizon = min(horizon, self.max_tokens - generated)
        alpha = min(c.ceiling, next(iter(c.estimates.values())).alpha)
        kk, speed = best_k(profile, c.method, alpha, kmax, min_gain=MIN_GAIN, beside=self._beside)
        if kk == 0 or horizon <= 0:
            return False
        per_token = profile.draft_step * profile.verify[-1] / (len(profile.verify) * profile.verify[0])
        return horizon * (1 - 1 / speed) * profile.verify[0] > unread * per_token

    def propose(self, context: np.ndarray, k: int, rng: np.random.Generator) -> Draft:
        """Choose a method and K for this round and return its draft (empty for plain)."""
        return self._propose(context, k, rng, None)

    def propose_guided(self, context: np.ndarray, k: int, rng: np.random.Generator, guide: DraftGuide) -> Draft:
        """As ``propose``, under a grammar: the free guesses are weighed by their part the grammar allows, a
        guess after forced tokens by what it adds to their batch, and a model drafts knowing the grammar."""
        return self._propose(context, k, rng, guide)

    def _propose(self, context: np.ndarray, k: int, rng: np.random.Generator, guide: Optional[DraftGuide]) -> Draft:
        self._round += 1
        self._bet = None
        self._score_shadows(context)
        forced = guide.forced if guide is not None else 0
        choices = self._choices(context, min(k, self.kmax), rng, guide)
        best = max(choices, key=lambda ch: ch.speed)  # plain on ties: it comes first
        if best.k and not forced and not self._beside.tokens:  # (a forced or shared batch is timed by its whole
            best = self._longer(best)  # size, not the guess's)
        if best.k == 0:  # nothing pays: plain, unless a method is due for a look
            best = self._explore(choices, forced) or PLAIN_CHOICE
        if best.method == PLAIN.name:
            self._pending = None
            for choice in choices:
                if choice.draft.tokens and choice.estimate is not None:  # the free guessers' guesses
                    unused = tuple(choice.draft.tokens[:SHADOW_K])
                    self._shadows = [*self._shadows[-(4 * SHADOW_K):], (choice.estimate, unused, len(context))]
            if not forced:  # a round of forced tokens alone is the grammar's, not a plain one
                self._note(best)
            return EMPTY_DRAFT
        self._last_tried[best.method] = self._round
        chosen = self._by_name[best.method]
        if best.draft.tokens:
            draft = Draft(best.draft.tokens[: best.k], None, best.method)
        elif guide is not None:
            draft = chosen.drafter.propose_guided(context, best.k, rng, guide)
        else:
            draft = chosen.drafter.propose(context, best.k, rng)
        if forced and not draft.tokens:  # the forced tokens go alone: the grammar's round, not this method's
            self._pending = None
            return draft
        self._note(best)
        self._pending = best.estimate
        if chosen.free and not forced:  # what a guesser's own rounds deliver (forced tokens would blur it)
            self._bet = _Bet(best.method, expected_tokens(best.alpha, best.k),
                             round_cost(self.profile, chosen.method, best.k) / self.profile.verify[0])
        return draft

    def _choices(self, context: np.ndarray, kmax: int, rng: np.random.Generator,
                 guide: Optional[DraftGuide]) -> list[Choice]:
        """Plain, and each candidate with something to offer at its best K and predicted speed."""
        choices = [PLAIN_CHOICE]
        if kmax <= 0:
            return choices
        forced = guide.forced if guide is not None else 0
        for c in self.candidates:
            if forced and isinstance(c.drafter, MtpDrafter):  # the head drafts only where the target has been
                continue
            if c.name in self._cold:  # a draft model that has not read the prompt (see ``deferred``)
                continue
            offer = c.offer(context, kmax, rng)
            if offer is None:
                continue
            est, guess = offer
            if guide is not None and guess.tokens:  # what the grammar refuses would be verified for nothing
                guess = guess.cut(guide.grammar.valid_prefix(guess.tokens))
                if not guess.tokens:
                    continue
            most = min(kmax, len(guess.tokens)) if c.free else kmax
            # what a free guesser's rounds have really delivered of their predictions raises its bar (a
            # model's rounds also pay its catch-up after plain rounds, which would mislead the measure)
            f = self.correction.gain_factor(c.name) if self.correction is not None and c.free else 1.0
            alpha = min(c.ceiling, est.alpha)
            kk, speed = best_k(self.profile, c.method, alpha, most, min_gain=MIN_GAIN / f, forced=forced,
                               beside=self._beside)
            choices.append(Choice(speed * f, c.name, kk, alpha, est, guess, f, most))
        return choices

    def _longer(self, best: Choice) -> Choice:
        """The chosen draft one token longer while rounds of that length are untimed, where the profile says it
        pays even so: a profile that overstates long batches is otherwise never corrected past the K it allows
        (the correction learns only the batch sizes it sees)."""
        if not 0 < best.k < best.most or not self._untimed(best.k + 2):
            return best
        longer = round_speedup(self.profile, self._by_name[best.method].method, best.alpha, best.k + 1,
                               beside=self._beside)
        if longer * best.factor < MIN_GAIN:
            return best
        return dataclasses.replace(best, speed=longer * best.factor, k=best.k + 1)

    def _untimed(self, n: int) -> bool:
        """Whether rounds verifying ``n`` tokens are yet to be timed often enough to trust their cost."""
        return self.correction is not None and self.correction.evidence(n) < COST_EVIDENCE

    def _score_shadows(self, context: np.ndarray) -> None:
        """Score each unused guess as the round it sat out would have scored it, once that is known: the
        guessed tokens that the output then really had, up to the first wrong one."""
        pending = []
        for est, guess, at in self._shadows:
            came = context[at: at + len(guess)]
            kept = next((i for i, t in enumerate(came) if int(t) != guess[i]), len(came))
            if kept < len(came) or len(came) == len(guess):  # a wrong token, or all of them came
                est.update(len(guess), kept)
            else:
                pending.append((est, guess, at))
        self._shadows = pending

    def _explore(self, choices: list[Choice], forced: int = 0) -> Optional[Choice]:
        """A cheap K=1 round of a method not tried for a while, if verifying two tokens has not really been
        timed yet (the profile may overstate it), or if a drafting model could pay were its acceptance higher.

        A free guesser is never explored for its acceptance: its guesses are scored in the plain rounds it
        sits out, at no cost, and on a machine where it cannot pay a look would only lose time.
        """
        untimed = self._untimed(2) and not self._beside.tokens  # a shared decode's rounds are never timed alone
        for c in choices[1:]:
            stale = self._round - self._last_tried[c.method] >= self.explore_every
            optimistic = untimed or (not self._by_name[c.method].free and
                                     best_k(self.profile, self._by_name[c.method].method,
                                            min(self._by_name[c.method].ceiling, c.alpha + 0.25),
                                            1, forced=forced, beside=self._beside)[1] > 1.0)
            if stale and optimistic:
                return Choice(c.speed, c.method, 1, c.alpha, c.estimate, c.draft)
        return None

    def observe_timing(self, timing: RoundTiming) -> None:
        """A round's real cost: into the evidence that corrects the profile decided by, and a drafting round's
        tokens and cost, in steps of the profile it was chosen by, into its method's realized gain."""
        bet, self._bet = self._bet, None
        self._beside = timing.beside
        if self.correction is None or timing.shared:  # a decode shared with other sequences: not its own cost
            return
        if bet is not None and bet.tokens:
            steps = (timing.verify_seconds + timing.draft_seconds + timing.rollback_seconds) / self.profile.verify[0]
            self.correction.observe_gain(bet.method, bet.predicted_tokens, bet.predicted_steps, bet.tokens, steps)
        self.correction.observe(timing)
        self._profile_stale = True  # folded in when read: a round with nothing on offer never reads the costs

    def observe(self, drafted: int, kept: int) -> None:
        """Feedback after verification: update the estimate of the method just used."""
        if self._pending is not None and drafted > 0:
            self._pending.update(drafted, kept)
        self._pending = None
        if self._bet is not None:
            self._bet.tokens = kept + 1

    def settle(self, context: np.ndarray) -> None:
        for c in self.candidates:
            c.drafter.settle(context)

    def report(self) -> AutoReport:
        """Rounds per method, the choices made and the estimates and costs they were made by, as they stand."""
        self._report.alpha = {name: a for c in self.candidates for name, a in c.alphas().items()}
        self._report.profile = self.profile.relative()
        return self._report

    def _note(self, choice: Choice) -> None:
        self._report.rounds[choice.method] = self._report.rounds.get(choice.method, 0) + 1
        if self._last_choice != (choice.method, choice.k):
            self._last_choice = (choice.method, choice.k)
            if len(self._report.changes) < 50:
                self._report.changes.append(AutoChange(self._round, choice.method, choice.k, round(choice.alpha, 3),
                                                       round(choice.speed, 3)))


def build_auto(ctx: DraftingContext, extra: Sequence[Candidate] = ()) -> AutoDrafter:
    """Method "auto": every registered method with a candidate that can take part in this generation.

    Args:
        extra: candidates to offer as well (the replay's recorded draft model).
    """
    if ctx.profile is None:
        raise ConfigError("Method 'auto' needs the machine's cost profile; build it through a Pair, or give one.")
    candidates = [c for m in REGISTRY if m.candidate is not None for c in [m.candidate(ctx)] if c is not None]
    return AutoDrafter(ctx.profile, [*candidates, *extra], kmax=ctx.k, correction=ctx.correction,
                       max_tokens=ctx.options.max_tokens)


REGISTRY.attach(AUTO.name, build=build_auto)
