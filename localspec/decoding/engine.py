"""The speculative decoding loop, and plain decoding on the same path.

One round:

1. draft    - the drafter proposes up to K tokens after the context;
2. verify   - the target evaluates [last token] + draft in one pass, getting
              K + 1 logits rows;
3. accept   - greedy or sampled acceptance keeps a prefix of the draft and
              picks the next token (a correction, or a bonus if all passed);
4. truncate - the target's cache is cut back to the context it accepted
              (the draft model's cache follows at its next proposal);
5. emit     - the kept tokens and the next token, stopping at EOS or
              max_tokens even mid-round.

The target's cache always holds the context minus its last token, whose
logits come out of the next verification. Plain decoding is the same loop
with an empty draft, so the baseline pays exactly the same overheads.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Generator, NamedTuple, Optional, Sequence

import numpy as np

from ..drafting.costs import RoundTiming
from ..drafting.drafters import EMPTY_DRAFT, Draft, Drafter, DraftGuide
from ..errors import ConfigError, ContextOverflowError, GenerationCancelled, InterleavedGenerationError
from ..events import (
    SOURCE_BONUS,
    SOURCE_CORRECTION,
    SOURCE_DRAFT,
    SOURCE_GRAMMAR,
    SOURCE_TARGET,
    GenerationStats,
    TokenEvent,
)
from ..methods import PLAIN
from ..options import SamplingParams
from ..prompt_cache.cache import PromptCache
from ..reasoning.formats import ANSWER, REASONING
from ..reasoning.template import TokenReader
from ..runtime.model import Model
from ..runtime.vocabulary import Detokenizer
from ..sampling.acceptance import ProbRows, accept_greedy, accept_sampled, choose, token_logprobs
from ..sampling.processors import Processing
from ..structured.grammar import GrammarState


def check_prompt(target: Model, n_tokens: int) -> None:
    """Raise unless a prompt of ``n_tokens`` leaves room in the target's context for a reply."""
    if n_tokens == 0:
        raise ConfigError("The prompt is empty; give at least one token of text.")
    if n_tokens >= target.n_ctx:
        raise ContextOverflowError(
            f"The prompt is {n_tokens} tokens but the context holds {target.n_ctx}; "
            "shorten the prompt or raise the context length (--ctx)."
        )


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
        matcher: the grammar the output follows (None: none); it is advanced past the round's tokens.
        processing: the logit bias and penalties, applied to every row before the grammar's mask.
        prompt_len: where the generated tokens start in ``context`` (what the penalties look at).
        keep_rows: return the rows the emitted tokens were chosen from (for their log-probabilities).
    """
    n = len(context)
    helpers = drafter.models if drafter is not None else ()
    drafting_started = sum(m.busy_seconds for m in helpers)
    # 1. draft: tokens the grammar forces cost nothing to guess; the drafter guesses after them.
    draft = propose(drafter, context, k, rng, matcher, target.is_eog) if drafter is not None and k > 0 else EMPTY_DRAFT
    drafting = sum(m.busy_seconds for m in helpers) - drafting_started
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
    draft = draft.cut(known + 1)
    # 2. verify: row i is the target's prediction after context + draft[:i]. A memory that cannot
    # remove that many of a decode's tokens (a recurrent state) saves its state first.
    verify_started = target.busy_seconds
    if known and not target.can_undo(known):
        target.checkpoint()
    saving = target.busy_seconds - verify_started  # the profile's rollback, apart from its verify(n)
    rows = target.eval([int(context[-1])] + draft.tokens[:known], logits="all")
    if processing is not None:  # row i as plain decoding processes it: after the generated tokens and draft[:i]
        rows = processing.rows(rows, context[prompt_len:], draft.tokens[:known])
    consumed = 0
    if matcher is not None:  # each row masked by the grammar's state after the draft tokens before it
        rows, consumed = masked_rows(rows, draft.tokens[:known], matcher, target.is_eog)
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
    timing = RoundTiming(known + 1, verifying, draft.model_steps, drafting, saving)
    if drafter is not None:
        # Adaptive drafters learn from their guess's outcome (unless a forced token before it was turned down:
        # the grammar forces a canonical split, and the mask allows others), and from the costs.
        if len(draft.tokens) > draft.forced and kept >= draft.forced:
            drafter.observe(len(draft.tokens) - draft.forced, kept - draft.forced)
        drafter.observe_timing(timing)
    return Round(draft, kept, nxt, timing, kept_rows)


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


class StopText:
    """Finds stop strings in streamed text, holding back what could be the start of one.

    ``feed`` returns the text that is safe to show: everything before a
    complete stop string (then ``stopped`` is True), or everything except a
    tail that a stop string could still begin with.
    """

    def __init__(self, stops: Sequence[str]):
        self.stops = [x for x in stops if x]
        self.stopped = False
        self.matched: Optional[str] = None  # the stop string that came, once one has
        self._held = ""

    def feed(self, text: str) -> str:
        if not self.stops or self.stopped:
            return "" if self.stopped else text
        buf = self._held + text
        hits = [i for i in (buf.find(x) for x in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            self._held = ""
            at = min(hits)
            self.matched = next(x for x in self.stops if buf.find(x) == at)
            return buf[:at]
        # keep back the longest tail of buf that is a proper prefix of some stop string
        keep = max((n for x in self.stops for n in range(1, min(len(x) - 1, len(buf)) + 1)
                    if buf.endswith(x[:n])), default=0)
        self._held = buf[len(buf) - keep:]
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """What is held back, once no more text will come."""
        held, self._held = self._held, ""
        return held


class Generation:
    """Iterates over TokenEvents; afterwards ``finish_reason`` and ``stats`` are final.

    Closing it early (``break`` out of a loop, an exception, Ctrl-C) leaves
    both caches holding a prefix of the emitted context, so the next
    generation is exact.

    Args:
        target: the target model; its output distribution is what comes out.
        prompt: prompt token ids; the cached prefix they share is reused.
        drafter: the drafter, or None for plain decoding.
        k: draft length per round (0 with a drafter also means plain decoding).
        params: sampling parameters for the target (and the draft model); default greedy.
        max_tokens: most tokens to generate.
        rng: source of randomness for sampling (default: a fresh unseeded one).
        stop: strings that end the generation (the text stops before the first one); with ``reader``, looked
            for in the answer only, so a stop string the model writes while it reasons does not end it.
        method: the registered method the drafter stands for, named in the stats (default: the drafter's name).
        matcher: a grammar the output follows (``constraint.Matcher``, fresh for this generation).
        processing: the logit bias and penalties (``processors.Processing``), None for none.
        logprobs: give each event its log-probability and this many likeliest alternatives (None: none).
        prompt_cache: saved states to start the prompt from, and to save this one's into (None: none).
        boundaries: prompt positions worth a saved state of their own (where later prompts are likely to
            diverge: the end of a chat's system prompt, of each earlier turn), with ``prompt_cache``.
        reader: a reasoning model's reader of this reply: each event's text is then the answer's and its
            ``reasoning`` the reasoning's, and the stats count drafting inside and outside the reasoning apart.

    Raises:
        ContextOverflowError: the prompt leaves no room in the context.
        ConfigError: bad max_tokens or k.
    """

    def __init__(
        self,
        target: Model,
        prompt: Sequence[int],
        *,
        drafter: Optional[Drafter] = None,
        k: int = 0,
        params: Optional[SamplingParams] = None,
        max_tokens: int = 256,
        rng: Optional[np.random.Generator] = None,
        stop: Sequence[str] = (),
        method: Optional[str] = None,
        matcher: Optional[GrammarState] = None,
        processing: Optional[Processing] = None,
        logprobs: Optional[int] = None,
        prompt_cache: Optional[PromptCache] = None,
        boundaries: Sequence[int] = (),
        reader: Optional[TokenReader] = None,
    ):
        if max_tokens < 1:
            raise ConfigError(f"max_tokens must be at least 1, got {max_tokens}.")
        if k < 0:
            raise ConfigError(f"The draft length k must be >= 0, got {k}.")
        check_prompt(target, len(prompt))
        if drafter is None or k == 0:
            drafter, k = None, 0
        self.target = target
        self.drafter = drafter
        self.k = k
        self.params = params or SamplingParams()
        self.max_tokens = max_tokens
        self.rng = rng or np.random.default_rng()
        self.stats = GenerationStats(method=(method or drafter.name) if drafter else PLAIN.name, k=k,
                                     proposed_at=[0] * k, accepted_at=[0] * k)
        #: "stop" (end-of-generation token), "length" (max_tokens or context full), "interrupted"
        #: (closed early or failed), or None while running.
        self.finish_reason: Optional[str] = None
        #: Generated token ids emitted so far.
        self.tokens: list[int] = []
        #: Text of a final incomplete UTF-8 sequence, and answer text a marker could have begun, set when
        #: generation ends.
        self.tail_text = ""
        #: With a ``reader``: the reasoning text it held back, set when generation ends.
        self.tail_reasoning = ""
        #: Prompt tokens the caches give (not processed again), known once the prompt's processing has
        #: looked in them; None before (``stats.cached_prompt_tokens`` reads 0 until then).
        self.cached_prompt_tokens: Optional[int] = None
        self.reader = reader
        self._phase = ANSWER  # where the current round began: inside the reasoning or not
        self.matcher = matcher
        self.processing = processing
        self.logprobs = logprobs
        self.prompt_cache = prompt_cache if prompt_cache is not None and prompt_cache.enabled else None
        self._boundaries = sorted(set(boundaries))
        self._prompt = np.asarray(prompt, dtype=np.int32)
        self._stop = StopText(stop)
        self._cancel = threading.Event()
        self._detok = Detokenizer(target)
        self._context = np.zeros(target.n_ctx + 1, dtype=np.int32)  # prompt + generated tokens
        self._n = 0  # tokens in _context
        self._t_mark: Optional[float] = None  # start of decode time not yet counted; None while the consumer runs
        self._first_row: Optional[np.ndarray] = None  # the prefill's logits, kept for the first token's logprob
        self._events = self._run()

    def __iter__(self) -> Generation:
        return self

    @property
    def stop_string(self) -> Optional[str]:
        """The stop string that ended the text, if one did."""
        return self._stop.matched

    def __next__(self) -> TokenEvent:
        try:
            ev = next(self._events)
        except StopIteration as stop:
            self.finish_reason = stop.value
            raise
        except BaseException:
            self.finish_reason = "interrupted"
            raise
        self.tokens.append(ev.token)
        return ev

    def cancel(self) -> None:
        """Ask the generation to end soon, from any thread; it then finishes as "interrupted".

        Processing the prompt stops within milliseconds, decoding before its next round.
        """
        self._cancel.set()

    def close(self) -> None:
        """Stop generating and leave the caches consistent."""
        self._events.close()
        if self.finish_reason is None:
            self.finish_reason = "interrupted"

    def _models(self) -> tuple[Model, ...]:
        return (self.target, *(self.drafter.models if self.drafter is not None else ()))

    def _llama_busy(self) -> float:
        return sum(m.busy_seconds for m in self._models())  # a drafter's models count as llama time too

    def _rewound(self) -> tuple[int, int]:
        models = self._models()
        return sum(m.rewinds for m in models), sum(m.replayed_tokens for m in models)

    def _check_cache(self, context: np.ndarray) -> None:
        """The target must hold exactly the context minus its last token (see ``speculative_round``)."""
        held = self.target.tokens
        if len(held) != len(context) - 1 or not np.array_equal(held, context[:-1]):
            raise InterleavedGenerationError(
                "The target's cache no longer holds this generation's context: another generation used the "
                "same models while this one was paused; finish or close one stream before starting the next."
            )

    def _run(self) -> Generator[TokenEvent, None, str]:
        target, stats = self.target, self.stats
        stats.prompt_tokens = self._n = len(self._prompt)
        self._context[:self._n] = self._prompt
        start = self._counters()  # rewinds count from here; llama.cpp's time from the first round
        try:
            first = self._prefill()
            if first is None:
                return "interrupted"
            start = (*self._counters()[:2], start[2])
            self._t_mark = time.perf_counter()  # decode starts
            pending, rows = [Emitted(first, SOURCE_TARGET)], self._first_row
            behind = self.drafter is not None  # the drafter reads the prompt once the first token is out
            while True:
                ended = yield from self._emit(pending, rows)
                if ended is not None:
                    return ended
                room = target.n_ctx - self._n - 1  # a round adds up to len(draft) + 1 tokens to the context
                if room < 0:
                    return "length"
                if self._cancel.is_set():
                    return "interrupted"
                if behind:
                    start, behind = self._catch_up(start), False
                    if self._cancel.is_set():  # cancelled while the drafter read the prompt
                        return "interrupted"
                pending, rows = self._round(min(self.k, room))
        finally:
            self._settle(start)

    def _counters(self) -> tuple[float, float, tuple[int, int]]:
        """llama.cpp's busy time (all models, and the target's), and the rewinds so far."""
        return self._llama_busy(), self.target.busy_seconds, self._rewound()

    def _prefill(self) -> Optional[int]:
        """Process the prompt (reusing the cached prefix) and choose the first token; None if cancelled."""
        target = self.target
        t_start = time.perf_counter()
        try:
            logits = self._process_prompt()
        except GenerationCancelled:
            return None
        if self.processing is not None:
            logits = self.processing.row(logits, [])
        if self.matcher is not None:
            logits = self.matcher.mask(logits)
        if self.logprobs is not None:
            self._first_row = np.array(logits, dtype=np.float32)[None, :]
        first = choose(logits, self.params, self.rng)[0]
        if self.matcher is not None and not target.is_eog(first):
            self.matcher.consume([first])
        self.stats.prefill_seconds = time.perf_counter() - t_start
        return first

    def _catch_up(self, start: tuple[float, float, tuple[int, int]]) -> tuple[float, float, tuple[int, int]]:
        """The drafter processes the prompt, after the first token: the reply starts as soon as the target
        has read the prompt, and a reply of one token never waits for the drafter. Its time counts as
        prompt processing, not decoding; ``start``'s llama.cpp time moves past it."""
        assert self.drafter is not None
        t0, busy = time.perf_counter(), self._llama_busy()
        self._prefill_drafter(self.drafter)
        spent = time.perf_counter() - t0
        self.stats.prefill_seconds += spent
        if self._t_mark is not None:
            self._t_mark += spent
        return start[0] + self._llama_busy() - busy, start[1], start[2]

    def _prefill_drafter(self, drafter: Drafter) -> None:
        """The drafter processes the prompt before round 1; its models start from the prompt cache."""
        cache, prompt = self.prompt_cache, self._prompt
        if cache is None:
            drafter.prefill(prompt)
            return
        models = [m for m in drafter.models if isinstance(m, Model) and m is not self.target]
        for m in models:
            cache.restore(m, prompt[:-1])
        drafter.prefill(prompt)
        for m in models:
            if not m.cuts_after_load:  # an attention cache is saved once, at the end (see ``_settle``)
                cache.save(m)

    def _process_prompt(self) -> np.ndarray:
        """Bring the target to the prompt: the longest prefix its cache or the prompt cache holds, the rest
        evaluated (pausing at the boundaries to save them); the last token's logits."""
        target, prompt, cache, stats = self.target, self._prompt, self.prompt_cache, self.stats
        last = len(prompt) - 1
        live = min(target.common_prefix(prompt), last)
        if cache is None:
            stats.cached_prompt_tokens = self.cached_prompt_tokens = live
            return target.sync(prompt, abort=self._cancel)
        restored = min(cache.restore(target, prompt[:last]), last) > live
        target.truncate(min(target.common_prefix(prompt), last), replay=False)
        stats.cached_prompt_tokens = start = min(target.n_past, last)  # what a recurrent state could keep
        self.cached_prompt_tokens = start
        stats.restored_prompt_tokens = max(0, start - live) if restored else 0
        t0, saving = time.perf_counter(), 0.0
        # An attention cache's state at the end of the generation serves every prefix of it: it is saved
        # then (see ``_settle``). A recurrent state serves only its own length, so it is saved at the
        # boundaries, and at the prompt minus its last token, which a repeat of this prompt needs.
        stops = [] if target.cuts_after_load else [*self._boundaries, last]
        for at in (b for b in stops if target.n_past < b <= last):
            target.eval(prompt[target.n_past : at], logits="none", abort=self._cancel)
            t_save = time.perf_counter()
            cache.save(target)
            saving += time.perf_counter() - t_save
        logits = target.sync(prompt, abort=self._cancel)
        cache.observe_prefill(target, len(prompt) - start, time.perf_counter() - t0 - saving)
        return logits

    def _emit(self, pending: list[Emitted], rows: Optional[np.ndarray]) -> Generator[TokenEvent, None, Optional[str]]:
        """Yield a round's tokens (``rows``: the logits each was chosen from, for their log-probabilities); the
        finish reason if one ends the generation (an end token, a stop string, max_tokens), else None. Time the
        consumer holds an event is not decode time."""
        stats, stop = self.stats, self._stop
        for j, (tok, source, by, position) in enumerate(pending):
            self._context[self._n] = tok
            self._n += 1
            if self.target.is_eog(tok):  # never shown
                return "stop"
            stats.generated_tokens += 1
            if position >= 0:  # a drafted token counts as accepted once it is emitted
                stats.count_accepted(position, by, self._phase)
            assert self._t_mark is not None
            stats.decode_seconds += time.perf_counter() - self._t_mark
            self._t_mark = None
            lp, top = token_logprobs(rows[j], tok, self.logprobs) if rows is not None and self.logprobs is not None \
                else (None, ())
            text, thought = self._detok.feed(tok), ""
            if self.reader is not None:  # a stop string counts in the answer only
                thought, text = self.reader.feed(tok, text)
            yield TokenEvent(tok, stop.feed(text), source, by, lp, top, thought)
            self._t_mark = time.perf_counter()
            if stop.stopped:  # the text is cut where the stop string began
                return "stop"
            if stats.generated_tokens >= self.max_tokens:
                return "length"
        return None

    def _round(self, k: int) -> tuple[list[Emitted], Optional[np.ndarray]]:
        """One speculative round of up to ``k`` drafted tokens, counted and timed; the tokens it decided, and
        with ``logprobs`` the rows they were chosen from."""
        context = self._context[:self._n]
        self._check_cache(context)
        # a round counts inside the reasoning where the emitted tokens before it end inside it
        self._phase = REASONING if self.reader is not None and self.reader.inside else ANSWER
        t_round = time.perf_counter()
        rnd = speculative_round(self.target, self.drafter, context, k, self.params, self.rng, self.matcher,
                                self.processing, len(self._prompt), keep_rows=self.logprobs is not None)
        self.stats.time_round(rnd.draft.by if rnd.draft.tokens else PLAIN.name, rnd.kept + 1,
                              time.perf_counter() - t_round, rnd.timing.verify_seconds + rnd.timing.rollback_seconds,
                              rnd.timing.draft_seconds)
        self.stats.count_round(rnd.draft, rnd.kept, self._phase)
        return rnd.emitted(), rnd.rows

    def _settle(self, start: tuple[float, float, tuple[int, int]]) -> None:
        """Whatever ended the loop (a stop, an exception, Ctrl-C, the consumer closing it): leave each cache
        holding a prefix of the emitted context, and close the stats."""
        target, drafter, stats, stop = self.target, self.drafter, self.stats, self._stop
        emitted = self._context[:self._n]
        target.truncate(target.common_prefix(emitted))
        if drafter is not None:
            drafter.settle(emitted)
            stats.auto = drafter.report()
        if self._t_mark is not None:  # the round that found EOS (or failed) after the last yield
            stats.decode_seconds += time.perf_counter() - self._t_mark
        busy, target_busy, rewound = self._counters()
        stats.llama_seconds = busy - start[0]
        stats.target_seconds = target_busy - start[1]
        stats.draft_seconds = stats.llama_seconds - stats.target_seconds
        stats.rewinds, stats.replayed_tokens = (a - b for a, b in zip(rewound, start[2], strict=True))
        tail = self._detok.flush()
        if self.reader is not None:  # what the reader held back: unfinished reasoning, or the answer's end
            self.tail_reasoning, tail = self.reader.flush(tail)
        tail = stop.feed(tail)  # an incomplete character could still complete a stop string
        self.tail_text = tail if stop.stopped else tail + stop.flush()
        if self.prompt_cache is not None:  # after the stats: saving is not decoding
            for m in self._models():  # the reply too: the next turn of this conversation starts with it
                if isinstance(m, Model):
                    self.prompt_cache.save(m)
