"""Reasoning in a reply: where a model's thinking ends and its answer begins.

A reasoning model writes its thinking first, marked the way its chat template
marks it: ``<think>...</think>`` (Qwen3, DeepSeek-R1 distills and most
others), ``[THINK]...[/THINK]`` (Magistral) or GPT-OSS's harmony channels (``<|channel|>analysis<|message|>
...<|end|>``, then ``<|channel|>final<|message|>`` before the answer). A
``ReasoningFormat`` names those markers; a ``ReasoningReader`` splits text, fed
whole or in chunks cut anywhere (a marker may straddle two chunks), into
reasoning and answer. The split does not depend on how the text was chunked.

The reader sees text only; the caller renders marker tokens that a model's
detokenizer leaves out (harmony's control tokens) as their text (see
``localspec.reasoning.template``). This module imports nothing but the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

#: What a piece of reply text is.
REASONING = "reasoning"
ANSWER = "answer"

_START, _REASONING, _ANSWER = "start", "reasoning", "answer"
#: The template variable that turns thinking on or off (Qwen3's; other templates read it too).
THINK_VARIABLE = "enable_thinking"


@dataclass(frozen=True)
class ReasoningFormat:
    """How one family of templates marks a reply's reasoning.

    Attributes:
        name: "think", "brackets" or "harmony".
        opens: texts that begin reasoning.
        closes: texts that end it.
        answers: texts that begin the answer (harmony's final channel), wherever they come.
        drops: control texts that are neither reasoning nor answer.
        reopens: reasoning may begin again after an answer began (harmony's channels); otherwise it opens only
            at the start of a reply.
        close: what the model is made to write to end its reasoning early (a budget, thinking off).
        separator: what follows ``close`` before a constrained answer (the template's own spacing).
        signs: texts a chat template that writes this format has in it.
        keeps: control texts that pass into the answer as they are (a harmony tool call's header).
    """

    name: str
    opens: tuple[str, ...]
    closes: tuple[str, ...]
    answers: tuple[str, ...] = ()
    drops: tuple[str, ...] = ()
    reopens: bool = False
    close: str = ""
    separator: str = ""
    signs: tuple[str, ...] = ()
    keeps: tuple[str, ...] = ()


THINK = ReasoningFormat("think", opens=("<think>",), closes=("</think>",), close="\n</think>", separator="\n\n",
                        signs=("<think>", "</think>"))
HARMONY = ReasoningFormat("harmony", opens=("<|channel|>analysis<|message|>",), closes=("<|end|>",),
                          answers=("<|channel|>final<|message|>",), drops=("<|start|>assistant",), reopens=True,
                          close="<|end|><|start|>assistant<|channel|>final<|message|>", signs=("<|channel|>",),
                          keeps=("<|channel|>", "<|constrain|>", "<|message|>"))
#: Magistral's (from 2509 on): its own control tokens around the reasoning.
BRACKETS = ReasoningFormat("brackets", opens=("[THINK]",), closes=("[/THINK]",), close="[/THINK]",
                           signs=("[THINK]",))
#: The formats there are, in the order a model's template is matched against them.
FORMATS = (HARMONY, BRACKETS, THINK)


class Piece(NamedTuple):
    """A run of reply text and what it is (``REASONING`` or ``ANSWER``)."""

    kind: str
    text: str


class ReasoningReader:
    """Splits one reply's text into reasoning and answer as it streams.

    Whitespace around the reasoning, and between its end and the answer, is dropped; a reply without
    reasoning comes out as one answer, unchanged.

    Args:
        fmt: the model's format.
        inside: the reply starts inside the reasoning (the template opened it at the end of the prompt).
    """

    def __init__(self, fmt: ReasoningFormat, inside: bool = False):
        self.fmt = fmt
        self._state = _REASONING if inside else _START
        self.reasoned = inside  #: True once any reasoning began
        self._held = ""  # text that may begin a marker
        self._space = ""  # whitespace not yet known to be inside the reasoning or the answer
        self._trim = inside  # drop the whitespace that starts the current part

    @property
    def inside(self) -> bool:
        """True while the text read so far ends inside the reasoning."""
        return self._state == _REASONING

    def feed(self, text: str) -> list[Piece]:
        """The pieces ``text`` completes (text that could begin a marker waits for the next chunk)."""
        out: list[Piece] = []
        buf = self._held + text
        while buf:
            found = self._first_marker(buf)
            if found is None:
                keep = self._partial_tail(buf)
                self._held = buf[len(buf) - keep:]
                self._text(buf[:len(buf) - keep], out)
                return out
            at, marker, state = found
            before = self._state
            self._text(buf[:at], out)
            if self._state != before:  # the text before it began the answer: the marker may not count there
                buf = buf[at:]
                continue
            self._enter(state)
            buf = buf[at + len(marker):]
        self._held = ""
        return out

    def flush(self) -> list[Piece]:
        """What is held back, once the reply has ended (unfinished reasoning keeps what it had)."""
        held, self._held = self._held, ""
        out: list[Piece] = []
        self._text(held, out)
        if self._state == _START and self._space:
            out.append(Piece(ANSWER, self._space))
        self._space = ""
        return out

    def _markers(self) -> list[tuple[str, str]]:
        """(marker, state it leads to) for the markers that count in the current state."""
        f, state = self.fmt, self._state
        marks = [(m, state) for m in f.drops] + [(m, _ANSWER) for m in f.answers]
        if state in (_START, _ANSWER) and (state == _START or f.reopens):
            marks += [(m, _REASONING) for m in f.opens]
        if state == _REASONING or f.reopens:
            marks += [(m, _ANSWER) for m in f.closes]
        return marks

    def _first_marker(self, buf: str) -> Optional[tuple[int, str, str]]:
        hits = [(i, -len(m), m, s) for m, s in self._markers() if (i := buf.find(m)) >= 0]
        if not hits:
            return None
        at, _, marker, state = min(hits)
        return at, marker, state

    def _partial_tail(self, buf: str) -> int:
        """The longest tail of ``buf`` that a marker could begin with."""
        return max((n for m, _ in self._markers() for n in range(1, min(len(m) - 1, len(buf)) + 1)
                    if buf.endswith(m[:n])), default=0)

    def _enter(self, state: str) -> None:
        if state != self._state:
            self._space = ""  # whitespace at the end of a part goes with it
            self._trim = True
        self.reasoned |= state == _REASONING
        self._state = state

    def _text(self, text: str, out: list[Piece]) -> None:
        """Add text that holds no marker to ``out``, under the current state."""
        if not text:
            return
        if self._state == _START:  # leading whitespace waits to see whether reasoning opens
            self._space += text
            if not self._space.strip():
                return
            self._state, text, self._space = _ANSWER, self._space, ""
            out.append(Piece(ANSWER, text))
            return
        if self._trim:
            text = text.lstrip()
            self._trim = not text
        kind = REASONING if self._state == _REASONING else ANSWER
        if kind == REASONING:  # trailing whitespace waits: the close drops it
            body = text.rstrip()
            text, space = (self._space + body, text[len(body):]) if body else ("", self._space + text)
            self._space = space
        if text:
            out.append(Piece(kind, text))


def split(text: str, fmt: ReasoningFormat, inside: bool = False) -> tuple[Optional[str], str]:
    """A whole reply's (reasoning, answer); reasoning is None when the reply has none.

    Args:
        text: the reply.
        fmt: the model's format.
        inside: the reply starts inside the reasoning (see ``ReasoningReader``).
    """
    reader = ReasoningReader(fmt, inside)
    return joined(reader, reader.feed(text) + reader.flush())


def joined(reader: ReasoningReader, pieces: list[Piece]) -> tuple[Optional[str], str]:
    """``pieces`` from ``reader`` as (reasoning or None where it had none, answer)."""
    reasoning = "".join(p.text for p in pieces if p.kind == REASONING)
    return (reasoning if reader.reasoned else None), "".join(p.text for p in pieces if p.kind == ANSWER)


def opened_in(prompt_tail: str, fmt: ReasoningFormat) -> bool:
    """Whether a prompt ending in ``prompt_tail`` leaves its reply inside the reasoning (the template opened it)."""
    tail = prompt_tail.rstrip()
    return any(tail.endswith(m) for m in fmt.opens)
