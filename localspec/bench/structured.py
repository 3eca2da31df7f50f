"""A suite prompt as the runner decodes it: its token ids, the constraint every localspec row follows, and the
same constraint as a GBNF grammar for llama-cpp-python's own grammar decoding.

The built-in structured suite (``data/structured.jsonl``, ``localspec bench --structured``) has what agents and
editors send: extraction into a JSON Schema, a tool call, a fill-in-the-middle completion. llama-cpp-python
decodes the first two under the GBNF its own converter writes from the same schema (what its
``response_format`` does); its grammar engine and llguidance may lay out whitespace differently, so its rows
are timed beside localspec's but their tokens are not compared.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Optional

from ..api import Pair
from ..constraint import Constraint
from ..options import GenerationOptions
from ..prompts import chat_text, infill_tokens
from ..tools import CLOSE, OPEN, ToolUse, reply_options, tool_use
from .suite import BenchPrompt


@dataclass(frozen=True)
class Prepared:
    """What one prompt decodes from, and under.

    Attributes:
        tokens: the prompt's token ids.
        grammar: the constraint of every localspec row (None: none).
        peer_grammar: GBNF text for llama-cpp-python's rows (None: they decode freely).
    """

    tokens: list[int]
    grammar: Optional[Constraint] = None
    peer_grammar: Optional[str] = None


def prepare(pair: Pair, bp: BenchPrompt) -> Prepared:
    """The prompt's tokens and constraints on ``pair``'s target.

    Raises:
        ConfigError: the target cannot take the prompt (no chat template, no fill-in-the-middle tokens, a
            template that cannot write tool calls).
    """
    target = pair.target
    if bp.prefix is not None:
        return Prepared(infill_tokens(target, bp.prefix, bp.suffix or ""))
    use = tool_use(bp.tools, bp.tool_choice)
    if use is not None:
        opts, show = reply_options(use, GenerationOptions(), target)
        text = chat_text(target, bp.messages or [], tools=use.offered() if show else ())
        return Prepared(target.tokenize(text, add_special=False), opts.grammar, tool_call_gbnf(use))
    tokens = pair.chat_tokens(bp.messages) if bp.messages is not None else pair.tokenize(bp.text or "")
    constraint = Constraint.response_format(bp.response_format) if bp.response_format is not None else None
    return Prepared(tokens, constraint, schema_gbnf(bp.response_format) if constraint is not None else None)


def schema_gbnf(response_format: Any) -> Optional[str]:
    """llama-cpp-python's GBNF for an OpenAI ``response_format``, as its ``response_format`` writes it."""
    from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

    if response_format.get("type") == "json_object":
        return JSON_GBNF
    return json_schema_to_gbnf(json.dumps(response_format["json_schema"]["schema"]))


def tool_call_gbnf(use: ToolUse) -> Optional[str]:
    """One call, ``<tool_call>`` JSON ``</tool_call>``, as GBNF from llama-cpp-python's converter; None for a
    choice that leaves the model free to answer in text ("auto", "none"), which GBNF cannot start lazily."""
    if use.choice in ("auto", "none"):
        return None
    tools = [t for t in use.tools if use.choice == "required" or t.name == use.choice]
    calls = [{"type": "object", "properties": {"name": {"const": t.name}, "arguments": json.loads(t.parameters)},
              "required": ["name", "arguments"]} for t in tools]
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    body = json_schema_to_gbnf(json.dumps(calls[0] if len(calls) == 1 else {"anyOf": calls}))
    body = re.sub(r"^root ::=", "call ::=", body, count=1, flags=re.MULTILINE)
    return f'root ::= "{OPEN}\\n" call "\\n{CLOSE}"\n{body}'
