"""A reply's tool calls, read back as it streams: ``CallReader``, and ``ToolCall`` in OpenAI's shape.

The formats are the ones ``localspec.structured.tool_use`` constrains calls to:

* Qwen2.5's and the other Hermes-style templates': ``<tool_call>``, a newline, ``{"name": ..., "arguments":
  ...}``, a newline, ``</tool_call>``;
* GPT-OSS's harmony messages: ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>``, then
  the arguments' JSON (the ``<|call|>`` that ends the reply is not text). The recipient may also come
  before the channel, where the message header begins the reply's answer (``to=functions.NAME<|channel|>
  commentary json<|message|>``: the reasoning reader drops the ``<|start|>assistant`` before it).

Where no grammar holds a call (``tool_choice`` "auto"), a Hermes-style model may also write its call as a
Markdown block, or as the bare object, instead (Qwen2.5-Coder does, under long agent prompts): a reply whose
first thing is ``{"name": ..., "arguments": {...}}`` with the name of a tool offered, in a ```` ```json ````
(or bare ```` ``` ````) block or without one, is read as that call.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Optional

from .tool_use import CLOSE, HARMONY_OPENS, HARMONY_TO, OPEN, ToolUse, may_call, offered

#: How a call starts once inside the tokens: its name, then its arguments (separators as the grammar writes).
_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?=\S)')
#: The rest of a harmony call's header, after ``to=functions.``: the name, the channel where the recipient came
#: first, the content type (``<|constrain|>json`` or ``json``), then ``<|message|>``.
_HARMONY_HEADER = re.compile(r"([A-Za-z0-9_.:-]+)(?:<\|channel\|>(?:commentary|analysis))?\s*(?:<\|constrain\|>)?"
                             r"\s*[A-Za-z0-9_-]*\s*<\|message\|>")
#: The longest header a harmony call has before its ``<|message|>`` (longer: not a call).
_HARMONY_LONGEST = 160
#: A Markdown code block's fence, which also ends a call written as one.
FENCE = "```"
#: The first line of a code block that may hold a call: its fence and no language, or JSON.
_FENCE_LINE = re.compile(r"```[ \t]*(?:json)?[ \t]*\n", re.IGNORECASE)
#: A fenced call's header with whitespace taken out, as far as its arguments' opening brace.
_FENCED_CANON = ('{"name":"', '","arguments":{')


@dataclass(frozen=True)
class ToolCall:
    """One call the model made.

    Attributes:
        id: its id, for the ``tool`` message that answers it.
        name: the function called.
        arguments: the arguments, as JSON text (as OpenAI gives them).
    """

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class CallEvent:
    """What reading more of a reply found: ``content`` text, a call's start (``name``, ``id``), or more of a
    call's ``arguments``; ``index`` is the call's place in the reply."""

    kind: str  # "content", "call" or "arguments"
    text: str = ""
    index: int = 0
    id: str = ""


@dataclass
class CallReader:
    """Reads a reply as it streams: its text content, and the tool calls in it.

    Feed it text with ``feed`` and end with ``close``; each returns what it
    could tell so far. Text that might still turn out to be the start of a
    call (``<tool_call>``, or a harmony call's header) is held back until it
    can be told; a call's arguments end where their JSON value closes. A call
    cut off by max_tokens is kept with the arguments it has (``cut`` then says
    so), unless it was cut before its name.
    """

    calls: list[ToolCall] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    cut: bool = False  # the reply ended inside a call (max_tokens, or a stop string)
    fenced: frozenset[str] = frozenset()  # the tools a call written as a ```json block may name
    _buf: str = ""
    _in_call: bool = False
    _opening: str = OPEN  # how the open call began: OPEN, a harmony header's start, or a code block's first line
    _close: str = CLOSE  # what ends it after its arguments: CLOSE, FENCE, or nothing (harmony: <|call|>)
    _gap: str = ""  # the whitespace before the open call's <tool_call>, given back if it is no call
    _name: Optional[str] = None  # the open call's name, once its header is read
    _id: str = ""  # and its id
    _args: list[str] = field(default_factory=list)  # the open call's arguments sent so far
    _closing: bool = False  # its arguments are complete; what is left of it runs to </tool_call>
    _after_call: bool = False  # a call has just closed (the whitespace that follows is dropped)
    _scalar: bool = False  # the arguments are a bare number or word (not an object), read to a delimiter
    _depth: int = 0  # where the arguments' JSON stands: nesting, inside a string, after a backslash
    _string: bool = False
    _escape: bool = False

    def feed(self, text: str) -> list[CallEvent]:
        self._buf += text
        return self._read(final=False)

    def close(self) -> list[CallEvent]:
        return self._read(final=True)

    def _read(self, final: bool) -> list[CallEvent]:
        out: list[CallEvent] = []
        while True:
            before = (self._buf, self._in_call, self._name, self._closing)
            if self._in_call:
                self._read_call(out, final)
            else:
                self._read_content(out, final)
            if (self._buf, self._in_call, self._name, self._closing) == before:
                return out

    def _fresh(self) -> bool:
        """Nothing of the reply has been read as content or calls yet (a harmony header may begin it)."""
        return not self.content and not self.calls

    def _first_opening(self) -> tuple[int, str]:
        """Where the first call in the buffer begins and the text it begins with; (-1, "") where none does."""
        hits = [(at, m) for m in (OPEN, *HARMONY_OPENS) if (at := self._buf.find(m)) >= 0]
        start = len(self._buf) - len(self._buf.lstrip())
        if self._fresh() and self._buf.startswith(HARMONY_TO, start):
            hits.append((start, HARMONY_TO))
        return min(hits, default=(-1, ""))

    def _read_content(self, out: list[CallEvent], final: bool) -> None:
        if self.fenced and not self.content:  # a call written as a code block can only come first
            fence = _fenced_call(self._buf, self.fenced, final)
            if fence is None:  # it may still be one: wait for more
                return
            if fence >= 0:
                lead = len(self._buf) - len(self._buf.lstrip())
                block = self._buf.startswith(FENCE, lead)  # else the bare object, which its own brace ends
                self._gap, self._opening = self._buf[:lead], self._buf[lead:fence]
                self._close = FENCE if block else "}"
                self._buf, self._in_call = self._buf[fence:], True
                return
        at, opening = self._first_opening()
        if at >= 0:
            text = self._buf[:at]
            self._say(out, text.rstrip())
            self._gap = text[len(text.rstrip()):]
            self._opening, self._close = opening, CLOSE if opening == OPEN else ""
            self._buf, self._in_call = self._buf[at + len(opening):], True
            return
        if self._after_call:  # the newlines between calls are nobody's content
            self._buf = self._buf.lstrip()
            self._after_call = not self._buf
        cut = len(self._buf) - (0 if final else _held(self._buf, self._fresh()))
        self._say(out, self._buf[:cut])
        self._buf = self._buf[cut:]

    def _read_call(self, out: list[CallEvent], final: bool) -> None:
        if self._closing and not self._close:  # a harmony call ends with its arguments (<|call|> is no text)
            self._in_call = self._closing = False
            self._after_call = True
            return
        if self._closing:
            end = self._buf.find(self._close)
            if end >= 0 or final:
                self._buf = self._buf[end + len(self._close):] if end >= 0 else ""
                self._in_call = self._closing = False
                self._after_call = True
            return
        if self._name is None and not self._read_header(out, final):
            return
        end = self._arguments_end()
        self._send(out, self._buf[:end])
        self._buf = self._buf[end:]
        complete = self._depth == 0 and not self._string and not self._scalar and bool(self._args)
        if complete or final:
            assert self._name is not None
            self.calls.append(ToolCall(self._id, self._name, "".join(self._args)))
            self.cut = self.cut or not complete
            self._name, self._args, self._closing = None, [], True

    def _read_header(self, out: list[CallEvent], final: bool) -> bool:
        """Read the call's header (``{"name": ..., "arguments": ``, or a harmony call's name, channel and type)
        once it is all there; whether it was."""
        if not self._close:
            return self._read_harmony_header(out, final)
        header = _HEADER.match(self._buf)
        if header is None:
            end = self._buf.find(self._close)
            start = self._buf.lstrip()
            if end >= 0 or (start and not start.startswith("{")) or (final and not start):
                # not a call after all (only where no grammar held it, as a <tool_call> spelt in pieces under
                # "auto"): the text it was, to its </tool_call> if it has one
                upto = end + len(self._close) if end >= 0 else len(self._buf)
                self._say(out, self._gap + self._opening + self._buf[:upto])
                self._buf, self._in_call = self._buf[upto:], False
            elif final:  # a call cut off before its name (max_tokens): nothing to give
                self._buf, self._in_call, self.cut = "", False, True
            return False
        self._start_call(out, _unquote(header.group(1)), header.end())
        return True

    def _read_harmony_header(self, out: list[CallEvent], final: bool) -> bool:
        header = _HARMONY_HEADER.match(self._buf)
        if header is None:
            if "<|message|>" in self._buf or "\n" in self._buf or len(self._buf) > _HARMONY_LONGEST \
                    or (final and not self._buf):
                # not a call after all (only where no grammar held it): the text it was
                self._say(out, self._gap + self._opening + self._buf)
                self._buf, self._in_call = "", False
            elif final:  # a call cut off in its header (max_tokens): nothing to give
                self._buf, self._in_call, self.cut = "", False, True
            return False
        self._start_call(out, header.group(1), header.end())
        return True

    def _start_call(self, out: list[CallEvent], name: str, header_end: int) -> None:
        """A call's header has been read (to ``header_end`` in the buffer): its arguments come next."""
        self._name, self._id = name, "call_" + uuid.uuid4().hex[:24]
        self._buf = self._buf[header_end:]
        self._depth, self._string, self._escape, self._scalar = 0, False, False, False
        out.append(CallEvent("call", self._name, len(self.calls), self._id))

    def _arguments_end(self) -> int:
        """How much of the buffer is still the call's arguments: up to where their JSON value closes (tracked
        across pieces, so a '}' or '</tool_call>' inside a string is not taken for the end), else all of it."""
        for i, c in enumerate(self._buf):
            if self._scalar or (self._depth == 0 and not self._string and c not in '{["'):
                if c in ",}]" or c.isspace():  # a bare value ends at its first delimiter
                    self._scalar = False
                    return i
                self._scalar = True
            elif self._string:
                if self._escape:
                    self._escape = False
                elif c == "\\":
                    self._escape = True
                elif c == '"':
                    self._string = False
                    if self._depth == 0:
                        return i + 1
            elif c == '"':
                self._string = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth <= 0:
                    self._depth = 0
                    return i + 1
        return len(self._buf)

    def _send(self, out: list[CallEvent], text: str) -> None:
        if text:
            self._args.append(text)
            out.append(CallEvent("arguments", text, len(self.calls)))

    def _say(self, out: list[CallEvent], text: str) -> None:
        if text:
            self.content.append(text)
            out.append(CallEvent("content", text))


def _unquote(text: str) -> str:
    try:
        return str(json.loads(f'"{text}"'))
    except ValueError:  # not a JSON string's inside (only where no grammar held the call)
        return text


def _held(text: str, fresh: bool = False) -> int:
    """How many characters at the end of ``text`` could begin a call, with the whitespace before them (``fresh``:
    nothing was read before ``text``, where a harmony header's ``to=functions.`` may begin a call)."""
    if fresh and HARMONY_TO.startswith(text.lstrip()):
        return len(text)
    n = max((n for m in (OPEN, *HARMONY_OPENS) for n in range(1, min(len(m) - 1, len(text)) + 1)
             if m.startswith(text[-n:])), default=0)
    if n:
        return n + len(text[:-n]) - len(text[:-n].rstrip())
    return len(text) - len(text.rstrip())


def _fenced_call(text: str, names: Collection[str], final: bool) -> Optional[int]:
    """Whether ``text``, a reply's start, is a call written as a code block or a bare object: where its JSON
    object begins (after the block's first line) if it is one naming a tool of ``names``, -1 if it is not,
    None if it may still be (more text will tell; never once ``final``)."""
    body = text.lstrip()
    lead = len(text) - len(body)
    line = _FENCE_LINE.match(body)
    start = line.end() if line is not None else 0
    if line is None and not body.startswith("{"):
        # no code block's first line yet: one may come only while the text is still short of it
        maybe = "\n" not in body and len(body) < 16 and (body.startswith(FENCE) or FENCE.startswith(body))
        return None if maybe and not final else -1
    rest = body[start:]
    header = _HEADER.match(rest)
    if header is not None and rest[header.end()] == "{":
        return lead + start if _unquote(header.group(1)) in names else -1
    squeezed = "".join(rest.split())  # names and JSON keys hold no whitespace; what is left is the header's shape
    opening, middle = _FENCED_CANON
    if len(squeezed) <= len(opening):
        maybe = opening.startswith(squeezed)
    elif not squeezed.startswith(opening):
        maybe = False
    else:
        name, quote, after = squeezed[len(opening):].partition('"')
        maybe = (any(n.startswith(name) for n in names) if not quote
                 else name in names and middle.startswith('"' + after))
    return None if maybe and not final else -1


def call_reader(use: Optional[ToolUse]) -> Optional[CallReader]:
    """The reader of a reply's calls under ``use``: None where the reply may hold none (no tools offered, or
    tool_choice "none")."""
    return CallReader(fenced=offered(use)) if may_call(use) else None


def read_calls(text: str, fenced: Collection[str] = frozenset()) -> CallReader:
    """A whole reply, read: its ``content`` pieces, its ``calls``, and whether it was ``cut`` inside one
    (``fenced``: the tools a call written as a code block may name)."""
    reader = CallReader(fenced=frozenset(fenced))
    reader.feed(text)
    reader.close()
    return reader
