"""Tool calls: the tools a chat offers, the grammar their calls follow, and a reply's options under them.

The chat template in the GGUF decides how tools are shown to the model. How
the model writes a call is the template's format too; localspec knows two:

* Qwen2.5's (and the other Hermes-style templates'): each call is a JSON object
  ``{"name": ..., "arguments": {...}}`` on its own line between the
  ``<tool_call>`` and ``</tool_call>`` tokens;
* GPT-OSS's harmony messages: after the analysis channel, one call per reply,
  ``<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json
  <|message|>{...}<|call|>``.

A template that writes neither is refused with tools rather than guessed at.
``call_reader`` reads the calls back out of a reply, as it streams.

The calls are constrained: under ``tool_choice`` "required" or a function's
name the whole reply is calls (after a reasoning model's reasoning); under
"auto" a Hermes reply is free until the model writes ``<tool_call>``, and from
there the grammar holds (llama.cpp's lazy grammar), while a harmony reply is
free throughout (its calls are read as the model writes them). Where a grammar
holds, a call's arguments follow its function's parameter schema.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional, Sequence, Union

from ..constraint import JSON_LAYOUT, Constraint
from ..errors import ConfigError, ToolsUnsupportedError
from ..options import GenerationOptions

#: Tool schemas come from an agent's tool list, written for hosted models: a keyword the grammar engine does
#: not implement (``propertyNames``, say) is left out of the call's grammar, which then admits a little more
#: than the schema, rather than refusing the whole request.
TOOL_JSON_LAYOUT = {**JSON_LAYOUT, "lenient": True}

if TYPE_CHECKING:  # a type only: importing the backend loads llama.cpp, which `localspec --help` must not wait for
    from ..runtime.model import Model

#: The tokens around one call in the Hermes format (Qwen2.5's template writes them).
OPEN, CLOSE = "<tool_call>", "</tool_call>"
#: A harmony call's recipient, and the headers a call on a channel begins with (the name follows).
HARMONY_TO = "to=functions."
HARMONY_OPENS = ("<|channel|>commentary " + HARMONY_TO, "<|channel|>analysis " + HARMONY_TO)
#: The control tokens a harmony call is written with, each one token of the vocabulary.
HARMONY_TOKENS = ("<|start|>", "<|channel|>", "<|constrain|>", "<|message|>", "<|call|>")
#: The call formats: Hermes-style ``<tool_call>`` JSON, and GPT-OSS's harmony messages.
HERMES, HARMONY = "hermes", "harmony"
#: The tool_choice words; any other choice names a function.
CHOICES = ("none", "auto", "required")
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

    def calls_schema(self) -> dict[str, Any]:
        """The JSON Schema of one call, ``{"name": ..., "arguments": ...}``, of any tool the choice allows."""
        callable_ = [(i, t) for i, t in enumerate(self.tools) if self.choice in CHOICES or t.name == self.choice]
        defs: dict[str, Any] = {}
        return {"anyOf": [_call_schema(t, f"tool{i}", defs) for i, t in callable_], "$defs": defs}

    def constraint(self, fmt: str = HERMES) -> Optional[Constraint]:
        """The grammar the reply follows, its calls written in ``fmt`` (``HERMES`` or ``HARMONY``); None where
        the reply is free: under choice "none", and a harmony reply under "auto"."""
        if self.choice == "none" or (fmt == HARMONY and self.choice == "auto"):
            return None
        if fmt == HARMONY:
            return Constraint("tools", self._harmony_grammar())
        calls = {**self.calls_schema(), "x-guidance": TOOL_JSON_LAYOUT}
        more = ' ("\\n" call)*' if self.parallel else ""
        grammar = (f'start: call{more} "\\n"?\n'  # the newline a model may write before it ends
                   f'call: {OPEN} "\\n" body "\\n" {CLOSE}\n'
                   f"body: %json {json.dumps(calls)}\n")
        return Constraint("tools", grammar, trigger=OPEN if self.choice == "auto" else None)


    def _harmony_grammar(self) -> str:
        """One harmony call of a function the choice allows: its message's header (the ``<|start|>assistant``
        before it only where the reply has written nothing yet), its arguments' JSON, and ``<|call|>``."""
        callable_ = [t for t in self.tools if self.choice in CHOICES or t.name == self.choice]
        rules = [f'start: (<|start|> "assistant")? <|channel|> {json.dumps("commentary " + HARMONY_TO)} '
                 f'({" | ".join(f"call{i}" for i in range(len(callable_)))}) <|call|>']
        for i, tool in enumerate(callable_):
            params = json.loads(tool.parameters)
            schema = {**params, "x-guidance": TOOL_JSON_LAYOUT} if isinstance(params, dict) else params
            rules += [f'call{i}: {json.dumps(tool.name)} " " <|constrain|> "json" <|message|> args{i}',
                      f"args{i}: %json {json.dumps(schema)}"]
        return "\n".join(rules) + "\n"


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


def may_call(use: Optional[ToolUse]) -> bool:
    """Whether a reply under ``use`` may hold tool calls (tools offered, and tool_choice not "none")."""
    return use is not None and use.choice != "none"


def offered(use: Optional[ToolUse]) -> frozenset[str]:
    """The names of the tools ``use`` offers (none where it is None)."""
    return frozenset(t.name for t in use.tools) if use is not None else frozenset()


def call_format(template: str) -> Optional[str]:
    """The format a chat template writes calls in: ``HERMES``, ``HARMONY``, or None for one localspec does not read
    (Qwen3-Coder's and GLM's templates write ``<tool_call>`` around XML-like calls)."""
    if OPEN in template and re.search(r'\\?"name\\?"', template) and "arguments" in template \
            and "<function=" not in template:
        return HERMES
    if "<|call|>" in template and "<|channel|>" in template and "functions." in template:
        return HARMONY
    return None


def check_template(template: str, model: str) -> None:
    """Refuse tools for a chat template that does not write calls in a format localspec reads.

    Raises:
        ToolsUnsupportedError: the template writes neither ``<tool_call>`` with a JSON ``"name"`` and
            ``arguments`` nor harmony's calls (see ``call_format``).
    """
    if call_format(template) is None:
        raise ToolsUnsupportedError(f"The chat template of {model} does not write tool calls as <tool_call> JSON "
                                    "(the format of Qwen2.5 and other Hermes-style templates) or as GPT-OSS's "
                                    "harmony calls, the formats localspec reads, so localspec cannot offer it "
                                    "tools; leave out 'tools', or use a model whose template writes them.")


def reply_options(use: ToolUse, opts: GenerationOptions, target: Model) -> tuple[GenerationOptions, bool]:
    """``opts`` for a reply of ``target`` under ``use`` (the calls' grammar, or under "none" a ban on the call
    token), and whether its template is shown the tools (under "none" only where the ban holds it to text).

    Raises:
        ToolsUnsupportedError: the template or the vocabulary cannot write calls as localspec reads them.
        ConfigError: ``opts`` already has a grammar.
    """
    name, template = target.path.name, target.chat_template() or ""
    if call_format(template) == HARMONY:
        return _harmony_options(use, opts, target)
    marks, single = _call_marks(target)
    if use.choice == "none":  # shown the tools, the model must not call one (whatever else biases it)
        if OPEN not in template or not single:
            return opts, False
        return opts.replace(logit_bias={**dict(opts.logit_bias), marks[0][0]: -100.0}), True
    check_template(template, name)
    if not single:
        raise ToolsUnsupportedError(f"{name} has no single {OPEN} and {CLOSE} tokens that print as themselves, "
                                    "which its template's tool calls need, so localspec cannot read its calls; "
                                    "leave out 'tools', or use a model whose vocabulary has them.")
    if opts.grammar is not None:
        raise ConfigError(f"A reply that may call tools follows the calls' grammar, so it cannot also follow "
                          f"{opts.grammar.describe()}; leave one out (or give tool_choice 'none').")
    return opts.replace(grammar=use.constraint()), True


def _harmony_options(use: ToolUse, opts: GenerationOptions, target: Model) -> tuple[GenerationOptions, bool]:
    """``reply_options`` for a template that writes harmony calls: shown the tools (unless the choice is "none"),
    free under "auto", one call's grammar under "required" or a function's name."""
    if use.choice == "none":
        return opts, False
    missing = [m for m in HARMONY_TOKENS if len(target.tokenize(m, add_special=False)) != 1]
    if missing:
        raise ToolsUnsupportedError(f"{target.path.name} has no single {missing[0]} token, which its template's "
                                    "tool calls need, so localspec cannot read its calls; leave out 'tools', or "
                                    "use a model whose vocabulary has it.")
    if opts.grammar is not None:
        raise ConfigError(f"A reply that may call tools follows the calls' grammar, so it cannot also follow "
                          f"{opts.grammar.describe()}; leave one out (or give tool_choice 'none').")
    grammar = use.constraint(HARMONY)
    return (opts.replace(grammar=grammar) if grammar is not None else opts), True


def _call_marks(target: Model) -> tuple[list[list[int]], bool]:
    """The tokens of ``<tool_call>`` and ``</tool_call>``, and whether each is one token printing as itself."""
    marks = [target.tokenize(m, add_special=False) for m in (OPEN, CLOSE)]
    single = all(len(m) == 1 and target.detokenize(m) == text for m, text in zip(marks, (OPEN, CLOSE), strict=True))
    return marks, single


def can_call(target: Model) -> bool:
    """Whether ``target`` may be offered tools: its template and vocabulary write calls as localspec reads them."""
    fmt = call_format(target.chat_template() or "")
    if fmt == HARMONY:
        return all(len(target.tokenize(m, add_special=False)) == 1 for m in HARMONY_TOKENS)
    return fmt == HERMES and _call_marks(target)[1]


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


def tool_use(tools: Union[None, ToolUse, Sequence[Any]], tool_choice: Any = None,
             parallel_tool_calls: Optional[bool] = None) -> Optional[ToolUse]:
    """A ``ToolUse`` from what the Python API takes: one already built, or OpenAI's tool list and fields."""
    if isinstance(tools, ToolUse) or tools is None:
        if tools is None and tool_choice not in (None, "none", "auto"):
            raise ConfigError(f"tool_choice {_choice_text(tool_choice)} needs tools.")
        return tools
    return ToolUse.from_openai(tools, tool_choice, parallel_tool_calls)
