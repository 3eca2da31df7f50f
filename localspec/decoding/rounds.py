"""One speculative round: draft, verify in one pass of the target, accept a prefix, cut the target back.

A round:

1. draft    - the drafter proposes up to K tokens after the context;
2. verify   - the target evaluates [last token] + draft in one pass, getting
              K + 1 logits rows;
3. accept   - greedy or sampled acceptance keeps a prefix of the draft and
              picks the next token (a correction, or a bonus if all passed);
4. truncate - the target's cache is cut back to the context it accepted
              (the draft model's cache follows at its next proposal).

The target's cache always holds the context minus its last token, whose
logits come out of the next verification. A plain step is a round with an
empty draft, so the baseline pays exactly the same overheads.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import numpy as np

from ..drafting.costs import Beside, RoundTiming
from ..drafting.drafters import EMPTY_DRAFT, Draft, Drafter, DraftGuide
from ..events import SOURCE_BONUS, SOURCE_CORRECTION, SOURCE_DRAFT, SOURCE_GRAMMAR, SOURCE_TARGET
from ..options import SamplingParams
from ..runtime.model import Model
from ..sampling.acceptance import ProbRows, accept_greedy, accept_sampled
from ..sampling.processors import Processing
from ..structured.grammar import GrammarState


class Emitted(NamedTuple):
    """A token a round adds: where it came from, and for an accepted drafted token its drafter and position."""

    token: int
    source: str
    drafter: str = ""
    position: int = -1  # its place in the draft; -1 for the target's own token


class Round(NamedTuple):
    """What one round decided.

    Attributes:
        draft: the tokens proposed (cut after the first id the target lacks).
        kept: how many of them the target accepted.
        next_token: the target's own token after the kept ones.
        timing: what it cost in llama.cpp: the target's verification and the drafter's models.
        rows: when asked for, the processed logits row each emitted token was chosen from (kept + 1 rows).
    """

    draft: Draft
    kept: int
    next_token: int
    timing: RoundTiming
    rows: Optional[np.ndarray] = None

    def emitted(self) -> list[Emitted]:
        """The tokens the round adds, in order: the kept draft, then the target's own token."""
        d = self.draft
        tail = SOURCE_TARGET if not d.tokens else SOURCE_BONUS if self.kept == len(d.tokens) else SOURCE_CORRECTION
        kept = [Emitted(t, SOURCE_DRAFT, SOURCE_GRAMMAR if i < d.forced else d.by, i)
                for i, t in enumerate(d.tokens[: self.kept])]
        return kept + [Emitted(self.next_token, tail)]


def speculative_round(
    target: Model,
    drafter: Optional[Drafter],
    context: np.ndarray,
    k: int,
    params: SamplingParams,
    rng: np.random.Generator,
    matcher: Optional[GrammarState] = None,
    processing: Optional[Processing] = None,
    prompt_len: int = 0,
    keep_rows: bool = False,
) -> Round:
    """One round: draft, verify, accept, truncate.

    Args:
        target: holds ``context`` minus its last token on entry, and
            ``context`` plus the kept draft tokens on return.
        drafter: None for a plain step.
        context: prompt and generated tokens so far.
        k: the most tokens to draft.
        params: the target's sampling parameters (greedy or sampled acceptance).
        rng: the source of randomness for the drafter and sampled acceptance.
        matcher: the grammar the output follows (None: none); it is advanced past the round's tokens.
        processing: the logit bias and penalties, applied to every row before the grammar's mask.
        prompt_len: where the generated tokens start in ``context`` (what the penalties look at).
        keep_rows: return the rows the emitted tokens were chosen from (for their log-probabilities).
    """
    n = len(context)
    draft, known, drafting = draft_round(target, drafter, context, k, rng, matcher)
    verify_started = target.busy_seconds
    rows, consumed, saving = verify(target, context, draft.tokens[:known], matcher, processing, prompt_len)
    # 3. accept: a rejection at the unknown id resamples from the residual, never from p.
    if params.greedy:
        kept, nxt = accept_greedy(draft.tokens, rows)
    else:
        kept, nxt = accept_sampled(draft.tokens, draft.probs, ProbRows(rows, params), rng)
    if matcher is not None and kept <= consumed:  # back to the kept tokens, then past the target's own
        matcher.rollback(consumed - kept)
        if not target.is_eog(nxt):  # an end token (kept or the target's) ends the generation and the grammar
            matcher.consume([nxt])
    kept_rows = np.array(rows[: kept + 1], dtype=np.float32) if keep_rows else None  # before the buffer is reused
    # 4. truncate: keep the context and the accepted draft tokens; the rejected tail goes (from a
    # checkpoint, the kept ones are evaluated again: that time counts as verifying).
    target.truncate(n + kept)
    verifying = target.busy_seconds - verify_started - saving
    timing = RoundTiming(known + 1, verifying, draft.model_steps, drafting, saving, Beside(*target.beside))
    if drafter is not None:
        learn(drafter, draft, kept, timing)
    return Round(draft, kept, nxt, timing, kept_rows)


def draft_round(target: Model, drafter: Optional[Drafter], context: np.ndarray, k: int, rng: np.random.Generator,
                matcher: Optional[GrammarState]) -> tuple[Draft, int, float]:
    """Step 1: the round's draft, how many of its tokens the target can verify, and the drafter's llama.cpp
    seconds.

    The draft ends after the first token the target cannot take, which is verified as a certain rejection.
    """
    if drafter is None or k <= 0:  # a plain step
        return EMPTY_DRAFT, 0, 0.0
    helpers = drafter.models
    drafting_started = sum(m.busy_seconds for m in helpers)
    # tokens the grammar forces cost nothing to guess; the drafter guesses after them
    draft = propose(drafter, context, k, rng, matcher, target.is_eog)
    drafting = sum(m.busy_seconds for m in helpers) - drafting_started
    if target.sees_images:  # an image's placeholders are never guessed (lookup could copy them): cut before one
        image = next((i for i, t in enumerate(draft.tokens) if t < 0), None)
        if image is not None:
            draft = draft.cut(image)
    if matcher is not None:  # nothing after an end token is ever emitted, nor known to the grammar
        end = next((i for i, t in enumerate(draft.tokens) if target.is_eog(t)), None)
        if end is not None:
            draft = draft.cut(end + 1)
    # A padded draft vocabulary can propose an id the target lacks, and a drafter a token the grammar
    # refuses: it is verified as a certain rejection (p = 0) and nothing after it can be kept, so the
    # draft ends there.
    known = next((i for i, t in enumerate(draft.tokens) if t >= target.n_vocab), len(draft.tokens))
    if matcher is not None:
        known = min(known, matcher.valid_prefix(draft.tokens[:known]))
    return draft.cut(known + 1), known, drafting


def verify(target: Model, context: np.ndarray, tokens: list[int], matcher: Optional[GrammarState],
           processing: Optional[Processing], prompt_len: int) -> tuple[np.ndarray, int, float]:
    """Step 2: the target's rows after the context and each prefix of ``tokens`` (processed and masked as plain
    decoding would), how many of ``tokens`` the matcher consumed, and the seconds a checkpoint took.

    Row i is the target's prediction after context + tokens[:i]. A memory that cannot remove that many of a
    decode's tokens (a recurrent state) saves its state first.
    """
    started = target.busy_seconds
    if tokens and not target.can_undo(len(tokens)):
        target.checkpoint()
    saving = target.busy_seconds - started  # the profile's rollback, apart from its verify(n)
    rows = target.eval([int(context[-1])] + tokens, logits="all")
    if processing is not None:  # row i as plain decoding processes it: after the generated tokens and tokens[:i]
        rows = processing.rows(rows, context[prompt_len:], tokens)
    consumed = 0
    if matcher is not None:  # each row masked by the grammar's state after the tokens before it
        rows, consumed = masked_rows(rows, tokens, matcher, target.is_eog)
    return rows, consumed, saving


def learn(drafter: Drafter, draft: Draft, kept: int, timing: RoundTiming) -> None:
    """Tell an adaptive drafter its guess's outcome and the round's costs.

    The outcome is left out when a forced token before the guess was turned down: the grammar forces a
    canonical split, and the mask allows others.
    """
    if len(draft.tokens) > draft.forced and kept >= draft.forced:
        drafter.observe(len(draft.tokens) - draft.forced, kept - draft.forced)
    drafter.observe_timing(timing)


def propose(drafter: Drafter, context: np.ndarray, k: int, rng: np.random.Generator,
            matcher: Optional[GrammarState], is_eog: Callable[[int], bool]) -> Draft:
    """The round's draft of up to ``k`` tokens: under a grammar, the tokens it forces (free), then the drafter's
    guess after them, made knowing the grammar (``Drafter.propose_guided``)."""
    if matcher is None:
        return drafter.propose(context, k, rng)
    forced = matcher.forced_tokens(k)
    if len(forced) >= k or any(is_eog(t) for t in forced):  # nothing to guess after them
        return EMPTY_DRAFT.after(forced, SOURCE_GRAMMAR)
    if not forced:
        return drafter.propose_guided(context, k, rng, DraftGuide(matcher))
    matcher.consume(forced)  # the guess continues after the forced tokens, from the grammar's state there
    try:
        guess = drafter.propose_guided(np.concatenate([context, np.asarray(forced, dtype=context.dtype)]),
                                       k - len(forced), rng, DraftGuide(matcher, len(forced)))
    finally:
        matcher.rollback(len(forced))
    return guess.after(forced, SOURCE_GRAMMAR)


def masked_rows(rows: np.ndarray, tokens: list[int], matcher: GrammarState,
                is_eog: Callable[[int], bool]) -> tuple[np.ndarray, int]:
    """``rows`` (len(tokens) + 1 of them) with each masked by the grammar's state after ``tokens[:i]``, and
    how many of ``tokens`` the matcher consumed.

    The matcher ends past every one of ``tokens`` (each one it allows) up to an end token, which it is not
    given: the row after one is never used (the generation ends there), so it stays as it is.
    """
    out = np.array(rows, dtype=np.float32, copy=True)
    consumed = 0
    for i in range(len(rows)):
        if consumed == i:
            out[i] = matcher.mask(rows[i])
        if i < len(tokens) and consumed == i and not is_eog(tokens[i]):
            matcher.consume([tokens[i]])
            consumed += 1
    return out, consumed
