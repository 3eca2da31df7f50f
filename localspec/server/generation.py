"""What every API's route turns its request into: ``GenerationRequest``, the operator's ``Limits``, and the
request body read as JSON off the event loop.

Each API checks its own body shape (``openai``, ``anthropic``, ``responses``, ``ollama``) and builds the
one ``GenerationRequest`` the worker runs: a chat turn, a raw completion, a fill-in-the-middle, or a count
of a prompt's tokens.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Callable, Optional, TypeVar, Union

from fastapi import Request
from pydantic import BaseModel, ValidationError

from ..images import Fetch
from ..options import GenerationOptions
from ..structured.tool_use import ToolUse
from .http import ApiError

T = TypeVar("T")


@dataclass
class GenerationRequest:
    """A checked request: what to continue, with which options, and how to answer."""

    chat: bool
    messages: Optional[list[dict[str, Any]]]
    prompt: Union[str, list[int], None]
    options: GenerationOptions
    stream: bool
    include_usage: bool
    suffix: Optional[str] = None
    tools: Optional[ToolUse] = None  # chat: the tools offered, and how the reply may use them
    template_vars: Optional[dict[str, Any]] = None  # chat: more variables for the chat template


@dataclass(frozen=True)
class Limits:
    """What the operator allows a request.

    Attributes:
        models: the model names clients may ask for.
        max_tokens: the most tokens one request may generate (a larger request is capped), None for no cap.
        history: whether requests may draft from and record into the history store.
        keep_billing_header: keep Claude Code's per-request billing-header block in a Messages request's
            system prompt (by default it is dropped: a hash in it changes with every request, so no prefix
            of the prompt would ever be found in the prompt cache again).
        vision: the model reads images (it was loaded with a vision projector).
        fetch: reads an ``http(s)`` image URL (``serve --allow-fetch``); None: such URLs are refused.
    """

    models: tuple[str, ...]
    max_tokens: Optional[int] = None
    history: bool = True
    keep_billing_header: bool = False
    vision: bool = False
    fetch: Optional[Fetch] = None

    def serves(self, name: str) -> bool:
        """Whether ``name`` is a served model's, by its name or Ollama's tag for it (``NAME:latest``: apps that
        list the models through /api/tags, such as VS Code's Ollama provider, ask for that)."""
        return name in self.models or name.removesuffix(":latest") in self.models


def parse_body(raw: bytes) -> Any:
    """The JSON in a request body (ApiError 400 when it is not JSON)."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
        reason = "nested too deeply" if isinstance(exc, RecursionError) else \
            "a number has too many digits" if "int_max_str_digits" in str(exc) else str(exc)
        raise ApiError(400, f"The request body is not valid JSON ({reason}).") from None


async def read_body(request: Request, check: Callable[[Any], T]) -> T:
    """The request's JSON body, parsed and checked by ``check``, off the event loop: a large body takes a
    while, and other clients are not kept waiting.

    Raises:
        ApiError: the body is not JSON, or ``check`` refuses it.
    """
    raw = await request.body()
    return await asyncio.to_thread(lambda: check(parse_body(raw)))


def parse_model(raw: Any, model: type[BaseModel]) -> Any:
    """A body checked against ``model`` (a pydantic model that forbids unknown fields).

    Raises:
        ApiError: 400 naming the first field at fault.
    """
    if not isinstance(raw, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in err["loc"] if not (isinstance(p, str) and ("[" in p or p in _TYPES)))
        if err["type"] == "extra_forbidden":
            raise ApiError(400, f"'{where}' is not a field localspec takes; leave it out.") from None
        raise ApiError(400, f"'{where}': {err['msg']} (got {str(err.get('input'))[:60]!r}).") from None
    except RecursionError:
        raise ApiError(400, "The request body is nested too deeply.") from None


_TYPES = ("str", "int", "float", "bool", "dict", "list")
