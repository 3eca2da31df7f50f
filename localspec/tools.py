"""Tool calls: the tools a chat offers, the grammar their calls follow, and the calls read back.

The chat template in the GGUF decides how tools are shown to the model. How
the model writes a call is the template's format too; localspec knows the one
Qwen2.5 (and the other Hermes-style templates) use: each call is a JSON object
``{"name": ..., "arguments": {...}}`` on its own line between the
``<tool_call>`` and ``</tool_call>`` tokens. A template that does not write
``<tool_call>`` is refused with tools rather than guessed at.

The calls are constrained: under ``tool_choice`` "required" or a function's
name the whole reply is calls; under "auto" the reply is free until the model
writes ``<tool_call>``, and from there the grammar holds (llama.cpp's lazy
grammar). Either way a call's arguments follow its function's parameter schema.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional, Sequence, Union

from .constraint import JSON_LAYOUT, Constraint
from .errors import ConfigError
from .options import GenerationOptions

if TYPE_CHECKING:  # a type only: importing the backend loads llama.cpp, which `localspec --help` must not wait for
    from .backend import Model

#: The tokens around one call in the Hermes format (Qwen2.5's template writes them).
OPEN, CLOSE = "<tool_call>", "</tool_call>"
#: The tool_choice words; any other choice names a function.
CHOICES = ("none", "auto", "required")
#: How a call starts once inside the tokens: its name, then its arguments (separators as the grammar writes).
_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?=\S)')
_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


@dataclass(frozen=True)
class Tool:
    """One function a model may call.

    Attributes:
        name: what the model calls it.
        parameters: the JSON schema of its arguments, as JSON text.
        description: what it does, for the model.
    """

    name: str
    parameters: str = '{"type": "object", "properties": {}}'
    description: Optional[str] = None

    @classmethod
    def from_openai(cls, value: Any, where: str = "tools[0]") -> Tool:
        """A tool from OpenAI's shape, ``{"type": "function", "function": {"name", "description",
        "parameters"}}``.

        Raises:
            ConfigError: not that shape (the message names the place, ``where``).
        """
        if not isinstance(value, Mapping) or value.get("type") != "function" or \
                not isinstance(value.get("function"), Mapping):
            raise ConfigError(f"{where} must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}.")
        fn = value["function"]
        unknown = sorted(set(fn) - {"name", "description", "parameters", "strict"})
        if unknown:
            raise ConfigError(f"{where}.function has {unknown[0]!r}, which localspec does not take; send name, "
                              "description and parameters.")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigError(f"{where}.function.name must be 1 to 64 letters, digits, '_', '.', ':' or '-', "
                              f"got {name!r}.")
        description = fn.get("description")
        if description is not None and not isinstance(description, str):
            raise ConfigError(f"{where}.function.description must be a string.")
        params = fn.get("parameters")
        if params is None or params == {}:  # OpenAI's function without arguments
            params = {"type": "object", "properties": {}}
        if not isinstance(params, Mapping):
            raise ConfigError(f"{where}.function.parameters must be a JSON schema object.")
        try:
            json.dumps(params)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}.function.parameters is not JSON ({exc}).") from None
        return cls(name, json.dumps(params), description)

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's shape, as chat templates render it."""
        fn: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            fn["description"] = self.description
        fn["parameters"] = json.loads(self.parameters)
        return {"type": "function", "function": fn}


@dataclass(frozen=True)
class ToolUse:
    """The tools a chat offers and how the model may use them.

    Attributes:
        tools: the functions offered.
        choice: "none" (the reply is text; the tools are not shown), "auto" (text or calls, the model
            decides), "required" (one call or more) or a function's name (a call of it).
        parallel: whether one reply may hold several calls.
    """

    tools: tuple[Tool, ...]
    choice: str = "auto"
    parallel: bool = True

    def __post_init__(self) -> None:
        names = [t.name for t in self.tools]
        if len(set(names)) < len(names):
            twice = next(n for n in names if names.count(n) > 1)
            raise ConfigError(f"Two tools are named {twice!r}; give each function one name.")
        if self.choice not in CHOICES and self.choice not in names:
            raise ConfigError(f"tool_choice names the function {self.choice!r}, which is not among the tools "
                              f"({', '.join(names) or 'none given'}).")
        if self.choice != "none" and not self.tools:
            raise ConfigError(f"tool_choice {self.choice!r} needs at least one tool.")
        reserved = next((n for n in names if n in CHOICES), None)
        if reserved is not None:
            raise ConfigError(f"A tool is named {reserved!r}, which is a tool_choice word; name the function "
                              "otherwise.")
        if not isinstance(self.parallel, bool):
            raise ConfigError(f"parallel_tool_calls must be true or false, got {self.parallel!r}.")

    @classmethod
    def from_openai(cls, tools: Optional[Sequence[Any]], tool_choice: Any = None,
                    parallel_tool_calls: Optional[bool] = None) -> Optional[ToolUse]:
        """The tool use OpenAI's request fields ask for (None when no tools are given).

        Raises:
            ConfigError: a tool, or the choice, is not in OpenAI's shape, or names an unknown function.
        """
        if not tools:
            if tool_choice not in (None, "none", "auto"):
                raise ConfigError(f"tool_choice {_choice_text(tool_choice)} needs tools; give 'tools'.")
            return None
        if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
            raise ConfigError("tools must be a list of {\"type\": \"function\", \"function\": {...}} objects.")
        parsed = tuple(t if isinstance(t, Tool) else Tool.from_openai(t, f"tools[{i}]") for i, t in enumerate(tools))
        return cls(parsed, _choice(tool_choice), True if parallel_tool_calls is None else parallel_tool_calls)

    def offered(self) -> list[dict[str, Any]]:
        """The tools as the chat template is given them (under choice "none" too, as OpenAI shows them: the
        prompt stays the same from turn to turn, and ``reply_options`` bans the call token instead)."""
        return [t.to_openai() for t in self.tools]

    def constraint(self) -> Optional[Constraint]:
        """The grammar the reply follows (None under choice "none": the reply is free text)."""
        if self.choice == "none":
            return None
        callable_ = [(i, t) for i, t in enumerate(self.tools) if self.choice in CHOICES or t.name == self.choice]
        defs: dict[str, Any] = {}
        calls = {"anyOf": [_call_schema(t, f"tool{i}", defs) for i, t in callable_], "$defs": defs,
                 "x-guidance": JSON_LAYOUT}
        more = ' ("\\n" call)*' if self.parallel else ""
        grammar = (f'start: call{more} "\\n"?\n'  # the newline a model may write before it ends
                   f'call: {OPEN} "\\n" body "\\n" {CLOSE}\n'
                   f"body: %json {json.dumps(calls)}\n")
        return Constraint("tools", grammar, trigger=OPEN if self.choice == "auto" else None)


def _call_schema(tool: Tool, key: str, defs: dict[str, Any]) -> dict[str, Any]:
    """One call's schema in the calls' union. The tool's parameters move into the union's ``$defs`` under
    ``key`` (its own ``$defs`` and ``definitions`` beside them, renamed), with every local ``$ref`` rewritten
    to match, since a pointer such as ``#/$defs/Item`` is read from the root of the whole schema."""
    params = json.loads(tool.parameters)
    if isinstance(params, dict):
        for dropped in ("$id", "$schema"):  # an $id would make the rewritten refs resolve inside it
            params.pop(dropped, None)
        for section in ("$defs", "definitions"):
            found = params.pop(section, None) or {}
            if not isinstance(found, dict):
                raise ConfigError(f"The parameters of the tool {tool.name!r} have a {section} that is not an object.")
            for name, sub in found.items():
                defs[f"{key}.{section.lstrip('$')}.{name}"] = _moved(sub, key)
    defs[key] = _moved(params, key)
    return {"type": "object", "properties": {"name": {"const": tool.name}, "arguments": {"$ref": f"#/$defs/{key}"}},
            "required": ["name", "arguments"], "additionalProperties": False}


#: Schema keywords whose values are JSON data, not schemas: a "$ref" inside them is a value, left as it is.
_VALUES = ("const", "enum", "default", "examples")


def _moved(schema: Any, key: str) -> Any:
    """``schema`` with its local ``$ref``s pointed at where ``_call_schema`` put what they name."""
    if isinstance(schema, list):
        return [_moved(s, key) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: v if k in _VALUES else _moved(v, key) for k, v in schema.items()}
    ref = schema.get("$ref")
    if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
        parts = ref[2:].split("/", 2) if ref != "#" else []
        if len(parts) >= 2 and parts[0] in ("$defs", "definitions"):  # into the tool's own definitions
            rest = "/" + parts[2] if len(parts) == 3 else ""
            out["$ref"] = f"#/$defs/{key}.{parts[0].lstrip('$')}.{parts[1]}{rest}"
        else:  # into the parameters themselves ("#": the whole of them)
            out["$ref"] = f"#/$defs/{key}" + ref[1:]
    return out


def _choice(value: Any) -> str:
    """A tool_choice (a word, a function's name, or OpenAI's ``{"type": "function", "function": {"name": ...}}``)
    as a word or a name."""
    if value is None:
        return "auto"
    if isinstance(value, str):
        return value
    fn = value.get("function") if isinstance(value, Mapping) and value.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(name, str):
        raise ConfigError(f"tool_choice must be none, auto, required or {{\"type\": \"function\", \"function\": "
                          f"{{\"name\": ...}}}}, got {_choice_text(value)}.")
    return name


def _choice_text(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_template(template: str, model: str) -> None:
    """Refuse tools for a chat template that does not write calls in the format localspec reads.

    Raises:
        ConfigError: the template never writes ``<tool_call>`` with a JSON ``"name"`` and ``arguments``
            (Qwen3-Coder's and GLM's templates write ``<tool_call>`` around XML-like calls instead).
    """
    hermes = OPEN in template and re.search(r'\\?"name\\?"', template) and "arguments" in template
    if not hermes or "<function=" in template:
        raise ConfigError(f"The chat template of {model} does not write tool calls as <tool_call> JSON (the "
                          "format of Qwen2.5 and other Hermes-style templates, the one localspec reads), so "
                          "localspec cannot offer it tools; use a model whose template does, or leave out tools.")


def reply_options(use: ToolUse, opts: GenerationOptions, target: Model) -> tuple[GenerationOptions, bool]:
    """``opts`` for a reply of ``target`` under ``use`` (the calls' grammar, or under "none" a ban on the call
    token), and whether its template is shown the tools (under "none" only where the ban holds it to text).

    Raises:
        ConfigError: the template or the vocabulary cannot write calls as localspec reads them, or ``opts``
            already has a grammar.
    """
    name, template = target.path.name, target.chat_template() or ""
    marks = [target.tokenize(m, add_special=False) for m in (OPEN, CLOSE)]
    single = all(len(m) == 1 and target.detokenize(m) == text for m, text in zip(marks, (OPEN, CLOSE), strict=True))
    if use.choice == "none":  # shown the tools, the model must not call one (whatever else biases it)
        if OPEN not in template or not single:
            return opts, False
        return opts.replace(logit_bias={**dict(opts.logit_bias), marks[0][0]: -100.0}), True
    check_template(template, name)
    if not single:
        raise ConfigError(f"{name} has no single {OPEN} and {CLOSE} tokens that print as themselves, which "
                          "its template's tool calls need; localspec cannot read its calls.")
    if opts.grammar is not None:
        raise ConfigError(f"A reply that may call tools follows the calls' grammar, so it cannot also follow "
                          f"{opts.grammar.describe()}; leave one out (or give tool_choice 'none').")
    return opts.replace(grammar=use.constraint()), True


def template_messages(messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages as templates read them: an earlier call's arguments as an object, not JSON text."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [_template_call(c) for c in m["tool_calls"]]
        out.append(m)
    return out


def _template_call(call: Mapping[str, Any]) -> dict[str, Any]:
    fn = dict(call.get("function") or {})
    if isinstance(fn.get("arguments"), str):
        try:
            fn["arguments"] = json.loads(fn["arguments"])
        except ValueError:
            pass  # not JSON: the template shows it as the text it is
    return {**call, "function": fn}


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
    could tell so far. Text that might still turn out to be the start of
    ``<tool_call>`` is held back until it can be told; a call's arguments end
    where their JSON value closes. A call cut off by max_tokens is kept with
    the arguments it has (``cut`` then says so), unless it was cut before its
    name.
    """

    calls: list[ToolCall] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    cut: bool = False  # the reply ended inside a call (max_tokens, or a stop string)
    _buf: str = ""
    _in_call: bool = False
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

    def _read_content(self, out: list[CallEvent], final: bool) -> None:
        at = self._buf.find(OPEN)
        if at >= 0:
            text = self._buf[:at]
            self._say(out, text.rstrip())
            self._gap = text[len(text.rstrip()):]
            self._buf, self._in_call = self._buf[at + len(OPEN):], True
            return
        if self._after_call:  # the newlines between calls are nobody's content
            self._buf = self._buf.lstrip()
            self._after_call = not self._buf
        cut = len(self._buf) - (0 if final else _held(self._buf))
        self._say(out, self._buf[:cut])
        self._buf = self._buf[cut:]

    def _read_call(self, out: list[CallEvent], final: bool) -> None:
        if self._closing:
            end = self._buf.find(CLOSE)
            if end >= 0 or final:
                self._buf = self._buf[end + len(CLOSE):] if end >= 0 else ""
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
        """Read ``{"name": ..., "arguments": `` once it is all there; whether it was."""
        header = _HEADER.match(self._buf)
        if header is None:
            end = self._buf.find(CLOSE)
            start = self._buf.lstrip()
            if end >= 0 or (start and not start.startswith("{")) or (final and not start):
                # not a call after all (only where no grammar held it, as a <tool_call> spelt in pieces under
                # "auto"): the text it was, to its </tool_call> if it has one
                upto = end + len(CLOSE) if end >= 0 else len(self._buf)
                self._say(out, self._gap + OPEN + self._buf[:upto])
                self._buf, self._in_call = self._buf[upto:], False
            elif final:  # a call cut off before its name (max_tokens): nothing to give
                self._buf, self._in_call, self.cut = "", False, True
            return False
        self._name, self._id = _unquote(header.group(1)), "call_" + uuid.uuid4().hex[:24]
        self._buf = self._buf[header.end():]
        self._depth, self._string, self._escape, self._scalar = 0, False, False, False
        out.append(CallEvent("call", self._name, len(self.calls), self._id))
        return True

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


def _held(text: str) -> int:
    """How many characters at the end of ``text`` could begin ``<tool_call>``, with the whitespace before them."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-n:]):
            return n + len(text[:-n]) - len(text[:-n].rstrip())
    return len(text) - len(text.rstrip())


def read_calls(text: str) -> CallReader:
    """A whole reply, read: its ``content`` pieces, its ``calls``, and whether it was ``cut`` inside one."""
    reader = CallReader()
    reader.feed(text)
    reader.close()
    return reader


def tool_use(tools: Union[None, ToolUse, Sequence[Any]], tool_choice: Any = None,
             parallel_tool_calls: Optional[bool] = None) -> Optional[ToolUse]:
    """A ``ToolUse`` from what the Python API takes: one already built, or OpenAI's tool list and fields."""
    if isinstance(tools, ToolUse) or tools is None:
        if tools is None and tool_choice not in (None, "none", "auto"):
            raise ConfigError(f"tool_choice {_choice_text(tool_choice)} needs tools.")
        return tools
    return ToolUse.from_openai(tools, tool_choice, parallel_tool_calls)
