"""What goes into a step: how the calls waiting on one context share its batch.

Streams (rounds being verified, tokens decoded) go first, whole; prompts being read fill what is left, beside
streams no more than a chunk, so that a short request keeps going while a long prompt is read. With the
measured cost of a step, a prompt whose reading would keep the requests beside it waiting longer than the
shortest of them has left waits for that one (``held``), taking only the tokens that lengthen the step by a
small share (``quiet``).
"""

from __future__ import annotations

from typing import Callable, Optional

from .joint_decode import DecodeCall

#: A prompt held back behind shorter requests still takes as many tokens as lengthen their step by at most
#: this share of it: none beside a lone stream on a CPU, where every token costs.
QUIET_SHARE = 0.1

#: A prompt waits for a shorter request only where the wait is at most this share of what its own request has
#: left (or where, held, it still ends no later than the requests beside it): see ``held``.
HOLD_SHARE = 0.1

#: Seconds one decode of n tokens takes (None: unknown).
StepCost = Optional[Callable[[int], float]]


def time_left(call: DecodeCall, base: int, cost: StepCost) -> float:
    """The seconds ``call``'s generation still expects to keep the steps: its ``steps_left`` at the cost of a
    step of its context's streams (``base`` tokens; no end without an estimate, or without the costs, or for a
    call of no generation)."""
    steps = call.model.steps_left
    if cost is None or steps is None:
        return float("inf")
    return steps * cost(max(1, base))


def plan(group: list[DecodeCall], streams: list[bool], base: int, ends: tuple[float, float], capacity: int,
         stream_chunk: Optional[int], cost: StepCost) -> tuple[list[tuple[DecodeCall, int]], set[int]]:
    """What one decode of ``group`` (calls on one context, the shortest first; ``streams``: which are streams;
    ``base``: the streams' tokens) takes: each call taken and how many of its tokens, and the indices of the
    prompts held back for shorter requests (``ends``: the least and the most time a generation decoding in the
    step has left).

    Beside streams, the prompts take no more than ``stream_chunk`` tokens in all, or as many as each stream
    read of its own prompt: a request waits per step at most about what reading its prompt took, so a short
    one beside a long prompt keeps going, and requests of like prompts sent together are read in a few large
    steps, at the batch's rate, not in many small ones.
    """
    read = [call.model.prompt_read for call, stream in zip(group, streams, strict=True) if stream]
    reading = max(stream_chunk, min(read)) if stream_chunk and read else capacity
    hold = held(group, streams, base, *ends, cost=cost)
    taken: list[tuple[DecodeCall, int]] = []
    n = 0
    quiet_left: Optional[int] = None  # what the held ones share: set once the others have their tokens
    for i in sorted(range(len(group)), key=lambda i: i in hold):  # the held ones take what room is left
        call, stream = group[i], streams[i]
        limit = call.m if stream else reading
        if i in hold:
            quiet_left = quiet(n, capacity, cost) if quiet_left is None else quiet_left
            limit = min(limit, quiet_left)
        take = min(call.m - call.done, capacity - n, limit)
        if take <= 0:
            continue
        taken.append((call, take))
        n += take
        reading -= 0 if stream else take
        quiet_left = None if quiet_left is None else quiet_left - take
    return taken, hold


def held(group: list[DecodeCall], streams: list[bool], base: int, shortest: float, longest: float = 0.0, *,
         cost: StepCost) -> set[int]:
    """The prompts being read (their indices in ``group``) that wait for a shorter request.

    Reading a prompt keeps every request decoding beside it waiting about as long as the reading takes;
    waiting keeps the prompt's request waiting as long as the shortest of those has left (``shortest``: the
    least time a generation decoding in the step has left; a prompt let in counts its reading and its
    ``steps_left``). The smaller wait wins, the shortest request first: a title request beside a long prompt
    is done before the long prompt is read, while a prompt shorter than the replies beside it is read at once
    and decodes with them.

    A wait must not make the whole later, though: a held request that then decodes alone ends after the
    others, where read beside them it would have shared their steps. So a prompt waits only where the wait is
    a small part (``HOLD_SHARE``) of what its own request has left, or where, held, its request still ends no
    later than the longest one beside it (``longest``): sub-agents of like size are read together, as
    llama-server reads them, and done when it is done. A prompt waits in all (``reading_waited``) no longer
    than its reading would have kept the others, so a line of short requests cannot hold it forever.
    """
    if cost is None:
        return set()
    step = cost(max(1, base))
    reads: dict[int, float] = {}  # what reading the rest of each prompt costs the step, in seconds
    owns: dict[int, float] = {}  # and what its request has left to do: that reading, then its reply
    for i, (call, stream) in enumerate(zip(group, streams, strict=True)):
        end, steps = call.model.reading_end, call.model.steps_left
        if stream or end is None:  # only a generation's prompt waits (not a replay inside a round)
            continue
        left = end - call.model.n_past - call.done  # the rest of its prompt, across calls
        reads[i] = cost(base + left) - (cost(base) if base else 0.0)
        owns[i] = reads[i] + (steps or 0) * step
    hold: set[int] = set()
    for i in sorted(owns, key=owns.__getitem__):  # the shortest request first, not the shortest call
        own = owns[i] if group[i].model.steps_left is not None else float("inf")  # no known end: long
        pays = shortest <= HOLD_SHARE * own or shortest + own <= longest
        if reads[i] > shortest and pays and group[i].model.reading_waited < reads[i]:
            hold.add(i)
        else:
            shortest, longest = min(shortest, owns[i]), max(longest, owns[i])
    return hold


def quiet(n: int, capacity: int, cost: StepCost) -> int:
    """The most tokens a step of ``n`` tokens takes on for the held prompts while lengthening by at most
    ``QUIET_SHARE`` (a bisection over the cost, which never falls as tokens are added)."""
    if cost is None or n == 0:
        return 0
    most, lo, hi = (1 + QUIET_SHARE) * cost(n), 0, capacity - n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if cost(n + mid) <= most else (lo, mid - 1)
    return lo
