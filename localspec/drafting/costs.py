"""The cost model: what a round of each method costs on a machine, and what it yields.

Pure arithmetic over a ``CostProfile`` (the machine's measured costs, see
``localspec.drafting.calibration``), shared by auto's per-round choice, the bench's
predictions and the replay of recorded workloads, so that there is one
model and no copies:

* with per-token acceptance alpha and draft length K, a round yields on
  average (1 - alpha^(K+1)) / (1 - alpha) tokens (the accepted prefix plus the
  target's own token);
* it costs verify(K+1) plus K draft-model steps (the draft model), K head
  steps (an MTP head) or one search (lookup, history), plus, on a recurrent
  memory that cannot roll back, a checkpoint; plain decoding yields 1 token
  per verify(1).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from ..methods import REGISTRY, Method

#: Speculate only when the predicted speedup clears this, so estimation noise cannot make auto slower than plain.
MIN_GAIN = 1.1

#: How many rounds the prediction itself counts for in a method's realized-gain factor, and how many rounds of
#: evidence a new generation carries over (each new generation halves it too, so the prior weighs more and more
#: and a method ruled out comes back within a few generations).
GAIN_PRIOR_ROUNDS = 3.0
GAIN_CARRY_ROUNDS = 24.0


@dataclass
class CostProfile:
    """Measured (or assumed) costs, in seconds.

    Attributes:
        verify: verify[n - 1] is the target's time to evaluate n tokens with
            logits for all of them, n = 1 .. kmax + 1.
        draft_step: the draft model's time for one token (0 without a draft).
        lookup: the prompt-lookup search time per round.
        source: "measured", "cache" or a name for a synthetic profile.
        mtp_step: the target's MTP head's time for one token (0: not measured, or no head).
        rollback: what a drafting round pays for a memory that cannot cut its rejected tokens off:
            saving a checkpoint, restoring it and evaluating one token again (0 for an attention cache,
            or a recurrent state whose rollback covers the longest draft).
    """

    verify: list[float]
    draft_step: float = 0.0
    lookup: float = 2e-5
    source: str = "measured"
    mtp_step: float = 0.0
    rollback: float = 0.0
    #: together[s - 1]: one decode of one token from each of s sequences (empty: not measured, taken to cost
    #: what one sequence of s tokens costs); only its shape counts, together[s - 1] / together[0].
    together: list[float] = field(default_factory=list)

    @property
    def kmax(self) -> int:
        return len(self.verify) - 1

    def verify_seconds(self, n: int) -> float:
        """Seconds to verify n tokens; past the measured range, the last step's slope continues."""
        v = self.verify
        if n <= len(v):
            return v[n - 1]
        return v[-1] + (n - len(v)) * (v[-1] - v[-2] if len(v) > 1 else v[-1])

    def reading_seconds(self, n: int) -> float:
        """Seconds for one decode of n tokens, for weighing a prompt's reading: the curve (never falling as
        tokens are added) and past its end the whole curve's mean slope, which a noisy last step does not
        flatten."""
        v = list(itertools.accumulate(self.verify, max))
        if n <= len(v):
            return float(v[max(n, 1) - 1])
        return float(v[-1] + (n - len(v)) * _mean_slope(v))

    def step_seconds(self, tokens: int, sequences: int) -> float:
        """Seconds for one decode of ``tokens`` tokens from ``sequences`` sequences: verify(tokens), times what
        ``together`` measured several sequences to cost over one sequence of as many tokens."""
        seconds = self.verify_seconds(tokens)
        s = min(sequences, len(self.together))
        if s > 1:  # shapes, each over its own single step: they may be timed on different threads
            seconds *= max(1.0, (self.together[s - 1] / self.together[0]) / (self.verify_seconds(s) / self.verify[0]))
        return seconds

    def relative(self) -> dict[str, object]:
        """Costs relative to one target step (what decides everything)."""
        v1 = self.verify[0]
        out: dict[str, object] = {"verify": [round(v / v1, 3) for v in self.verify],
                                  "draft_step": round(self.draft_step / v1, 3)}
        for name in ("mtp_step", "rollback"):  # only where the models have them
            if getattr(self, name):
                out[name] = round(getattr(self, name) / v1, 3)
        if self.together:  # over its own single sequence's step
            out["together"] = [round(v / self.together[0], 3) for v in self.together]
        return out

    @classmethod
    def synthetic(cls, verify_ratios: list[float], draft_ratio: float, step: float = 0.02,
                  name: str = "synthetic") -> CostProfile:
        """A profile from ratios to one target step, e.g. a GPU-like flat verify curve."""
        return cls([r * step for r in verify_ratios], draft_ratio * step, 2e-5, name)


@dataclass(frozen=True)
class Beside:
    """What other sequences put in the decode a round shares with them (``serve --parallel``,
    ``Pair.generate_many``): their tokens, and how many of them are streams decoding (each giving a token or
    more per step) rather than prompts being read (giving none), of how many sequences."""

    tokens: int = 0
    streams: int = 0
    sequences: int = 0


#: A round decoded alone.
ALONE = Beside()


@dataclass
class RoundTiming:
    """What one round really cost: the target's time to verify n tokens (the profile's ``verify``), the draft
    model's steps, and the checkpoint a memory that cannot cut its rejected tokens off saved first (the
    profile's ``rollback``)."""

    n: int
    verify_seconds: float
    draft_steps: int = 0
    draft_seconds: float = 0.0
    rollback_seconds: float = 0.0
    #: The other sequences' tokens in the decode that verified it (its time is then not this round's alone).
    beside: Beside = ALONE

    @property
    def shared(self) -> bool:
        return self.beside.tokens > 0


@dataclass
class CostCorrection:
    """What real rounds have shown about a cost profile, kept as evidence and applied to it.

    A calibration can be wrong (taken while the machine was busy, or before it
    changed): every round's real cost corrects it. For each batch size n the
    ratio of the observed times to the profile's is averaged with the ratio the
    smaller n suggest, which counts as ``prior_weight`` rounds. An n never observed
    is scaled by the ratio (observed over profile) interpolated between the
    observed n around it, taking 1 at n = 1 until single steps are observed
    and the last observed ratio beyond the largest: so one dear round of 9
    tokens makes every long draft dear, not every step. Old evidence fades by
    ``decay`` per observation of the same n, so the correction follows a
    machine whose load changes. The draft step is corrected the same way.

    Args:
        prior_weight: how many rounds the profile's own figure counts for.
        decay: how much an observation's weight fades at each later one of the same n.
    """

    prior_weight: float = 2.0
    decay: float = 0.98
    _sums: dict[int, float] = field(default_factory=dict)
    _counts: dict[int, float] = field(default_factory=dict)
    _draft: list[float] = field(default_factory=lambda: [0.0, 0.0])  # seconds, steps
    # by method: rounds, and the sums of their realized over predicted speeds and of its square (all faded)
    _gains: dict[str, list[float]] = field(default_factory=dict)
    # generations decoded together (``Pair.generate_many``, ``serve --parallel``) share one correction
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    def observe_gain(self, method: str, predicted_tokens: float, predicted_steps: float, tokens: int,
                     steps: float) -> None:
        """One drafting round of ``method``, judged against what it was chosen for.

        Args:
            method: the method's name.
            predicted_tokens: the tokens the round was expected to give.
            predicted_steps: its expected cost, in target steps.
            tokens: the tokens it gave (the kept draft and the target's own).
            steps: what it cost, in target steps.
        """
        if predicted_tokens <= 0 or predicted_steps <= 0 or steps <= 0:
            return
        x = (tokens / steps) / (predicted_tokens / predicted_steps)
        with self._lock:
            g = self._gains.setdefault(method, [0.0, 0.0, 0.0])
            for i, v in enumerate((1.0, x, x * x)):
                g[i] = g[i] * self.decay + v

    def gain_factor(self, method: str) -> float:
        """How much of its predicted speed ``method``'s rounds have clearly delivered: 1 unless they have
        delivered less beyond doubt, at least 0.5.

        Each round's realized speed over its predicted one is averaged, with ``GAIN_PRIOR_ROUNDS`` rounds
        as predicted, and the factor is that mean plus two standard errors: a few unlucky rounds, or the
        small shortfall that choosing a method when its estimate is high always brings, change nothing;
        a method that keeps delivering much less than it was chosen for is held to a higher bar. What it
        judges is the acceptance estimate and the verification's cost, as llama.cpp spent it.
        """
        g = list(self._gains.get(method) or [])
        if not g or g[0] <= 0:
            return 1.0
        n = g[0] + GAIN_PRIOR_ROUNDS
        mean = (g[1] + GAIN_PRIOR_ROUNDS) / n
        var = max(0.0, (g[2] + GAIN_PRIOR_ROUNDS) / n - mean * mean)
        return min(1.0, max(0.5, mean + 2 * (var / n) ** 0.5))

    def new_generation(self) -> None:
        """A new generation starts: the realized-gain evidence counts half, and for at most
        ``GAIN_CARRY_ROUNDS`` rounds."""
        with self._lock:
            for g in self._gains.values():
                keep = min(0.5, GAIN_CARRY_ROUNDS / g[0]) if g[0] > 0 else 0.0
                g[:] = [v * keep for v in g]

    def observe(self, timing: RoundTiming) -> None:
        """Add one round's real costs."""
        n = timing.n
        with self._lock:
            self._sums[n] = self._sums.get(n, 0.0) * self.decay + timing.verify_seconds
            self._counts[n] = self._counts.get(n, 0.0) * self.decay + 1.0
            if timing.draft_steps:
                self._draft[0] = self._draft[0] * self.decay + timing.draft_seconds
                self._draft[1] = self._draft[1] * self.decay + timing.draft_steps

    def evidence(self, n: int) -> float:
        """How many (faded) rounds of n tokens have been observed."""
        return self._counts.get(n, 0.0)

    def disagreement(self, profile: CostProfile, evidence: float = 8.0, tolerance: float = 0.25,
                     floor: float = 0.001) -> Optional[tuple[int, float]]:
        """Where real rounds consistently contradict the profile's shape: (n, observed verify(n)/verify(1)
        over the profile's), the worst one off by more than ``tolerance``; None if there is none.

        Only the shape counts (a machine uniformly slower now changes no choice), only n seen in at
        least ``evidence`` rounds next to single steps, and only steps over ``floor`` seconds.
        """
        with self._lock:
            return self._disagreement(profile, evidence, tolerance, floor)

    def _disagreement(self, profile: CostProfile, evidence: float, tolerance: float,
                      floor: float) -> Optional[tuple[int, float]]:
        if self.evidence(1) < evidence or profile.verify[0] <= floor:
            return None
        step = self._sums[1] / self._counts[1]
        worst: Optional[tuple[int, float]] = None
        for n in range(2, len(profile.verify) + 1):
            if self.evidence(n) >= evidence:
                shape = (self._sums[n] / self._counts[n] / step) / (profile.verify[n - 1] / profile.verify[0])
                if abs(shape - 1) > tolerance and (worst is None or abs(shape - 1) > abs(worst[1] - 1)):
                    worst = (n, shape)
        return worst

    def apply(self, profile: CostProfile) -> CostProfile:
        """``profile`` with the evidence folded in (the profile itself when there is none)."""
        with self._lock:
            return self._apply(profile)

    def _apply(self, profile: CostProfile) -> CostProfile:
        if not self._counts and not self._draft[1]:
            return profile
        w = self.prior_weight
        size = len(profile.verify)
        # (n, observed over the profile's) at each observed n, in order; 1 at n = 1 until single steps are observed
        points = [(1, 1.0)]
        for n in sorted(m for m in self._counts if 1 <= m <= size):
            # Shrunk toward what the smaller n already say (1, the profile, before any), not toward the
            # profile itself: one cheap round of n tokens then moves n as far as its neighbours did.
            ratio = (self._sums[n] / profile.verify[n - 1] + w * points[-1][1]) / (self._counts[n] + w)
            if n == 1:
                points[0] = (1, ratio)
            else:
                points.append((n, ratio))
        verify = [v * r for v, r in zip(profile.verify, _interpolated(points, size), strict=True)]
        for i in range(1, len(verify)):  # verifying more tokens never costs less
            verify[i] = max(verify[i], verify[i - 1])
        seconds, steps = self._draft
        draft_step = (seconds + w * profile.draft_step) / (steps + w) if steps else profile.draft_step
        return dataclasses.replace(profile, verify=verify, draft_step=draft_step, source=f"{profile.source}, corrected")


def _interpolated(points: list[tuple[int, float]], size: int) -> list[float]:
    """The ratio at n = 1 .. size: observed at the ``points`` (n ascending, the first at n = 1), linear
    between them, the last one beyond them."""
    out, j = [], 0
    for n in range(1, size + 1):
        while j + 1 < len(points) and points[j + 1][0] <= n:
            j += 1
        lo_n, lo = points[j]
        if n == lo_n or j + 1 == len(points):
            out.append(lo)
        else:
            hi_n, hi = points[j + 1]
            out.append(lo + (n - lo_n) / (hi_n - lo_n) * (hi - lo))
    return out


#: A step that holds a stream (a generation decoding) beside a prompt being read should cost at most about this
#: many single steps: the prompt's share of it is sized from the verification curve (see ``prompt_chunk``).
STREAM_STEP_BUDGET = 32

#: The fewest prompt tokens a step beside streams takes, however steep the curve.
MIN_PROMPT_CHUNK = 32


def _mean_slope(v: list[float]) -> float:
    """The seconds a token adds along the whole verification curve ``v`` (its first step's, for one point)."""
    return (v[-1] - v[0]) / (len(v) - 1) if len(v) > 1 else v[0]


def prompt_chunk(profile: CostProfile, budget: float = STREAM_STEP_BUDGET) -> int:
    """The most prompt tokens to read in a step that also decodes other generations' tokens: as many as
    verifying costs within ``budget`` single steps (the curve's mean slope continued past its end). On a CPU,
    where cost grows with every token, a few dozen, so a stream beside a long prompt keeps going and a short
    request starts within a step; on a GPU's flat curve, thousands (a context's whole batch)."""
    v = profile.verify
    slope = _mean_slope(v)  # the whole curve's: the last step is noisy
    if slope <= 0:
        return 1 << 20
    return max(MIN_PROMPT_CHUNK, len(v) + int((budget * v[0] - v[-1]) / slope))


def expected_tokens(alpha: float, k: int) -> float:
    """Mean tokens per round with per-token acceptance alpha and draft length k."""
    if k == 0:
        return 1.0
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def round_cost(profile: CostProfile, method: Union[Method, str], k: int, forced: int = 0,
               beside: Beside = ALONE) -> float:
    """Seconds for one round of ``method`` (or the registered method of that name) with draft length k
    (k = 0: one plain step), after ``forced`` tokens a grammar forced, verified in the same batch, and
    with the ``beside`` tokens of other sequences in the same decode (the whole step: every one waits)."""
    m = REGISTRY.get(method) if isinstance(method, str) else method
    if not k and not forced:
        cost = profile.verify[0]
    else:
        cost = (m.round_cost(profile, k) if k else profile.verify[0]) + profile.rollback
    extra = forced + beside.tokens
    if extra:  # the guess is verified after the forced tokens, beside the others': the batch is that much larger
        cost += (profile.step_seconds(extra + k + 1, 1 + beside.sequences)
                 - profile.verify_seconds(k + 1))
    return cost


def best_k(profile: CostProfile, method: Union[Method, str], alpha: float, kmax: int,
           min_gain: float = MIN_GAIN, forced: int = 0, beside: Beside = ALONE) -> tuple[int, float]:
    """The draft length with the highest expected tokens/second, and that speedup over a round that guesses
    nothing (plain, or with ``forced`` tokens a grammar forced: the guess is verified after them).

    With other sequences ``beside`` in the decode, the speed is the whole step's: their tokens (one per stream)
    and this round's over the step's cost, so that drafting pays only where the batch has compute to spare
    (on a CPU, a full batch drafts less; beside a prompt being read, a guess is almost free).

    K = 0 (speedup 1.0) unless some K is predicted at least ``min_gain`` times faster.
    """
    bare = _bare_speed(profile, method, forced, beside)  # once, not per K: this runs every round
    best, best_speed = 0, 1.0
    for k in range(1, min(kmax, profile.kmax) + 1):
        speed = _round_speed(profile, method, alpha, k, forced, beside) / bare
        if speed > best_speed and speed >= min_gain:
            best, best_speed = k, speed
    return best, best_speed


def round_speedup(profile: CostProfile, method: Union[Method, str], alpha: float, k: int, forced: int = 0,
                  beside: Beside = ALONE) -> float:
    """The expected tokens/second of a round drafting ``k`` tokens over one that guesses nothing (plain, or
    the ``forced`` tokens alone), as ``best_k`` weighs each K."""
    return _round_speed(profile, method, alpha, k, forced, beside) / _bare_speed(profile, method, forced, beside)


def _round_speed(profile: CostProfile, method: Union[Method, str], alpha: float, k: int, forced: int,
                 beside: Beside) -> float:
    """Expected tokens per second of a step whose round drafts ``k`` tokens after the ``forced`` ones."""
    return (beside.streams + forced + expected_tokens(alpha, k)) / round_cost(profile, method, k, forced, beside)


def _bare_speed(profile: CostProfile, method: Union[Method, str], forced: int, beside: Beside) -> float:
    """Tokens per second of a step whose round guesses nothing (plain, or the ``forced`` tokens alone)."""
    return (beside.streams + forced + 1) / round_cost(profile, method, 0, forced, beside)


def predicted_speedup(profile: CostProfile, method: str, stats: dict[str, Any]) -> Optional[float]:
    """Speedup the cost model predicts from this run's measured acceptance (None for plain, auto and peers)."""
    m = REGISTRY.find(method)
    if m is None or m.build is None or m.adaptive or not stats["rounds"]:
        return None
    proposing = stats["rounds"] - stats["empty_rounds"]
    if proposing <= 0:
        return 1.0
    alpha = stats["accepted"] / max(1e-9, stats["accepted"] + stats["rejected_rounds"])
    k = max(1, min(profile.kmax, round(stats["drafted"] / proposing)))
    f = proposing / stats["rounds"]  # lookup proposes only when it finds a match
    tokens = f * expected_tokens(alpha, k) + (1 - f)
    cost = f * round_cost(profile, method, k) + (1 - f) * profile.verify[0]
    return tokens / cost * profile.verify[0]


def predicted_round_seconds(profile: CostProfile, stats: dict[str, Any]) -> float:
    """Decode seconds the profile predicts for a run's rounds: verify(drafted + 1) each, plus draft-model steps."""
    counts = list(stats["proposed_at"]) + [0]
    total = stats["empty_rounds"] * profile.verify[0]
    for j in range(1, len(counts)):
        rounds = counts[j - 1] - counts[j]  # rounds that drafted exactly j tokens
        total += rounds * profile.verify_seconds(j + 1)
    return total + stats.get("draft_model_tokens", 0) * profile.draft_step
