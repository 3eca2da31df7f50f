"""A model's reasoning: the format its chat template writes, its marker tokens, and the switches for it.

``model_reasoning`` reads a loaded model's template and vocabulary once per generation: a template that
writes ``<think>``, ``[THINK]`` or harmony's channels makes the model a reasoning model (``ModelReasoning``); any other
model has none, and its replies are read and constrained exactly as before.

Thinking is switched by the template's own variable where it has one (Qwen3's ``enable_thinking``), else by
the model's documented soft switch (``/think`` and ``/no_think`` at the end of the last user message, for
Qwen's ChatML templates). With thinking off, a reply that reasons all the same is made to close its
reasoning at once (a budget of 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from ..options import GenerationOptions
from ..runtime.model import Model
from ..structured.grammar import GrammarState
from .formats import FORMATS, THINK, THINK_VARIABLE, Piece, ReasoningFormat, ReasoningReader, joined, opened_in
from .gate import ReasoningGate

#: The soft switches Qwen documents for its ChatML templates without the variable: (on, off).
SOFT_SWITCH = ("/think", "/no_think")
#: How many prompt tokens are rendered to see whether the template opened the reasoning.
_TAIL_TOKENS = 16


@dataclass(frozen=True)
class ModelReasoning:
    """How one model writes its reasoning.

    Attributes:
        fmt: the format its template writes.
        template: the chat template.
        marks: marker tokens the detokenizer leaves out (harmony's control tokens), and their text.
        open_token: the one token that opens reasoning at the start of a reply, if there is one.
        ends: token sequences after which the answer begins.
        closes: token sequences that close the reasoning (for a channel format, where the next message begins).
        close: the tokens that close reasoning early.
        separator: the tokens between the close and a constrained answer.
    """

    fmt: ReasoningFormat
    template: str
    marks: Mapping[int, str]
    open_token: Optional[int]
    ends: tuple[tuple[int, ...], ...]
    closes: tuple[tuple[int, ...], ...]
    close: tuple[int, ...]
    separator: tuple[int, ...]

    def inside(self, target: Model, prompt_tokens: Sequence[int], prompt_text: Optional[str]) -> bool:
        """Whether the reply to this prompt starts inside the reasoning (the template opened it)."""
        if prompt_text is None:
            prompt_text = "".join(self.text(t, target.detokenize([t])) for t in prompt_tokens[-_TAIL_TOKENS:])
        return opened_in(prompt_text[-256:], self.fmt)

    def text(self, token: int, text: str) -> str:
        """A token's text for the reader: a marker token as its text, any other as the text it gave."""
        return self.marks.get(token, text)

    def gate(self, inner: Optional[GrammarState], end_token: int, inside: bool, budget: Optional[int],
             close: Optional[Sequence[int]] = None,
             ends: Optional[Sequence[Sequence[int]]] = None) -> ReasoningGate:
        """The grammar state for a reply with this reasoning, ``budget`` and answer grammar ``inner`` (``close``:
        other tokens to close the reasoning with; ``ends``: other sequences after which the answer begins)."""
        return ReasoningGate(inner, end_token, inside=inside, open_token=self.open_token,
                             ends=self.ends if ends is None else ends, close=self.close if close is None else close,
                             separator=self.separator, budget=budget)

    def switched(self, messages: Sequence[Mapping[str, Any]],
                 think: Optional[bool]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The messages and template variables that turn thinking on or off (None: as the template has it)."""
        out = [dict(m) for m in messages]
        if think is None:
            return out, {}
        if THINK_VARIABLE in self.template:
            return out, {THINK_VARIABLE: think}
        users = [m for m in out if m.get("role") == "user" and isinstance(m.get("content"), str)]
        if self.fmt is THINK and "<|im_start|>" in self.template and users:
            users[-1]["content"] = f"{users[-1]['content']} {SOFT_SWITCH[0] if think else SOFT_SWITCH[1]}"
        return out, {}


class TokenReader:
    """Splits a stream of generated tokens (with their text) into reasoning and answer.

    Args:
        reasoning: the model's reasoning.
        inside: the reply starts inside the reasoning.
    """

    def __init__(self, reasoning: ModelReasoning, inside: bool):
        self._r = reasoning
        self._reader = ReasoningReader(reasoning.fmt, inside)

    def feed(self, token: int, text: str) -> tuple[str, str]:
        """The (reasoning, answer) text this token completes."""
        return self._take(self._reader.feed(self._r.text(token, text)))

    def flush(self, text: str = "") -> tuple[str, str]:
        """The (reasoning, answer) text left once the reply has ended (``text``: its last, held-back text)."""
        return self._take(self._reader.feed(text) + self._reader.flush())

    def _take(self, pieces: list[Piece]) -> tuple[str, str]:
        reasoning, answer = joined(self._reader, pieces)
        return reasoning or "", answer

    @property
    def reasoned(self) -> bool:
        """True once the reply's reasoning began (or the prompt opened it)."""
        return self._reader.reasoned

    @property
    def inside(self) -> bool:
        """True while the tokens read so far end inside the reasoning."""
        return self._reader.inside


def model_reasoning(target: Model) -> Optional[ModelReasoning]:
    """How ``target`` writes its reasoning, from its chat template and vocabulary; None for a model that does
    not reason (no template writes the markers, or its vocabulary lacks them)."""
    template = target.chat_template() or ""
    fmt = next((f for f in FORMATS if any(m in template for m in f.signs)), None)
    if fmt is None:
        return None

    def ids(text: str) -> tuple[int, ...]:
        return tuple(target.tokenize(text, add_special=False, parse_special=True))

    texts = (*fmt.opens, *fmt.closes, *fmt.answers, *fmt.drops, *fmt.keeps, fmt.close)
    marks = {t: target.special_text(t) for m in texts for t in ids(m)
             if not target.token_bytes(t) and target.special_text(t)}
    opened = ids(fmt.opens[0])
    return ModelReasoning(fmt, template, marks, opened[0] if len(opened) == 1 and not fmt.reopens else None,
                          tuple(ids(m) for m in (fmt.answers or fmt.closes)), tuple(ids(m) for m in fmt.closes),
                          ids(fmt.close), ids(fmt.separator))



def reply_reading(target: Model, opts: GenerationOptions, prompt_tokens: Sequence[int], prompt_text: Optional[str],
                  inner: Optional[GrammarState]) -> tuple[Optional[GrammarState], Optional[TokenReader]]:
    """The grammar state a reply follows (``inner``, the constraint's, behind a gate that leaves the reasoning
    free and keeps its budget) and the reader that splits it; for a model that does not reason, ``inner``
    alone and no reader."""
    reasoning = model_reasoning(target)
    if reasoning is None:
        return inner, None
    inside = reasoning.inside(target, prompt_tokens, prompt_text)
    budget = 0 if opts.think is False else opts.think_budget
    gated = inner is not None or budget is not None
    # a channel format's reply is reasoning until its answer's channel opens, as far as the gate goes; with
    # nothing written yet, a budget of 0 goes straight to that channel
    channels = reasoning.fmt.reopens
    close = reasoning.ends[0] if channels and not inside and budget == 0 else None
    if channels and inner is not None and opts.grammar is not None and opts.grammar.kind == "tools":
        # a harmony call is a message of its own: its grammar holds from the end of the analysis channel (or
        # from a final channel's start); with nothing written yet, a budget of 0 goes straight to the call
        ends = (*reasoning.closes, *reasoning.ends)
        at_once = not inside and budget == 0
        return (reasoning.gate(inner, target.eos, not at_once, budget, reasoning.closes[0], ends),
                TokenReader(reasoning, inside))
    gate = reasoning.gate(inner, target.eos, inside or channels, budget, close) if gated else None
    return gate, TokenReader(reasoning, inside)
