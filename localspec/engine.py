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
from dataclasses import asdict, dataclass, field
from typing import Callable, Generator, NamedTuple, Optional, Sequence

import numpy as np

from .acceptance import ProbRows, accept_greedy, accept_sampled, probabilities, sample
from .backend import Detokenizer, Model
from .costs import RoundTiming
from .drafters import EMPTY_DRAFT, AutoReport, Draft, Drafter
from .errors import ConfigError, ContextOverflowError, GenerationCancelled, InterleavedGenerationError
from .grammar import Matcher
from .methods import PLAIN
from .options import SamplingParams

#: Where an emitted token came from.
SOURCE_TARGET = "target"  # a plain step of the target (or the first token, from prefill)
SOURCE_DRAFT = "draft"  # a drafted token the target accepted
SOURCE_CORRECTION = "correction"  # the target's token where a drafted one was rejected
SOURCE_BONUS = "bonus"  # the target's extra token after a fully accepted draft
#: The drafter named for tokens the grammar forced (exactly one way on), drafted at no cost.
SOURCE_GRAMMAR = "grammar"


@dataclass
class TokenEvent:
    """One generated token.

    Attributes:
        token: the token id.
        text: text completed by this token (may be empty mid-character).
        source: "draft", "target", "correction" or "bonus" (see the SOURCE_* names).
        drafter: for an accepted drafted token, which drafter guessed it
            ("draft" model, "lookup" or "history"); empty otherwise.
    """

    token: int
    text: str
    source: str
    drafter: str = ""

    @property
    def from_draft(self) -> bool:
        """True when the drafter guessed this token and the target agreed."""
        return self.source == SOURCE_DRAFT


@dataclass
class GenerationStats:
    """Counts and timings of one generation."""

    method: str
    k: int
    prompt_tokens: int = 0
    #: Prompt tokens found in the cache (an earlier turn's), so not processed again.
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    #: Drafted tokens that came from the draft model (each one a draft-model step).
    draft_model_tokens: int = 0
    #: Drafted and accepted tokens by drafter ("lookup", "history", "draft").
    drafted_by: dict[str, int] = field(default_factory=dict)
    accepted_by: dict[str, int] = field(default_factory=dict)
    #: Rounds whose draft was only tokens the grammar forced (see ``SOURCE_GRAMMAR``): auto chose nothing in them.
    grammar_rounds: int = 0
    #: Rounds in which the drafter proposed nothing (plain steps), and rounds with a rejected guess.
    empty_rounds: int = 0
    rejected_rounds: int = 0
    #: proposed_at[i] / accepted_at[i]: drafted tokens at draft position i, and how many were kept.
    proposed_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    #: Part of decode_seconds spent inside llama.cpp (target and draft decode calls), and its two parts:
    #: the target's decode calls (verification, and replays after a rewind) and the drafter's models'.
    llama_seconds: float = 0.0
    target_seconds: float = 0.0
    draft_seconds: float = 0.0
    #: Times a model's memory (a recurrent state) went back to a checkpoint or to the start, and the tokens
    #: it evaluated again for that (see ``Model.truncate``); 0 for attention caches.
    rewinds: int = 0
    replayed_tokens: int = 0
    #: Rounds by what drafted them ("plain" for a round that drafted nothing, "grammar" for forced tokens):
    #: how many, the tokens they decided (kept draft and the target's own, an end token included), and their
    #: time in seconds, whole and the parts the target's and the drafter's models spent in llama.cpp. A round
    #: is timed from the draft to the truncation; emitting its tokens is not in it (that costs all alike).
    round_time_by: dict[str, dict[str, float]] = field(default_factory=dict)
    #: For method "auto": rounds per method, the choices it made and the estimates behind them.
    auto: Optional[AutoReport] = None

    def count_round(self, draft: Draft, kept: int) -> None:
        """Count one verified round (accepted tokens are counted when emitted, not here)."""
        self.rounds += 1
        self.drafted += len(draft.tokens)
        self.empty_rounds += not draft.tokens
        self.rejected_rounds += kept < len(draft.tokens)
        self.draft_model_tokens += draft.model_steps
        self.grammar_rounds += draft.by == SOURCE_GRAMMAR
        if draft.tokens:
            self.drafted_by[draft.by] = self.drafted_by.get(draft.by, 0) + len(draft.tokens)
        for i in range(len(draft.tokens)):
            self.proposed_at[i] += 1

    def time_round(self, by: str, tokens: int, seconds: float, target_seconds: float, draft_seconds: float) -> None:
        """Add one round, the ``tokens`` it added and its time to ``round_time_by`` under ``by``."""
        t = self.round_time_by.setdefault(by, {"rounds": 0, "tokens": 0, "seconds": 0.0, "target": 0.0,
                                               "draft": 0.0})
        t["rounds"] += 1
        t["tokens"] += tokens
        t["seconds"] += seconds
        t["target"] += target_seconds
        t["draft"] += draft_seconds

    @property
    def rounds_by_method(self) -> dict[str, int]:
        """Rounds per drafting method: auto's choices, or all rounds under the one method used (and the rounds
        of tokens a grammar forced, under "grammar")."""
        rounds = dict(self.auto.rounds) if self.auto is not None else {self.method: self.rounds - self.grammar_rounds}
        if self.grammar_rounds:
            rounds[SOURCE_GRAMMAR] = self.grammar_rounds
        return rounds

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafted tokens over drafted tokens."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        """Acceptance rate at each draft position."""
        return [a / p if p else 0.0 for a, p in zip(self.accepted_at, self.proposed_at, strict=True)]

    @property
    def tokens_per_round(self) -> float:
        """Mean tokens emitted per verification round."""
        return (self.generated_tokens - 1) / self.rounds if self.rounds else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        """Tokens after the first over the time spent producing them."""
        return (self.generated_tokens - 1) / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def overhead_ms_per_round(self) -> float:
        """Decode time outside llama.cpp per round, in milliseconds (Python and numpy)."""
        return 1000 * (self.decode_seconds - self.llama_seconds) / self.rounds if self.rounds else 0.0

    def to_dict(self) -> dict:
        """Plain dict for JSON, with the derived figures included."""
        d = asdict(self)
        for name in ("acceptance_rate", "acceptance_by_position", "tokens_per_round",
                     "decode_tokens_per_second", "overhead_ms_per_round"):
            d[name] = getattr(self, name)
        return d


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
    """

    draft: Draft
    kept: int
    next_token: int
    timing: RoundTiming

    def emitted(self) -> list[Emitted]:
        """The tokens the round adds, in order: the kept draft, then the target's own token."""
        d = self.draft
        tail = SOURCE_TARGET if not d.tokens else SOURCE_BONUS if self.kept == len(d.tokens) else SOURCE_CORRECTION
        kept = [Emitted(t, SOURCE_DRAFT, d.by, i) for i, t in enumerate(d.tokens[: self.kept])]
        return kept + [Emitted(self.next_token, tail)]


def speculative_round(
    target: Model,
    drafter: Optional[Drafter],
    context: np.ndarray,
    k: int,
    params: SamplingParams,
    rng: np.random.Generator,
    matcher: Optional[Matcher] = None,
) -> Round:
    """One round: draft, verify, accept, truncate.

    Args:
        target: holds ``context`` minus its last token on entry, and
            ``context`` plus the kept draft tokens on return.
        drafter: None for a plain step.
        context: prompt and generated tokens so far.
        k: the most tokens to draft.
        matcher: the grammar the output follows (None: none); it is advanced past the round's tokens.
    """
    n = len(context)
    helpers = drafter.models if drafter is not None else ()
    drafting_started = sum(m.busy_seconds for m in helpers)
    # 1. draft: tokens the grammar forces cost nothing to guess; otherwise the drafter guesses.
    forced = matcher.forced_tokens(k) if matcher is not None and drafter is not None and k > 0 else []
    if forced:
        draft = Draft(forced, None, SOURCE_GRAMMAR)
    else:
        draft = drafter.propose(context, k, rng) if drafter is not None and k > 0 else EMPTY_DRAFT
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
    rows = target.eval([int(context[-1])] + draft.tokens[:known], logits="all")
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
    # 4. truncate: keep the context and the accepted draft tokens; the rejected tail goes (from a
    # checkpoint, the kept ones are evaluated again: that time counts as verifying).
    target.truncate(n + kept)
    verifying = target.busy_seconds - verify_started
    timing = RoundTiming(known + 1, verifying, draft.model_steps, drafting)
    if drafter is not None:
        if not forced:
            drafter.observe(len(draft.tokens), kept)  # adaptive drafters learn from the outcome, and the costs
        drafter.observe_timing(timing)
    return Round(draft, kept, nxt, timing)


def masked_rows(rows: np.ndarray, tokens: list[int], matcher: Matcher,
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
        self._held = ""

    def feed(self, text: str) -> str:
        if not self.stops or self.stopped:
            return "" if self.stopped else text
        buf = self._held + text
        hits = [i for i in (buf.find(x) for x in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            self._held = ""
            return buf[: min(hits)]
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
        stop: strings that end the generation (the text stops before the first one).
        method: the registered method the drafter stands for, named in the stats (default: the drafter's name).
        matcher: a grammar the output follows (``constraint.Matcher``, fresh for this generation).

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
        matcher: Optional[Matcher] = None,
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
        #: Text of a final incomplete UTF-8 sequence, set when generation ends.
        self.tail_text = ""
        self.matcher = matcher
        self._prompt = np.asarray(prompt, dtype=np.int32)
        self._stop = StopText(stop)
        self._cancel = threading.Event()
        self._events = self._run()

    def __iter__(self) -> Generation:
        return self

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
        target, drafter, stats = self.target, self.drafter, self.stats
        prompt = self._prompt
        stats.prompt_tokens = len(prompt)
        detok = Detokenizer(target)
        context = np.zeros(target.n_ctx + 1, dtype=np.int32)  # prompt + generated tokens
        n = len(prompt)
        context[:n] = prompt
        t_start = time.perf_counter()
        busy0, target0 = self._llama_busy(), target.busy_seconds
        rewound0 = self._rewound()
        t_mark: Optional[float] = None  # start of decode time not yet counted; None while the consumer runs
        stop = self._stop
        try:
            stats.cached_prompt_tokens = min(target.common_prefix(prompt), len(prompt) - 1)
            try:
                logits = target.sync(prompt, abort=self._cancel)  # prefill, reusing the cached prefix
            except GenerationCancelled:
                return "interrupted"
            if drafter is not None:
                drafter.prefill(prompt)  # a draft model processes the prompt now, not in round 1
            if self.matcher is not None:
                logits = self.matcher.mask(logits)
            first = int(np.argmax(logits)) if self.params.greedy else sample(probabilities(logits, self.params),
                                                                                self.rng)
            if self.matcher is not None and not target.is_eog(first):
                self.matcher.consume([first])
            stats.prefill_seconds = time.perf_counter() - t_start
            busy0, target0, t_mark = self._llama_busy(), target.busy_seconds, time.perf_counter()  # decode starts
            pending = [Emitted(first, SOURCE_TARGET)]
            while True:
                # emit: stop at an end-of-generation token (never shown) or at max_tokens.
                for tok, source, by, position in pending:
                    context[n] = tok
                    n += 1
                    if target.is_eog(tok):
                        return "stop"
                    stats.generated_tokens += 1
                    if position >= 0:  # a drafted token counts as accepted once it is emitted
                        stats.accepted += 1
                        stats.accepted_at[position] += 1
                        stats.accepted_by[by] = stats.accepted_by.get(by, 0) + 1
                    stats.decode_seconds += time.perf_counter() - t_mark
                    t_mark = None
                    yield TokenEvent(tok, stop.feed(detok.feed(tok)), source, by)
                    t_mark = time.perf_counter()
                    if stop.stopped:  # the text is cut where the stop string began
                        return "stop"
                    if stats.generated_tokens >= self.max_tokens:
                        return "length"
                room = target.n_ctx - n - 1  # a round adds up to len(draft) + 1 tokens to the context
                if room < 0:
                    return "length"
                if self._cancel.is_set():
                    return "interrupted"
                self._check_cache(context[:n])
                t_round = time.perf_counter()
                rnd = speculative_round(target, drafter, context[:n], min(self.k, room), self.params, self.rng,
                                        self.matcher)
                stats.time_round(rnd.draft.by if rnd.draft.tokens else PLAIN.name, rnd.kept + 1,
                                 time.perf_counter() - t_round, rnd.timing.verify_seconds, rnd.timing.draft_seconds)
                stats.count_round(rnd.draft, rnd.kept)
                pending = rnd.emitted()
        finally:
            # Whatever ended the loop (a stop, an exception, Ctrl-C, the consumer
            # closing us), leave each cache holding a prefix of the emitted context.
            emitted = context[:n]
            target.truncate(target.common_prefix(emitted))
            if drafter is not None:
                drafter.settle(emitted)
                stats.auto = drafter.report()
            if t_mark is not None:  # the round that found EOS (or failed) after the last yield
                stats.decode_seconds += time.perf_counter() - t_mark
            stats.llama_seconds = self._llama_busy() - busy0
            stats.target_seconds = target.busy_seconds - target0
            stats.draft_seconds = stats.llama_seconds - stats.target_seconds
            stats.rewinds, stats.replayed_tokens = (a - b for a, b in zip(self._rewound(), rewound0, strict=True))
            tail = stop.feed(detok.flush())  # an incomplete character could still complete a stop string
            self.tail_text = tail if stop.stopped else tail + stop.flush()

