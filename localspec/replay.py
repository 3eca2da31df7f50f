"""Replaying recorded generations offline: what auto, or the best possible schedule, would gain on a profile.

A workload recorded once by plain decoding (each request's prompt and greedy
reply) is replayed round by round through the real drafters and the real
auto policy: each round's draft is compared with the recorded reply, and the
round is charged what the cost model (``localspec.costs``) says it costs on
a given profile. So one recording predicts the speedup on any machine whose
costs are known, such as a GPU's, without running the models there. Greedy
acceptance does not depend on the hardware, so the prediction is exact up to
the machine's noise and the kernels' batch-shape rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .auto import auto_drafter, history_estimates
from .costs import CostProfile, round_cost
from .drafters import PromptLookupDrafter
from .history import PROMPT_KEEP, HistoryDrafter, HistoryIndex
from .methods import PLAIN
from .options import GenerationOptions


@dataclass
class Recorded:
    """One request as plain decoding answered it.

    Attributes:
        name: the request's name.
        text: the prompt text (auto reads it for its priors).
        prompt: the prompt's token ids.
        reply: the greedy reply's token ids.
    """

    name: str
    text: str
    prompt: list[int]
    reply: list[int]


def kept_prefix(draft: list[int], truth: list[int]) -> int:
    """How many of ``draft`` greedy verification keeps against the recorded ``truth``."""
    k = 0
    while k < len(draft) and k < len(truth) and draft[k] == truth[k]:
        k += 1
    return k


def replay_auto(profile: CostProfile, requests: list[Recorded], shared_history: bool) -> list[float]:
    """Predicted speedup of auto per request, with the earlier requests' history or an empty one."""
    index, estimates, out = HistoryIndex(), history_estimates(), []
    rng = np.random.default_rng(0)
    for req in requests:
        if not shared_history:
            index, estimates = HistoryIndex(), history_estimates()
        prompt, reply = req.prompt, req.reply
        auto = auto_drafter(profile, None, GenerationOptions(), req.text, np.asarray(prompt), history=index,
                            history_alpha=estimates)
        context, done, cost = list(prompt), 0, 0.0
        while done < len(reply):
            draft = auto.propose(np.asarray(context, dtype=np.int32), profile.kmax, rng)
            kept = kept_prefix(draft.tokens, reply[done:])
            auto.observe(len(draft.tokens), kept)
            cost += round_cost(profile, draft.by or PLAIN.name, len(draft.tokens))
            step = min(kept + 1, len(reply) - done)  # the kept prefix and the target's own token
            context += reply[done : done + step]
            done += step
            auto.settle(np.asarray(context, dtype=np.int32))
        out.append(len(reply) * profile.verify[0] / cost)
        index.add(np.asarray(prompt[-PROMPT_KEEP:] + reply, dtype=np.int32))
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
        best = [0.0] * (n + 1)  # best[i]: least cost to produce reply[i:]
        for i in range(n - 1, -1, -1):
            context = np.asarray(full[: len(prompt) + i], dtype=np.int32)
            cost = step + best[i + 1]
            for draft in (lookup.propose(context, kmax, rng), history.propose(context, kmax, rng)):
                kept = kept_prefix(draft.tokens, reply[i:])
                for k in range(1, len(draft.tokens) + 1):  # any shorter draft of the same guess
                    cost = min(cost, round_cost(profile, draft.by, k) + best[i + min(min(kept, k) + 1, n - i)])
            best[i] = cost
        out.append(n * step / best[0])
        index.add(np.asarray(prompt[-PROMPT_KEEP:] + reply, dtype=np.int32))
    return out
