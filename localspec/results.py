"""A generation as the Python API hands it out: a ``Stream`` of token events, then a ``Result``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generator, Optional

from .decoding.engine import Generation
from .events import SOURCE_GRAMMAR, GenerationStats, TokenEvent
from .structured.call_reader import CallReader, ToolCall, read_calls


@dataclass
class Result:
    """A finished generation.

    Attributes:
        text: the generated text (end-of-generation token not included); from a reasoning model, the answer
            only (its reasoning is in ``reasoning``).
        tokens: the generated token ids.
        finish_reason: "stop" (the model ended its answer, or a stop string
            came: the text ends before it), "tool_calls" (it ended after calling
            tools), "length" (max_tokens reached or the context is full) or
            "interrupted".
        stats: counts and timings.
        prompt_tokens: the prompt's token ids.
        logprobs: with ``logprobs`` asked for, each token's (log-probability, likeliest alternatives as
            (id, log-probability) pairs); else None.
        tool_calls: with tools offered, the calls in the reply (finish_reason is then "tool_calls" where
            the model ended it); else None.
        content: with tools offered, the reply's text without its calls (None when it is only calls);
            else the text.
        reasoning: from a reasoning model, the reasoning before the answer (without its markers); None when
            the reply had none, or the model does not reason.
        stop_string: the stop string that ended the text (finish_reason "stop"), if one did.
        reasoning_tokens: from a reasoning model, the generated tokens before the answer's first text (the
            reasoning and its markers); 0 otherwise.
    """

    text: str
    tokens: list[int]
    finish_reason: Optional[str]
    stats: GenerationStats
    prompt_tokens: list[int]
    logprobs: Optional[list[tuple[float, tuple[tuple[int, float], ...]]]] = None
    tool_calls: Optional[list[ToolCall]] = None
    content: Optional[str] = None
    reasoning: Optional[str] = None
    stop_string: Optional[str] = None
    reasoning_tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape printed by ``localspec generate --json``."""
        out: dict[str, Any] = {"text": self.text, "tokens": self.tokens, "finish_reason": self.finish_reason,
                               "stats": self.stats.to_dict()}
        if self.logprobs is not None:
            out["logprobs"] = [{"token": t, "logprob": lp, "top_logprobs": [[i, v] for i, v in top]}
                               for t, (lp, top) in zip(self.tokens, self.logprobs, strict=True)]
        if self.reasoning is not None:
            out["reasoning"] = self.reasoning
        if self.tool_calls is not None:
            out["content"] = self.content
            out["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        return out

    def summary_line(self) -> str:
        """One line for a person after a reply: tokens, speed, method and K, acceptance."""
        s = self.stats
        how = s.method
        if s.auto:
            used = ", ".join(f"{m} {n}" for m, n in s.rounds_by_method.items() if n)
            how = f"auto ({used} rounds)" if used else "auto"
        elif s.k:
            how += f" k={s.k}"
        acc = f", accepted {s.accepted}/{s.drafted}" if s.drafted else ""
        forced = s.accepted_by.get(SOURCE_GRAMMAR, 0)
        acc += f", {forced} forced by the grammar" if forced else ""
        # a prompt the prompt cache gave back (the live context's own prefix, a chat's usual case, goes unsaid)
        restored = s.restored_prompt_tokens
        cached = f", {s.cached_prompt_tokens}/{s.prompt_tokens} prompt tokens cached" if restored else ""
        tps = s.decode_tokens_per_second
        speed = f"{tps:.0f}" if tps >= 100 else f"{tps:.1f}"  # tenths only where they are news
        return (f"[{s.generated_tokens} tokens, {speed} tok/s, {how}{acc}{cached}, "
                f"finish: {self.finish_reason}]")


class Stream:
    """Iterator over ``TokenEvent``s of one generation; ``result`` once it is done.

    Leaving the loop early (``break``, an exception, Ctrl-C) stops the
    generation and leaves both models' caches consistent. From a reasoning
    model (a generation with a ``reader``), each event's text is the answer's
    and its ``reasoning`` the reasoning's.
    """

    def __init__(self, generation: Generation, prompt_tokens: list[int],
                 on_end: Optional[Callable[[Generation], None]] = None,
                 calls: Optional[frozenset[str]] = None):
        self._g = generation
        self._reasoning: list[str] = []
        self._reasoning_tokens = 0  # tokens fed before the answer's first text
        self._answered = False
        self._calls = calls
        self._read: Optional[tuple[str, CallReader]] = None
        self._prompt_tokens = prompt_tokens
        self._text: list[str] = []
        self._logprobs: list[tuple[float, tuple[tuple[int, float], ...]]] = []
        self._on_end = on_end

    def __iter__(self) -> Generator[TokenEvent, None, None]:
        try:
            for ev in self._g:
                if self._g.plan.reader is not None:
                    self._reasoning.append(ev.reasoning)
                    self._answered = self._answered or bool(ev.text)
                    self._reasoning_tokens += not self._answered
                self._text.append(ev.text)
                if ev.logprob is not None:
                    self._logprobs.append((ev.logprob, ev.top_logprobs))
                yield ev
        finally:
            self._g.close()
            self._reasoning.append(self._g.tail_reasoning)
            self._text.append(self._g.tail_text)  # an incomplete final character, if any
            on_end, self._on_end = self._on_end, None
            if on_end is not None:
                on_end(self._g)

    @property
    def prompt_tokens(self) -> int:
        """How many tokens the prompt has (known before it is processed)."""
        return len(self._prompt_tokens)

    @property
    def cached_prompt_tokens(self) -> Optional[int]:
        """How many prompt tokens the caches give (not processed again): known once the prompt's processing has
        looked in them, well before it ends; None until then."""
        return self._g.cached_prompt_tokens

    @property
    def stats(self) -> GenerationStats:
        """The generation's counts and timings so far (final once iteration has ended)."""
        return self._g.stats

    @property
    def prompt_read(self) -> Optional[int]:
        """While the prompt is processed: how many of its tokens the model holds so far, those the caches gave
        included (a long prompt's progress); None before and after."""
        return self._g.prompt_read

    @property
    def result(self) -> Result:
        """The generation so far (final once iteration has ended)."""
        text, finish = "".join(self._text), self._g.finish_reason
        content: Optional[str] = text
        calls = None
        if self._calls is not None:
            if self._read is None or self._read[0] != text:  # read once per text: the calls' ids stay
                self._read = (text, read_calls(text, self._calls))
            reader = self._read[1]
            calls, content = reader.calls, "".join(reader.content)
            content = content or None if calls else content
            finish = "tool_calls" if calls and finish == "stop" and not reader.cut else finish
        thinking = self._g.plan.reader
        reasoning = "".join(self._reasoning) if thinking is not None and thinking.reasoned else None
        return Result(text, list(self._g.tokens), finish, self._g.stats, self._prompt_tokens,
                      list(self._logprobs) if self._g.plan.logprobs is not None else None, calls, content, reasoning,
                      self._g.stop_string, self._reasoning_tokens if reasoning is not None else 0)

    def cancel(self) -> None:
        """End the generation soon; safe to call from another thread (e.g. when a client leaves).

        A prompt being processed stops within milliseconds; the loop then ends
        with finish_reason "interrupted", leaving both caches consistent.
        """
        self._g.cancel()

    def finish(self) -> Result:
        """Run the generation to its end and return the result."""
        for _ in self:
            pass
        return self.result
