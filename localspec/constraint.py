"""Constrained decoding: the output must follow a JSON Schema, any JSON object, a regex or a grammar.

``Constraint`` is what a caller asks for (light: a grammar's text, checked
when it is compiled, importing nothing heavy so the options can hold it);
``grammar.Matcher`` is one generation's state over a model's vocabulary.
Both are built on llguidance (MIT, no dependencies, a compiled wheel for
the platforms llama-cpp-python builds on), the engine llama.cpp
itself offers behind ``LLAMA_LLGUIDANCE``: it compiles JSON Schema, Lark,
regexes and GBNF into one grammar, computes a token mask in tens of
microseconds, validates a draft's tokens, rolls back after a rejection and
says which tokens the grammar forces. It is the optional ``structured``
extra (``bash scripts/install.sh structured`` in the checkout, or ``pip install llguidance``).

The engine masks the target's logits at every position the target decides,
so greedy output is exactly what plain constrained decoding gives and sampled
output has its distribution; a draft is cut after its first token the
grammar rejects (verified as a certain rejection, so sampled acceptance keeps
the exact distribution), and tokens the grammar forces are drafts that cost
no drafting.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from .errors import ConfigError, NotInstalledError

#: How JSON is written under a constraint: no optional whitespace, but a space after ':' and ',' as the
#: models write JSON when free (Qwen's and GPT's habit); compact JSON pushes a small model off its answer.
JSON_LAYOUT = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}
#: The kinds of constraint, as ``Constraint.kind`` names them.
KINDS = ("json_schema", "json_object", "regex", "lark", "gbnf", "tools")


def llguidance() -> Any:
    """The llguidance module, or NotInstalledError saying how to install it."""
    try:
        import llguidance
    except ImportError:
        raise NotInstalledError("Structured output needs llguidance, localspec's optional 'structured' extra: "
                                "pip install llguidance (or run `bash scripts/install.sh server,structured` "
                                "in the localspec checkout).") from None
    return llguidance


@dataclass(frozen=True)
class Constraint:
    """What the output must follow. Build one with the class methods; compiled per model by ``matcher``.

    Attributes:
        kind: one of ``KINDS``.
        source: what the caller gave (the schema as JSON text, the regex, the grammar); for "tools", the
            Lark grammar of the calls (``structured.tool_use.ToolUse.constraint`` writes it).
        trigger: the text of one token: the output is free until the model writes it, and the grammar
            holds from that token on (llama.cpp's lazy grammar). None: it holds from the first token.
    """

    kind: str
    source: str
    trigger: Optional[str] = None

    @classmethod
    def json_schema(cls, schema: Union[dict, str]) -> Constraint:
        """Output that is a JSON value valid against ``schema`` (a dict or its JSON text)."""
        text = schema if isinstance(schema, str) else json.dumps(schema)
        try:
            parsed = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"The JSON schema is not valid JSON ({exc}).") from None
        if not isinstance(parsed, (dict, bool)):
            raise ConfigError(f"A JSON schema is an object (or true/false), got {type(parsed).__name__}.")
        return cls("json_schema", text)

    @classmethod
    def json_object(cls) -> Constraint:
        """Output that is any JSON object (OpenAI's JSON mode)."""
        return cls("json_object", json.dumps({"type": "object"}))

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        """Output that matches ``pattern`` whole."""
        return cls("regex", pattern)

    @classmethod
    def lark(cls, grammar: str) -> Constraint:
        """Output in the language of a Lark grammar (llguidance's dialect: ``start`` is the first rule)."""
        return cls("lark", grammar)

    @classmethod
    def gbnf(cls, grammar: str) -> Constraint:
        """Output in the language of a GBNF grammar, as llama.cpp writes them (``root`` is the start)."""
        return cls("gbnf", grammar)

    @classmethod
    def grammar_file(cls, path: Union[str, os.PathLike]) -> Constraint:
        """The grammar in a file: GBNF as llama.cpp writes it if its name ends in ``.gbnf``, else Lark.

        Raises:
            ConfigError: the file cannot be read as UTF-8 text.
        """
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"Cannot read the grammar file {path}: {exc}.") from None
        return cls.gbnf(text) if path.suffix.lower() == ".gbnf" else cls.lark(text)

    @classmethod
    def response_format(cls, value: Any) -> Optional[Constraint]:
        """The constraint an OpenAI ``response_format`` asks for (None for ``{"type": "text"}``).

        Raises:
            ConfigError: not one of the shapes OpenAI documents.
        """
        kind = value.get("type") if isinstance(value, dict) else None
        if kind == "text":
            return None
        if kind == "json_object":
            return cls.json_object()
        if kind == "json_schema":
            spec = value.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if schema is None:
                raise ConfigError("response_format json_schema needs json_schema.schema, the schema itself.")
            return cls.json_schema(schema)
        raise ConfigError(f"response_format type must be text, json_object or json_schema, got {kind!r}.")

    def grammar(self) -> str:
        """The llguidance grammar for this constraint (not yet checked against a vocabulary)."""
        llg = llguidance()
        m = llg.LLMatcher
        if self.kind in ("json_schema", "json_object"):
            return str(m.grammar_from_json_schema(self.source, overrides=JSON_LAYOUT))
        if self.kind == "regex":
            return str(m.grammar_from_regex(self.source))
        if self.kind in ("lark", "tools"):
            return str(m.grammar_from_lark(self.source))
        if self.kind == "gbnf":
            return str(llg.grammar_from("gbnf", self.source))
        raise ConfigError(f"Unknown constraint kind {self.kind!r}; choose one of {', '.join(KINDS)}.")

    def describe(self, capital: bool = False) -> str:
        """What this constraint is, for a sentence (``capital``: to begin one)."""
        what = {"json_schema": "the JSON schema", "json_object": "JSON mode", "regex": "the regex",
                "lark": "the Lark grammar", "gbnf": "the GBNF grammar",
                "tools": "the tool calls' grammar (from the tools' parameter schemas)"}[self.kind]
        return what[0].upper() + what[1:] if capital else what
