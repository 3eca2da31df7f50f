"""One generation's lifecycle: the prompt's processing, its rounds, its events and stats, and the caches after it.

A generation brings the target to the prompt (from its own cache or the
prompt cache), chooses the first token, then runs speculative rounds
(``rounds.speculative_round``) and emits their tokens as events, stopping at
EOS, a stop string or max_tokens even mid-round. However it ends, both caches
are left holding a prefix of the emitted context. Plain decoding is the same
loop with an empty draft, so the baseline pays exactly the same overheads.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Generator, Optional

import numpy as np

from ..drafting.drafters import Drafter
from ..errors import GenerationCancelled, InterleavedGenerationError
from ..events import SOURCE_TARGET, GenerationStats, TokenEvent
from ..methods import PLAIN
from ..prompt_cache.cache import PromptCache
from ..reasoning.formats import ANSWER, REASONING
from ..runtime.model import Model
from ..runtime.vocabulary import Detokenizer
from ..sampling.acceptance import choose, token_logprobs
from .plan import DecodingPlan, check_prompt
from .rounds import Emitted, speculative_round
from .stop_text import StopText


class Generation:
    """Iterates over TokenEvents; afterwards ``finish_reason`` and ``stats`` are final.

    Closing it early (``break`` out of a loop, an exception, Ctrl-C) leaves
    both caches holding a prefix of the emitted context, so the next
    generation is exact.

    Args:
        target: the target model; its output distribution is what comes out.
        plan: the prompt, drafter, sampling and limits of this generation (``plan.DecodingPlan``).
        prompt_cache: saved states to start the prompt from, and to save this one's into (None: none).

    Raises:
        ContextOverflowError: the prompt leaves no room in the context.
    """

    def __init__(self, target: Model, plan: DecodingPlan, *, prompt_cache: Optional[PromptCache] = None):
        check_prompt(target, len(plan.prompt))
        self.target = target
        self.plan = plan
        #: The drafter and draft length the rounds use: None and 0 for plain decoding.
        self.drafter: Optional[Drafter] = plan.drafter if plan.speculates else None
        self.k = plan.k if plan.speculates else 0
        self.rng = np.random.default_rng(plan.seed)
        self.stats = GenerationStats(method=(plan.method or self.drafter.name) if self.drafter else PLAIN.name,
                                     k=self.k, proposed_at=[0] * self.k, accepted_at=[0] * self.k)
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
        self._reading = False  # the target is reading the prompt (see ``prompt_read``)
        self.prompt_cache = prompt_cache if prompt_cache is not None and prompt_cache.enabled else None
        self._phase = ANSWER  # where the current round began: inside the reasoning or not
        self._boundaries = sorted(set(plan.boundaries))
        self._prompt = np.asarray(plan.prompt, dtype=np.int32)
        self._stop = StopText(plan.stop)
        self._cancel = threading.Event()
        self._detok = Detokenizer(target)
        self._context = np.zeros(target.n_ctx + 1, dtype=np.int32)  # prompt + generated tokens
        self._n = 0  # tokens in _context
        self._t_mark: Optional[float] = None  # start of decode time not yet counted; None while the consumer runs
        self._first_row: Optional[np.ndarray] = None  # the prefill's logits, kept for the first token's logprob
        self._left_at: Optional[int] = None  # the target's ``writes`` when the last round ended
        # max_tokens reaches past the context's room (a request that set none): a reply of unknown length
        self._unbounded = plan.max_tokens >= target.n_ctx - len(plan.prompt)
        self._events = self._run()

    def __iter__(self) -> Generation:
        return self

    @property
    def prompt_read(self) -> Optional[int]:
        """While the target reads the prompt: how many of its tokens it holds so far (those the caches gave
        included); None before the caches were looked in and once the prompt is read. Read from another
        thread, it may lag by one decode call."""
        return min(self.target.n_past, len(self._prompt)) if self._reading else None

    @property
    def stop_string(self) -> Optional[str]:
        """The stop string that ended the text, if one did."""
        return self._stop.matched

    def __next__(self) -> TokenEvent:
        try:
            ev = next(self._events)
        except StopIteration as stop:
            self.finish_reason = stop.value
            if stop.value == "stop" and self._unbounded:  # what a reply of unknown length came to (see Lanes)
                self.target.last_reply = self.stats.generated_tokens
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
        """The target must hold exactly the context minus its last token (see ``speculative_round``): compared
        whole unless the target's record is as this generation's last round left it."""
        if self._left_at == self.target.writes:
            return
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
        target.widest_batch = 1  # read at the end (``_settle``)
        self._expect()  # its decoding, after the prompt (see ``StepBatcher``)
        for m in self._models():  # a step loop drops this generation's sequences set aside once it is cancelled
            if isinstance(m, Model):
                m.cancelled = self._cancel
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
                k = min(self.k, room)
                if behind:
                    start, behind = self._catch_up(start, self._prompt), False
                if self.drafter is not None and self.drafter.deferred(self._context[:self._n], k):
                    start = self._catch_up(start, self._context[:self._n])  # a reading put off until it pays
                if self._cancel.is_set():  # cancelled while the drafter read the prompt
                    return "interrupted"
                self._expect()
                pending, rows = self._round(k)
        except GenerationCancelled:  # cancelled while set aside for want of cells: its state was dropped
            return "interrupted"
        finally:
            self._expect(ended=True)
            self._settle(start)

    def _tokens_left(self) -> Optional[int]:
        """The tokens this generation may still add if no end token comes before max_tokens; None where
        max_tokens reaches past the context's room (a request that set none): its length is not known."""
        left = self.plan.max_tokens - self.stats.generated_tokens
        return None if left >= self.target.n_ctx - self._n else left

    def _steps_left(self, left: Optional[int]) -> Optional[int]:
        """The rounds this generation still expects for ``left`` tokens, at the tokens per round it has had so
        far: how long it keeps a step of several sequences (None: not known)."""
        if left is None:
            return None
        stats = self.stats
        # every token but the first (the prompt's) came from a round
        per_round = max(1.0, (stats.generated_tokens - 1) / stats.rounds) if stats.rounds else 1.0
        return max(1, math.ceil(left / per_round))

    def _expect(self, ended: bool = False) -> None:
        """Say on every model of this generation (the drafter's too: its steps are the same rounds') how many
        steps and tokens it still expects (see ``StepBatcher`` and ``Lanes``), or that it has ended."""
        left = None if ended else self._tokens_left()
        steps = self._steps_left(left)
        for m in self._models():
            if isinstance(m, Model):
                m.steps_left, m.cells_left = steps, left
                if ended:
                    m.cancelled = None

    def _counters(self) -> tuple[float, float, tuple[int, int]]:
        """llama.cpp's busy time (all models, and the target's), and the rewinds so far."""
        return self._llama_busy(), self.target.busy_seconds, self._rewound()

    def _prefill(self) -> Optional[int]:
        """Process the prompt (reusing the cached prefix) and choose the first token; None if cancelled."""
        target, plan = self.target, self.plan
        t_start = time.perf_counter()
        try:
            logits = self._process_prompt()
        except GenerationCancelled:
            return None
        finally:
            self._reading = False
            self.target.reading_end = None
        if plan.processing is not None:
            logits = plan.processing.row(logits, [])
        if plan.matcher is not None:
            logits = plan.matcher.mask(logits)
        if plan.logprobs is not None:
            self._first_row = np.array(logits, dtype=np.float32)[None, :]
        first = choose(logits, plan.params, self.rng)[0]
        if plan.matcher is not None and not target.is_eog(first):
            plan.matcher.consume([first])
        self.stats.prefill_seconds = time.perf_counter() - t_start
        return first

    def _catch_up(self, start: tuple[float, float, tuple[int, int]],
                  context: np.ndarray) -> tuple[float, float, tuple[int, int]]:
        """The drafter processes the prompt, after the first token: the reply starts as soon as the target
        has read the prompt, and a reply of one token never waits for the drafter (``context``: the prompt,
        or the context so far for a reading the drafter put off). Its time counts as prompt processing, not
        decoding; ``start``'s llama.cpp time moves past it."""
        assert self.drafter is not None
        t0, busy = time.perf_counter(), self._llama_busy()
        self._prefill_drafter(self.drafter, context)
        spent = time.perf_counter() - t0
        self.stats.prefill_seconds += spent
        if self._t_mark is not None:
            self._t_mark += spent
        return start[0] + self._llama_busy() - busy, start[1], start[2]

    def _prefill_drafter(self, drafter: Drafter, context: np.ndarray) -> None:
        """The drafter processes ``context``; its models start from the prompt cache."""
        cache = self.prompt_cache
        if cache is None:
            drafter.prefill(context)
            return
        models = [m for m in drafter.models if isinstance(m, Model) and m is not self.target]
        for m in models:
            cache.restore(m, context[:-1])
        drafter.prefill(context)
        for m in models:
            # an attention cache is saved once, at the end (see ``_settle``); a recurrent state where it read to
            if not m.cuts_after_load and m.n_past == len(context) - 1:
                cache.save(m)

    def _process_prompt(self) -> np.ndarray:
        """Bring the target to the prompt: the longest prefix its cache or the prompt cache holds, the rest
        evaluated (pausing at the boundaries to save them); the last token's logits."""
        target, prompt, cache, stats = self.target, self._prompt, self.prompt_cache, self.stats
        # what a step of several sequences weighs against shorter requests
        target.reading_end, target.reading_waited = len(prompt), 0.0
        last = len(prompt) - 1
        live = min(target.common_prefix(prompt), last)
        if cache is None:
            stats.cached_prompt_tokens = self.cached_prompt_tokens = live
            target.prompt_read = len(prompt) - live
            self._reading = True
            return target.sync(prompt, abort=self._cancel)
        restored = min(cache.restore(target, prompt[:last]), last) > live
        target.truncate(min(target.common_prefix(prompt), last), replay=False)
        stats.cached_prompt_tokens = start = min(target.n_past, last)  # what a recurrent state could keep
        target.prompt_read = len(prompt) - start
        self.cached_prompt_tokens = start
        stats.restored_prompt_tokens = max(0, start - live) if restored else 0
        self._reading = True
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
        stats, stop, plan = self.stats, self._stop, self.plan
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
            lp, top = token_logprobs(rows[j], tok, plan.logprobs) if rows is not None and plan.logprobs is not None \
                else (None, ())
            text, thought = self._detok.feed(tok), ""
            if plan.reader is not None:  # a stop string counts in the answer only
                thought, text = plan.reader.feed(tok, text)
            yield TokenEvent(tok, stop.feed(text), source, by, lp, top, thought)
            self._t_mark = time.perf_counter()
            if stop.stopped:  # the text is cut where the stop string began
                return "stop"
            if stats.generated_tokens >= plan.max_tokens:
                return "length"
        return None

    def _round(self, k: int) -> tuple[list[Emitted], Optional[np.ndarray]]:
        """One speculative round of up to ``k`` drafted tokens, counted and timed; the tokens it decided, and
        with ``logprobs`` the rows they were chosen from."""
        context, plan = self._context[:self._n], self.plan
        self._check_cache(context)
        # a round counts inside the reasoning where the emitted tokens before it end inside it
        self._phase = REASONING if plan.reader is not None and plan.reader.inside else ANSWER
        t_round = time.perf_counter()
        rnd = speculative_round(self.target, self.drafter, context, k, plan.params, self.rng, plan.matcher,
                                plan.processing, len(self._prompt), keep_rows=plan.logprobs is not None)
        self._left_at = self.target.writes
        self.stats.time_round(rnd.draft.by if rnd.draft.tokens else PLAIN.name, rnd.kept + 1,
                              time.perf_counter() - t_round, rnd.timing.verify_seconds + rnd.timing.rollback_seconds,
                              rnd.timing.draft_seconds)
        self.stats.count_round(rnd.draft, rnd.kept, self._phase)
        return rnd.emitted(), rnd.rows

    def _settle(self, start: tuple[float, float, tuple[int, int]]) -> None:
        """Whatever ended the loop (a stop, an exception, Ctrl-C, the consumer closing it): leave each cache
        holding a prefix of the emitted context, and close the stats."""
        target, drafter, stats = self.target, self.drafter, self.stats
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
        stats.batch_width = target.widest_batch
        self._flush_text()
        if self.prompt_cache is not None:  # after the stats: saving is not decoding
            for m in self._models():  # the reply too: the next turn of this conversation starts with it
                if isinstance(m, Model):
                    self.prompt_cache.save(m)

    def _flush_text(self) -> None:
        """Set ``tail_text`` and ``tail_reasoning``: the text held back for want of more, once no more comes."""
        stop, reader = self._stop, self.plan.reader
        tail = self._detok.flush()
        if reader is not None:  # what the reader held back: unfinished reasoning, or the answer's end
            self.tail_reasoning, tail = reader.flush(tail)
        tail = stop.feed(tail)  # an incomplete character could still complete a stop string
        self.tail_text = tail if stop.stopped else tail + stop.flush()
