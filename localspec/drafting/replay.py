"""Replaying recorded generations offline: what auto, or the best possible schedule, would gain on a profile.

A workload recorded once by plain decoding (each request's prompt and greedy
reply) is replayed round by round through the real drafters and the real
auto policy: each round's draft is compared with the recorded reply, and the
round is charged what the cost model (``localspec.drafting.costs``) says it costs on
a given profile. So one recording predicts the speedup on any machine whose
costs are known, such as a GPU's, without running the models there. Greedy
acceptance does not depend on the hardware, so the prediction is exact up to
the machine's noise and the kernels' batch-shape rounding.

The draft model's guesses are recorded too, once, by teacher forcing: its
greedy next token after every prefix of the reply (``Recorded.draft_next``).
Greedy verification keeps a draft up to its first disagreement with the
reply, and before that point the draft saw exactly the reply's tokens, so
this one pass tells how much of any draft of any length the target keeps.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..methods import AUTO_KMAX, DRAFT, HISTORY, LOOKUP, PLAIN
from ..options import GenerationOptions
from ..runtime.model import Model
from .auto import AutoDrafter, build_auto
from .candidates import drafting_model_candidate
from .costs import CostCorrection, CostProfile, RoundTiming, round_cost
from .drafters import Draft, Drafter, DraftingContext, PromptLookupDrafter
from .estimates import AcceptanceEstimate, history_estimates
from .history import PROMPT_KEEP, HistoryIndex
from .history.drafter import HistoryDrafter


@dataclass
class Recorded:
    """One request as plain decoding answered it.

    Attributes:
        name: the request's name.
        text: the prompt text (auto reads it for its priors).
        prompt: the prompt's token ids.
        reply: the greedy reply's token ids.
        draft_next: the draft model's greedy token after the prompt and each prefix of the reply
            (``reply[:i]`` for i in 0..len(reply)-1); None when no draft model was recorded.
        category: the kind of text (the bench suite's category), if any.
    """

    name: str
    text: str
    prompt: list[int]
    reply: list[int]
    draft_next: Optional[list[int]] = None
    category: str = ""


class RecordedDraft(Drafter):
    """The draft model as recorded for one request: what it would guess at each point of the reply."""

    name = DRAFT.name

    def __init__(self, req: Recorded):
        assert req.draft_next is not None and len(req.draft_next) == len(req.reply)
        self.req = req
        self.models: tuple[Model, ...] = ()

    def propose(self, context: np.ndarray, k: int, rng: np.random.Generator) -> Draft:
        """The draft's guess after ``context`` (a prefix of prompt + reply): its agreeing run, then its first
        disagreement, then filler to length ``k`` (verification never keeps a token past a disagreement)."""
        at = len(context) - len(self.req.prompt)
        reply, guess = self.req.reply, self.req.draft_next
        assert guess is not None and 0 <= at
        tokens: list[int] = []
        while len(tokens) < k and at + len(tokens) < len(reply):
            j = at + len(tokens)
            tokens.append(guess[j])
            if guess[j] != reply[j]:
                break
        return Draft(tokens + [tokens[-1] if tokens else 0] * (k - len(tokens)), None, DRAFT.name, k)  # k steps


def kept_prefix(draft: list[int], truth: list[int]) -> int:
    """How many of ``draft`` greedy verification keeps against the recorded ``truth``."""
    k = 0
    while k < len(draft) and k < len(truth) and draft[k] == truth[k]:
        k += 1
    return k


def _auto(profile: CostProfile, req: Recorded, index: HistoryIndex, estimates: dict[int, AcceptanceEstimate],
          kmax: int, correction: Optional[CostCorrection] = None) -> AutoDrafter:
    """Auto as a pair builds it, offered the recorded draft model as well when there is one."""
    ctx = DraftingContext(GenerationOptions(), kmax, np.asarray(req.prompt), lambda: req.text, None, index,
                          estimates, profile, correction)
    traced = drafting_model_candidate(ctx, RecordedDraft(req)) if req.draft_next is not None else None
    return build_auto(ctx, [traced] if traced else [])


def _fixed(method: str, req: Recorded, index: HistoryIndex) -> Drafter:
    """The drafter of one fixed method for one request."""
    if method == LOOKUP.name:
        return PromptLookupDrafter()
    if method == HISTORY.name:
        return HistoryDrafter(index)
    if method == DRAFT.name:
        return RecordedDraft(req)
    raise ValueError(f"the replay has no drafter for method {method!r}")


@dataclass(frozen=True)
class Round:
    """One replayed round: who drafted (empty: plain decoding), how many tokens, how many the target kept."""

    by: str
    drafted: int
    kept: int


def replay_rounds(req: Recorded, drafter: Drafter, k: int, profile: Optional[CostProfile] = None) -> list[Round]:
    """The rounds of one request drafted by ``drafter`` with (at most) ``k`` tokens, against its recorded reply.

    As in the engine, the reply's first token comes with the prompt's prefill, and rounds begin after it; the
    drafter hears each draft's outcome, and with ``profile`` each round's timing as the profile prices it
    (verification, draft-model steps and a checkpoint's saving; the searches are left out, as the engine leaves
    them out of a round's timing).
    """
    prompt, reply = req.prompt, req.reply
    rng = np.random.default_rng(0)
    context, done, rounds = list(prompt) + reply[:1], min(1, len(reply)), []
    drafter.prefill(np.asarray(prompt, dtype=np.int32))
    while done < len(reply):
        if drafter.deferred(np.asarray(context, dtype=np.int32), k):  # as the engine: a reading put off, now due
            drafter.prefill(np.asarray(context, dtype=np.int32))
        draft = drafter.propose(np.asarray(context, dtype=np.int32), k, rng)
        drafted = len(draft.tokens)
        kept = kept_prefix(draft.tokens, reply[done:])
        if drafted:  # as the engine: an empty draft has no outcome
            drafter.observe(drafted, kept)
        if profile is not None:  # what the engine would have timed, by the profile's costs
            drafter.observe_timing(RoundTiming(drafted + 1, profile.verify_seconds(drafted + 1), draft.model_steps,
                                               draft.model_steps * profile.draft_step,
                                               profile.rollback if drafted else 0.0))
        rounds.append(Round(draft.by if drafted else "", drafted, kept))
        step = min(kept + 1, len(reply) - done)  # the kept prefix and the target's own token
        context += reply[done : done + step]
        done += step
        drafter.settle(np.asarray(context, dtype=np.int32))
    return rounds


@dataclass(frozen=True)
class Overhead:
    """Seconds per round outside llama.cpp (Python, numpy, copying logits): a plain step's and a drafted round's.

    Where a step takes milliseconds (a GPU), this is no longer negligible.
    """

    plain: float = 0.0
    drafted: float = 0.0


def _replay_one(profile: CostProfile, req: Recorded, drafter: Drafter, k: int, overhead: Overhead) -> float:
    """Predicted speedup over plain decoding of one request drafted by ``drafter`` with (at most) ``k``."""
    rounds = replay_rounds(req, drafter, k, profile)
    if not rounds:  # a reply of one token: all of it came with the prefill
        return 1.0
    cost = sum(round_cost(profile, r.by or PLAIN.name, r.drafted) + (overhead.drafted if r.by else overhead.plain)
               for r in rounds)
    return (len(req.reply) - 1) * (profile.verify[0] + overhead.plain) / cost  # decode, after the prefill's token


def replay_auto(profile: CostProfile, requests: list[Recorded], shared_history: bool,
                kmax: int = AUTO_KMAX, overhead: Overhead = Overhead(),
                correction: Optional[CostCorrection] = None) -> list[float]:
    """Predicted speedup of auto per request, with the earlier requests' history or an empty one.

    Args:
        kmax: the longest draft auto may choose (a pair's auto uses ``AUTO_KMAX``).
        overhead: time per round outside llama.cpp, charged to plain decoding and to every round.
        correction: what auto learns from its rounds' costs and realized gains, kept across the requests as a
            pair keeps it (and by the caller, for a next pass); None: auto decides by the profile alone, as
            with a seeded sampled generation (no cost evidence, no realized-gain bets, no exploration for it).
    """
    index, estimates, out = HistoryIndex(), history_estimates(), []
    for req in requests:
        if not shared_history:
            index, estimates = HistoryIndex(), history_estimates()
        auto = _auto(profile, req, index, estimates, kmax, correction)
        out.append(_replay_one(profile, req, auto, kmax, overhead))
        index.add(np.asarray(req.prompt[-PROMPT_KEEP:] + req.reply, dtype=np.int32))
    return out


def replay_auto_median(profile: CostProfile, requests: list[Recorded], passes: int = 3,
                       correction: Optional[CostCorrection] = None) -> list[float]:
    """Auto's predicted speedup per request (empty histories), the median of ``passes`` passes over the requests
    with one cost correction kept across them all, as a pair keeps it through a bench (so what auto learns from
    its rounds' costs and gains counts as it does for a user; the first pass, with nothing learnt, included).

    Args:
        correction: the one to keep (and leave as the passes left it); None: a new one.
    """
    correction = correction if correction is not None else CostCorrection()
    runs = [replay_auto(profile, requests, False, correction=correction) for _ in range(passes)]
    return [statistics.median(run[i] for run in runs) for i in range(len(requests))]


def auto_rounds(profile: CostProfile, req: Recorded, kmax: int = AUTO_KMAX,
                correction: Optional[CostCorrection] = None) -> list[Round]:
    """The rounds auto runs on one request with an empty history, as ``replay_auto`` replays it: what it
    chose round by round, to see where a prediction is won or lost."""
    auto = _auto(profile, req, HistoryIndex(), history_estimates(), kmax, correction)
    return replay_rounds(req, auto, kmax, profile)


def replay_method(profile: CostProfile, requests: list[Recorded], method: str, k: int,
                  overhead: Overhead = Overhead()) -> list[float]:
    """Predicted speedup per request of one fixed method and draft length (history: of the earlier requests).

    Raises:
        ValueError: a method the replay cannot draft for, or the draft model when it was not recorded.
    """
    if method == DRAFT.name and any(r.draft_next is None for r in requests):
        raise ValueError("these recordings have no draft-model guesses; record them with a draft model")
    index, out = HistoryIndex(), []
    for req in requests:
        out.append(_replay_one(profile, req, _fixed(method, req, index), k, overhead))
        index.add(np.asarray(req.prompt[-PROMPT_KEEP:] + req.reply, dtype=np.int32))
    return out


def bound(profile: CostProfile, requests: list[Recorded]) -> list[float]:
    """The best any policy could do with these lookup and history drafts (with the earlier requests' history)."""
    index, out = HistoryIndex(), []
    rng = np.random.default_rng(0)
    step, kmax = profile.verify[0], profile.kmax
    for req in requests:
        prompt, reply = req.prompt, req.reply
        n, full = len(reply), prompt + reply
        lookup, history = PromptLookupDrafter(), HistoryDrafter(index)
        best = [0.0] * (n + 1)  # best[i]: least cost to produce reply[i:]; reply[0] comes with the prefill
        for i in range(n - 1, 0, -1):
            context = np.asarray(full[: len(prompt) + i], dtype=np.int32)
            cost = step + best[i + 1]
            for draft in (lookup.propose(context, kmax, rng), history.propose(context, kmax, rng)):
                kept = kept_prefix(draft.tokens, reply[i:])
                for k in range(1, len(draft.tokens) + 1):  # any shorter draft of the same guess
                    cost = min(cost, round_cost(profile, draft.by, k) + best[i + min(min(kept, k) + 1, n - i)])
            best[i] = cost
        out.append((n - 1) * step / best[1] if n > 1 else 1.0)  # decode after the prefill's token, as the engine
        index.add(np.asarray(prompt[-PROMPT_KEEP:] + reply, dtype=np.int32))
    return out
