"""Ollama's request bodies (``/api/chat``, ``/api/generate``, ``/api/show``), translated into the server's
``GenerationRequest``.

The same request type, options and bounds as the OpenAI routes (``openai.requests``): Ollama's ``options``
become ``GenerationOptions`` fields, ``format`` the structured-output constraint, ``tools`` a ``ToolUse``,
``think`` the reasoning switch and ``suffix`` a fill-in-the-middle request. A message's ``images`` (and
``/api/generate``'s), base64 text, become the library's image parts before its text (``server.images``).
Options that only say how Ollama would load the model (``num_ctx``, ``num_gpu``, ``num_thread``...) change
nothing here: the server loaded its pair once, at start. Every mistake is one ``ApiError`` naming the field;
the routes answer it as Ollama's ``{"error": "..."}``.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict

from ...constraint import Constraint
from ...errors import LocalspecError
from ...options import GenerationOptions
from ...structured.tool_use import ToolUse
from ..generation import GenerationRequest, Limits
from ..http import ApiError
from ..images import from_base64
from ..reasoning_fields import reasoning_fields

#: Ollama's options -> GenerationOptions fields.
OPTION_FIELDS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
                 "seed": "seed", "num_predict": "max_tokens", "stop": "stop", "repeat_penalty": "repeat_penalty",
                 "repeat_last_n": "repeat_last_n", "presence_penalty": "presence_penalty",
                 "frequency_penalty": "frequency_penalty"}
#: Options localspec does not implement, with the values that mean "not used".
NEUTRAL_OPTIONS: dict[str, tuple[Any, ...]] = {"typical_p": (1,), "tfs_z": (1,), "mirostat": (0,)}
#: Ollama's "generate until the context is full" values of num_predict.
UNBOUNDED = (-1, -2)


class StrictBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Options(StrictBody):
    """Ollama's ``options``: sampling options, and load-time ones that change nothing on a loaded server."""

    temperature: Optional[float] = None
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    min_p: Optional[float] = None
    seed: Optional[int] = None
    num_predict: Optional[int] = None
    stop: Union[str, list[str], None] = None
    repeat_penalty: Optional[float] = None
    repeat_last_n: Optional[int] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    typical_p: Optional[float] = None
    tfs_z: Optional[float] = None
    mirostat: Optional[int] = None
    mirostat_tau: Optional[float] = None  # only read under mirostat
    mirostat_eta: Optional[float] = None
    penalize_newline: Optional[bool] = None  # Ollama itself no longer reads it
    num_keep: Optional[int] = None  # what a shifted context keeps: localspec never shifts one
    # How Ollama would load the model: the server loaded its pair at start.
    num_ctx: Optional[int] = None
    num_batch: Optional[int] = None
    num_gpu: Optional[int] = None
    main_gpu: Optional[int] = None
    num_thread: Optional[int] = None
    numa: Optional[bool] = None
    low_vram: Optional[bool] = None
    f16_kv: Optional[bool] = None
    logits_all: Optional[bool] = None
    vocab_only: Optional[bool] = None
    use_mmap: Optional[bool] = None
    use_mlock: Optional[bool] = None
    embedding_only: Optional[bool] = None


class CalledFunction(StrictBody):
    name: str
    arguments: Union[dict[str, Any], str]
    index: Optional[int] = None


class ToolCall(StrictBody):
    function: CalledFunction
    id: Optional[str] = None
    type: Optional[Literal["function"]] = None


class Message(StrictBody):
    role: Literal["system", "user", "assistant", "tool"]
    content: Optional[str] = None
    thinking: Optional[str] = None  # an earlier reply's reasoning: templates drop it, so is it here
    images: Optional[list[Any]] = None
    tool_calls: Optional[list[ToolCall]] = None
    tool_name: Optional[str] = None
    tool_call_id: Optional[str] = None


class _Body(StrictBody):
    model: Optional[str] = None
    stream: Optional[bool] = None
    format: Union[str, dict[str, Any], None] = None
    options: Optional[Options] = None
    keep_alive: Union[int, float, str, None] = None  # the pair stays loaded as long as the server runs
    think: Union[bool, str, None] = None
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = None
    truncate: Optional[bool] = None  # a prompt over the context is refused, never cut
    shift: Optional[bool] = None


class ChatBody(_Body):
    messages: Optional[list[Message]] = None
    tools: Optional[list[Any]] = None


class GenerateBody(_Body):
    prompt: Optional[str] = None
    suffix: Optional[str] = None
    system: Optional[str] = None
    template: Optional[str] = None
    context: Optional[list[int]] = None
    raw: Optional[bool] = None
    images: Optional[list[Any]] = None


class ShowBody(StrictBody):
    model: Optional[str] = None
    name: Optional[str] = None  # the older name of the field
    verbose: Optional[bool] = None
    system: Optional[str] = None
    template: Optional[str] = None
    options: Optional[dict[str, Any]] = None


def tagged(name: str) -> str:
    """A model name as Ollama lists it: with a tag (``target`` -> ``target:latest``)."""
    return name if ":" in name else name + ":latest"


def model_name(given: Optional[str], limits: Limits) -> str:
    """The server's name for the model a request asks for, with or without its ``:latest`` tag.

    Raises:
        ApiError: 400 without a model, 404 for a model this server does not have.
    """
    if not given:
        raise ApiError(400, "model is required")
    for name in limits.models:
        if given in (name, tagged(name)):
            return name
    raise ApiError(404, f"model '{given}' not found; this server has {', '.join(tagged(n) for n in limits.models)}")




def chat_request(body: ChatBody, defaults: GenerationOptions,
                 limits: Limits) -> Optional[GenerationRequest]:
    """An ``/api/chat`` body as the library's request; None for one without messages (Ollama's "load")."""
    model_name(body.model, limits)
    if not body.messages:
        return None
    options = _options(body, defaults, limits)
    messages = [_message(m, i, limits) for i, m in enumerate(body.messages)]
    try:
        tools = ToolUse.from_openai(body.tools)
    except LocalspecError as exc:
        raise ApiError(400, f"tools: {exc}") from None
    return GenerationRequest(True, messages, None, options, _stream(body), False, tools=tools)


def generate_request(body: GenerateBody, defaults: GenerationOptions,
                     limits: Limits) -> Optional[GenerationRequest]:
    """An ``/api/generate`` body as the library's request: a chat turn through the model's template, the raw
    prompt (``raw``), or a fill-in-the-middle (``suffix``); None for one without a prompt (Ollama's "load")."""
    model_name(body.model, limits)
    for field in ("template", "context"):
        if getattr(body, field):
            raise ApiError(400, f"'{field}' is not supported by localspec: " + {
                "template": "the model's own chat template renders the prompt (or send \"raw\": true)",
                "context": "send the conversation as messages to /api/chat"}[field])
    if body.images and (body.raw or body.suffix):
        raise ApiError(400, f"'images' go with a prompt the chat template renders, not with "
                       f"{'raw' if body.raw else 'suffix'}; leave out {'raw' if body.raw else 'suffix'} or the images.")
    if not body.prompt and not body.suffix:
        return None
    options = _options(body, defaults, limits)
    if body.suffix:
        return GenerationRequest(False, None, body.prompt or "", options, _stream(body), False,
                                 suffix=body.suffix)
    assert body.prompt is not None
    if body.raw:
        return GenerationRequest(False, None, body.prompt, options, _stream(body), False)
    system: list[dict[str, Any]] = [{"role": "system", "content": body.system}] if body.system else []
    messages = [*system, {"role": "user", "content": _with_images(body.prompt, body.images, "images", limits)}]
    return GenerationRequest(True, messages, None, options, _stream(body), False)


def _stream(body: _Body) -> bool:
    return body.stream is not False  # Ollama streams unless told not to


def _options(body: _Body, defaults: GenerationOptions, limits: Limits) -> GenerationOptions:
    """The generation options a body's ``options``, ``format`` and ``think`` ask for, within the limits."""
    if body.logprobs or body.top_logprobs:
        raise ApiError(400, "'logprobs' is not supported on Ollama's routes; /v1/chat/completions gives them.")
    given = _given_options(body.options or Options())
    constraint = _format(body.format)
    if constraint is not None:
        given["grammar"] = constraint
    if not limits.history:
        given["history"] = False
    try:
        options = defaults.replace(**given)
    except LocalspecError as exc:
        raise ApiError(400, f"options: {exc}") from None
    options = _think(body.think, options)
    if limits.max_tokens is not None and options.max_tokens > limits.max_tokens:
        options = options.replace(max_tokens=limits.max_tokens)
    return options


def _given_options(opts: Options) -> dict[str, Any]:
    for name, neutral in NEUTRAL_OPTIONS.items():
        value = getattr(opts, name)
        if value is not None and value not in neutral:
            raise ApiError(400, f"'options.{name}' is not supported by localspec (got {value!r}); leave it out.")
    given = {target: getattr(opts, name) for name, target in OPTION_FIELDS.items() if getattr(opts, name) is not None}
    if given.get("max_tokens") in UNBOUNDED:
        del given["max_tokens"]  # the server's default: the context, or the operator's cap
    return given


def _format(value: Union[str, dict[str, Any], None]) -> Optional[Constraint]:
    """``format``: "json" for any JSON object, a JSON schema for output valid against it."""
    if value in (None, ""):
        return None
    if value == "json":
        return Constraint.json_object()
    if isinstance(value, str):
        raise ApiError(400, f"'format' must be \"json\" or a JSON schema object, got {value!r}.")
    try:
        return Constraint.json_schema(value)
    except LocalspecError as exc:
        raise ApiError(400, f"format: {exc}") from None


def _think(think: Union[bool, str, None], options: GenerationOptions) -> GenerationOptions:
    """``think``: true or false, or an effort (``"high"``...) that leaves thinking on."""
    if think is None:
        return options
    if isinstance(think, bool):
        return options.replace(think=think)
    try:
        return reasoning_fields(think, None, options)[0]
    except ApiError as exc:
        raise ApiError(400, f"'think' must be true, false, \"low\", \"medium\" or \"high\": {exc.message}") from None


def _message(m: Message, i: int, limits: Limits) -> dict[str, Any]:
    """An Ollama message as the library's (OpenAI-shaped) chat message."""
    if m.tool_calls and m.role != "assistant":
        raise ApiError(400, f"messages[{i}] has role {m.role!r} and tool_calls, which only an assistant message has.")
    if m.content is None and not (m.role == "assistant" and m.tool_calls):
        raise ApiError(400, f"messages[{i}] ({m.role}) has no content; give its text as \"content\".")
    out: dict[str, Any] = {"role": m.role, "content": _with_images(m.content or "", m.images, f"messages[{i}].images",
                                                                   limits)}
    if m.tool_calls:
        out["tool_calls"] = [_call(c, i, n) for n, c in enumerate(m.tool_calls)]
    if m.role == "tool":
        out["tool_call_id"] = m.tool_call_id or ""
        if m.tool_name:
            out["name"] = m.tool_name
    elif m.tool_name or m.tool_call_id:
        raise ApiError(400, f"messages[{i}] has role {m.role!r} and tool_name or tool_call_id, which only a "
                       "'tool' message has.")
    return out


def _call(c: ToolCall, i: int, n: int) -> dict[str, Any]:
    """An earlier reply's call as OpenAI shapes it: its arguments as JSON text."""
    args = c.function.arguments
    return {"id": c.id or f"call_{i}_{n}", "type": "function",
            "function": {"name": c.function.name, "arguments": args if isinstance(args, str) else json.dumps(args)}}


def _with_images(text: str, images: Optional[list[Any]], where: str,
                 limits: Limits) -> Union[str, list[dict[str, Any]]]:
    """A message's content: its text, or, with images (base64 text each), the images' parts, then the text."""
    if not images:
        return text
    parts = [from_base64(data, f"{where}[{j}]", limits) for j, data in enumerate(images)]
    return parts + ([{"type": "text", "text": text}] if text else [])
