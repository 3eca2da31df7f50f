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
from typing import Any, Callable, Optional

from ..api import Pair
from ..constraint import Constraint
from ..errors import ConfigError
from ..options import GenerationOptions
from ..prompts import chat_with_tools, infill_tokens
from ..structured.tool_use import CLOSE, OPEN, ToolUse, tool_use
from .suite import BenchPrompt


@dataclass(frozen=True)
class Prepared:
    """What one prompt decodes from, and under.

    Attributes:
        tokens: the prompt's token ids.
        grammar: the constraint of every localspec row (None: none).
        peer_grammar: GBNF text for llama-cpp-python's rows (None: they decode freely).
        logit_bias: what localspec's rows add to the logits (under tool_choice "none": the call token banned).
    """

    tokens: list[int]
    grammar: Optional[Constraint] = None
    peer_grammar: Optional[str] = None
    logit_bias: tuple[tuple[int, float], ...] = ()


def prepare(pair: Pair, bp: BenchPrompt, peers: bool = True) -> Prepared:
    """The prompt's tokens and constraints on ``pair``'s target (the peers' GBNF only if ``peers``): what
    ``Pair.chat`` would decode under for its tools, or ``response_format``.

    Raises:
        ConfigError: the target cannot take the prompt (no chat template, no fill-in-the-middle tokens, a
            template that cannot write tool calls), or llama-cpp-python's converter cannot write its GBNF.
    """
    target = pair.target
    if bp.prefix is not None:
        return Prepared(infill_tokens(target, bp.prefix, bp.suffix or ""))
    use = tool_use(bp.tools, bp.tool_choice, bp.parallel_tool_calls)
    if use is not None:
        text, opts = chat_with_tools(target, bp.messages or [], use, GenerationOptions())
        gbnf = _converted(bp, lambda: tool_call_gbnf(use)) if peers else None
        return Prepared(target.tokenize(text, add_special=False), opts.grammar, gbnf, opts.logit_bias)
    tokens = pair.chat_tokens(bp.messages) if bp.messages is not None else pair.tokenize(bp.text or "")
    if bp.response_format is None:
        return Prepared(tokens)
    constraint = Constraint.response_format(bp.response_format)
    gbnf = _converted(bp, lambda: schema_gbnf(bp.response_format)) if peers and constraint is not None else None
    return Prepared(tokens, constraint, gbnf)


def _converted(bp: BenchPrompt, convert: Callable[[], str]) -> str:
    """llama-cpp-python's GBNF, its converter's failure said as one sentence naming the prompt."""
    try:
        return convert()
    except ConfigError as exc:
        raise ConfigError(f"{bp.name}: {exc} Or leave llama-cpp-python's rows out (--no-peers).") from exc
    except Exception as exc:  # its converter asserts on what it cannot resolve
        raise ConfigError(f"{bp.name}: llama-cpp-python's JSON-Schema converter cannot write this schema as GBNF "
                          f"({exc!r}); leave its rows out (--no-peers) or simplify the schema.") from exc


def schema_gbnf(response_format: Any) -> str:
    """llama-cpp-python's GBNF for an OpenAI ``response_format``, as its ``response_format`` writes it."""
    from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

    if response_format.get("type") == "json_object":
        return JSON_GBNF
    return json_schema_to_gbnf(json.dumps(response_format["json_schema"]["schema"]))


def tool_call_gbnf(use: ToolUse) -> str:
    """The calls ``use`` allows, each ``<tool_call>`` JSON ``</tool_call>`` (several, a line apart, where
    parallel calls are allowed), as GBNF from llama-cpp-python's converter: the same shape as localspec's
    grammar for them (``ToolUse.constraint``).

    Raises:
        ConfigError: a choice that leaves the model free to answer in text ("auto", "none"): GBNF cannot
            start lazily, at the call token.
    """
    if use.choice in ("auto", "none"):
        raise ConfigError(f"tool_choice {use.choice!r} lets the model answer in text, which a GBNF grammar "
                          "cannot wait for; the bench times 'required' or a function's name.")
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    body = json_schema_to_gbnf(json.dumps(use.calls_schema()))
    body = re.sub(r"^root ::=", "call ::=", body, count=1, flags=re.MULTILINE)
    more = ' ("\\n" frame)*' if use.parallel else ""
    return f'root ::= frame{more} "\\n"?\nframe ::= "{OPEN}\\n" call "\\n{CLOSE}"\n{body}'
