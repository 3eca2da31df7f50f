"""Anthropic's Messages API in: a ``/v1/messages`` body translated into the server's one request type, and
Anthropic's error object.

A body is checked here for what only Anthropic's shape has (content blocks, ``tool_use`` and
``tool_result`` pairs, ``tool_choice``, ``thinking``, ``output_config.format``), then written as the chat
request it means and checked again by ``openai.requests.parse_request``, so options, tools, structured
output (``output_config.format``, or the beta's ``output_format``, as ``response_format``) and their bounds
are the same as for chat completions. Fields that change nothing on a local model (``metadata``,
``cache_control``, ``service_tier``, ``container``, ``output_config.effort`` and any field the API adds
later) are accepted and ignored; a field localspec reads with a wrong type, an unknown content block type,
a document, or a ``tool_result`` that answers no ``tool_use`` is a 400 naming the field. ``image`` blocks (in
a user turn, or in a ``tool_result``'s content, as Claude Code sends a tool's screenshot) become the
library's image parts (``server.images``): base64 data decoded, a URL fetched where the server allows.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Mapping, Optional, Union

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationError

from ...options import MAX_THINK_BUDGET, GenerationOptions
from ..generation import GenerationRequest, Limits
from ..http import ApiError
from ..images import check_vision, from_base64, from_url
from ..openai.requests import OWN_FIELDS, parse_request
from .replies import error_body, status_of

#: The paths of the Messages API.
PREFIX = "/v1/messages"
#: The header every request of Anthropic's SDKs carries: on a path both APIs share, it picks Anthropic's shapes.
VERSION_HEADER = "anthropic-version"

#: The Messages API's name for chat completions' fields, for error messages.
FIELD_NAMES = {"stop": "stop_sequences", "think_budget": "thinking.budget_tokens", "think": "thinking",
               "parallel_tool_calls": "tool_choice.disable_parallel_tool_use",
               "response_format": "output_config.format"}


class _Loose(BaseModel):
    """Known fields strictly typed; fields this server does not read are ignored (the API grows)."""

    model_config = ConfigDict(extra="ignore", strict=True)


class AnthropicMessage(_Loose):
    role: Literal["user", "assistant", "system"]  # Claude Code sends system messages among the turns
    content: Union[str, list[dict[str, Any]]]


class CountBody(_Loose):
    """The body of ``/v1/messages/count_tokens``."""

    model: str
    messages: list[AnthropicMessage]
    system: Union[str, list[dict[str, Any]], None] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[dict[str, Any]] = None
    thinking: Optional[dict[str, Any]] = None


class MessagesBody(CountBody):
    """The body of ``/v1/messages``."""

    max_tokens: int
    stop_sequences: Optional[list[str]] = None
    temperature: Union[int, float, None] = None
    top_p: Union[int, float, None] = None
    top_k: Optional[int] = None
    stream: Optional[bool] = None
    metadata: Optional[dict[str, Any]] = None
    output_config: Optional[dict[str, Any]] = None  # its format is read; effort and task_budget change nothing here
    output_format: Optional[dict[str, Any]] = None  # the structured-outputs beta's name for output_config.format


#: How Claude Code's per-request billing block begins (its ``cch=`` hash differs on every request).
BILLING_HEADER = "x-anthropic-billing-header:"


def from_anthropic(headers: Mapping[str, str]) -> bool:
    """Whether a request comes from an Anthropic client (it names the API version it speaks)."""
    return VERSION_HEADER in headers


def error_response(error: ApiError) -> JSONResponse:
    """``error`` as Anthropic's error object, with its status and headers."""
    status = status_of(error)
    message = error.message
    if error.code == "context_length_exceeded":  # Anthropic's words, which clients look for
        message = f"prompt is too long: {message[0].lower()}{message[1:]}"
    if error.param in FIELD_NAMES:
        message += f" (the field is '{FIELD_NAMES[error.param]}')"
    return JSONResponse(error_body(status, message), status_code=status, headers=error.headers)


def parse_messages(body: Any, defaults: GenerationOptions, limits: Limits, count: bool = False) -> GenerationRequest:
    """A Messages body (``count``: a count_tokens body) as the server's request.

    Raises:
        ApiError: 400 for the first thing wrong, its message naming the field.
    """
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    try:
        req = (CountBody if count else MessagesBody).model_validate(body)
    except ValidationError as exc:
        raise _validation_error(exc) from None
    except RecursionError:
        raise ApiError(400, "The request body is nested too deeply.") from None
    turns = _messages(req.messages, limits)
    chat: dict[str, Any] = {"messages": _system(req.system, limits.keep_billing_header) + turns}
    if req.tools is not None:
        chat["tools"] = [_tool(t, i) for i, t in enumerate(req.tools)]
    if req.tool_choice is not None:
        chat.update(_tool_choice(req.tool_choice))
    if req.thinking is not None:
        chat.update(_thinking(req.thinking))
    chat.update({k: body[k] for k in OWN_FIELDS if body.get(k) is not None})  # localspec's own, checked there
    if isinstance(req, MessagesBody):
        given = {"max_tokens": req.max_tokens, "stop": req.stop_sequences, "temperature": req.temperature,
                 "top_p": req.top_p, "top_k": req.top_k, "stream": req.stream}
        chat.update({k: v for k, v in given.items() if v is not None})
        chat.update(_output_format(req.output_config, req.output_format))
    return parse_request(chat, True, defaults, limits)


def _validation_error(exc: ValidationError) -> ApiError:
    err = exc.errors(include_url=False)[0]
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]
                    if not (isinstance(p, str) and ("[" in p or p in ("str", "int", "float", "bool")))).lstrip(".")
    if err["type"] == "missing":
        return ApiError(400, f"{where}: Field required.", param=where)
    return ApiError(400, f"{where or 'the body'}: {err['msg']} (got {str(err.get('input'))[:60]!r}).", param=where)


def _system(system: Union[str, list[dict[str, Any]], None], keep_billing: bool) -> list[dict[str, Any]]:
    """The system prompt as one system message; without ``keep_billing``, Claude Code's billing-header text
    (a hash that changes with every request) is left out, so the rest of the prompt can be found cached."""
    if system is None or system == "" or system == []:
        return []
    texts = [system] if isinstance(system, str) else [_text(b, f"system[{i}]") for i, b in enumerate(system)]
    if not keep_billing:
        texts = [t for t in (_without_billing_header(t) for t in texts) if t]
    return [{"role": "system", "content": "\n".join(texts)}] if texts else []


def _without_billing_header(text: str) -> str:
    """``text`` less its lines that are Claude Code's ``x-anthropic-billing-header: ...`` (and the newline)."""
    if BILLING_HEADER not in text:
        return text
    return "\n".join(line for line in text.split("\n") if not line.lstrip().startswith(BILLING_HEADER)).strip("\n")


def _text(block: Any, where: str) -> str:
    """A text block's text (any other block is a 400)."""
    if not isinstance(block, dict) or block.get("type") != "text":
        kind = block.get("type") if isinstance(block, dict) else type(block).__name__
        raise ApiError(400, f"{where}: a {kind!r} block where only text blocks go.", param=where)
    if not isinstance(block.get("text"), str):
        raise ApiError(400, f"{where}.text: a text block needs its text as a string.", param=where)
    return str(block["text"])


def _messages(messages: list[AnthropicMessage], limits: Limits) -> list[dict[str, Any]]:
    if not messages:
        raise ApiError(400, "messages: at least one message is required.", param="messages")
    if messages[-1].role == "assistant":
        raise ApiError(400, "messages: the last message is the assistant's; localspec does not continue a "
                       "prefilled reply, so end with a user message.", param="messages")
    out: list[dict[str, Any]] = []
    open_calls: set[str] = set()  # tool_use ids not answered yet
    for i, m in enumerate(messages):
        blocks = [{"type": "text", "text": m.content}] if isinstance(m.content, str) else m.content
        if m.role == "system":
            _system_turn(out, "\n".join(_text(b, f"messages[{i}].content[{j}]") for j, b in enumerate(blocks)))
            continue
        out += _assistant(blocks, i, open_calls) if m.role == "assistant" else _user(blocks, i, open_calls, limits)
    return out


def _system_turn(out: list[dict[str, Any]], text: str) -> None:
    """A system message among the turns joins the user turn before it, where every chat template takes it
    (many allow one system message, first) and the conversation's earlier turns keep their tokens, so the
    prompt cache still finds them; without a user turn before it, it becomes one."""
    if not text:
        return
    if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], str):
        out[-1]["content"] = f"{out[-1]['content']}\n\n{text}" if out[-1]["content"] else text
    elif out and out[-1]["role"] == "user":  # a turn with images: its parts
        out[-1]["content"].append({"type": "text", "text": text})
    else:
        out.append({"role": "user", "content": text})


def _assistant(blocks: list[Any], i: int, open_calls: set[str]) -> list[dict[str, Any]]:
    text, calls = [], []
    for j, b in enumerate(blocks):
        where = f"messages[{i}].content[{j}]"
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "tool_use":
            calls.append(_tool_use(b, where))
            open_calls.add(calls[-1]["id"])
        elif kind in ("thinking", "redacted_thinking"):
            continue  # earlier reasoning: the chat template leaves it out of the prompt
        else:
            text.append(_content_text(b, where))
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(text)}
    if calls:
        message["tool_calls"] = calls
    return [message]


def _tool_use(block: dict[str, Any], where: str) -> dict[str, Any]:
    ident, name, given = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(ident, str) or not ident or not isinstance(name, str) or not isinstance(given, dict):
        raise ApiError(400, f"{where}: a tool_use block needs an 'id' and a 'name' (strings) and an 'input' "
                       "object.", param=where)
    return {"id": ident, "type": "function", "function": {"name": name, "arguments": json.dumps(given)}}


def _user(blocks: list[Any], i: int, open_calls: set[str], limits: Limits) -> list[dict[str, Any]]:
    answers, parts = [], []
    for j, b in enumerate(blocks):
        where = f"messages[{i}].content[{j}]"
        if isinstance(b, dict) and b.get("type") == "tool_result":
            answers.append(_tool_result(b, where, open_calls, limits))
        else:
            parts.append(_part(b, where, limits))
    return answers + ([{"role": "user", "content": _joined(parts)}] if parts or not answers else [])


def _part(block: Any, where: str, limits: Limits) -> dict[str, Any]:
    """A user turn's text block as a text part, or its image block as the library's image part."""
    if isinstance(block, dict) and block.get("type") == "image":
        return _image(block, where, limits)
    return {"type": "text", "text": _content_text(block, where)}


def _joined(parts: list[dict[str, Any]]) -> Union[str, list[dict[str, Any]]]:
    """Content parts as a message's content: the texts joined by newlines, or the parts themselves where they
    hold an image (the library joins their texts so)."""
    if any(p["type"] != "text" for p in parts):
        return parts
    return "\n".join(p["text"] for p in parts)


def _image(block: dict[str, Any], where: str, limits: Limits) -> dict[str, Any]:
    """An image block's source, read: base64 data decoded, or a URL fetched where the server allows."""
    check_vision(where, limits, where)
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        assert isinstance(source, dict)
        media = source.get("media_type")
        if not isinstance(media, str) or not media.startswith("image/"):
            raise ApiError(400, f"{where}.source.media_type must be an image's type (image/png, image/jpeg), got "
                           f"{media!r}.", param=where)
        return from_base64(source.get("data"), f"{where}.source.data", limits, where)
    if kind == "url":
        assert isinstance(source, dict)
        return from_url(source.get("url"), f"{where}.source.url", limits, where)
    if kind == "file":
        raise ApiError(400, f"{where}.source: a file_id names a file kept by Anthropic's Files API, which this "
                       "server does not have; send the image as base64 data.", param=where)
    raise ApiError(400, f"{where}.source must be {{\"type\": \"base64\", \"media_type\": \"image/png\", \"data\": "
                   f"...}} or {{\"type\": \"url\", \"url\": ...}}, got {_short(source)}.", param=where)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _tool_result(block: dict[str, Any], where: str, open_calls: set[str], limits: Limits) -> dict[str, Any]:
    ident = block.get("tool_use_id")
    if not isinstance(ident, str) or ident not in open_calls:
        raise ApiError(400, f"{where}: tool_result's tool_use_id {ident!r} answers no tool_use of an earlier "
                       "assistant message.", param=where)
    open_calls.discard(ident)
    content = block.get("content", "")
    if isinstance(content, list):
        content = _joined([_part(b, f"{where}.content[{k}]", limits) for k, b in enumerate(content)])
    elif not isinstance(content, str):
        raise ApiError(400, f"{where}.content: a tool_result's content is a string or a list of text and image "
                       "blocks.", param=where)
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise ApiError(400, f"{where}.is_error must be true or false.", param=where)
    if is_error and isinstance(content, list):
        content = [{"type": "text", "text": "Error:"}, *content]
    elif is_error:
        content = f"Error: {content}"
    return {"role": "tool", "tool_call_id": ident, "content": content}


def _content_text(block: Any, where: str) -> str:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "image":
        raise ApiError(400, f"{where}: an image block in an assistant turn; images go in user turns and "
                       "tool_result blocks.", param=where)
    if kind == "document":
        raise ApiError(400, f"{where}: a document block; localspec reads text and images, not documents, so send "
                       "the document's text.", param=where)
    if kind not in ("text", None) or not isinstance(block, dict):
        raise ApiError(400, f"{where}: unknown content block type {kind!r}; localspec takes text, image, tool_use, "
                       "tool_result and thinking blocks.", param=where)
    return _text(block, where)


def _tool(tool: dict[str, Any], i: int) -> dict[str, Any]:
    where = f"tools[{i}]"
    if tool.get("type") not in (None, "custom"):
        raise ApiError(400, f"{where}: the tool type {tool.get('type')!r} runs on Anthropic's servers; localspec "
                       "offers client tools only (a name, a description and an input_schema).", param=where)
    if not isinstance(tool.get("input_schema"), dict):
        raise ApiError(400, f"{where}.input_schema: a tool needs its input's JSON Schema as an object.", param=where)
    fn = {"name": tool.get("name"), "parameters": tool["input_schema"]}
    if tool.get("description") is not None:
        fn["description"] = tool["description"]
    return {"type": "function", "function": fn}


def _tool_choice(choice: dict[str, Any]) -> dict[str, Any]:
    kind = choice.get("type")
    words = {"auto": "auto", "any": "required", "none": "none"}
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise ApiError(400, "tool_choice.name: a tool choice of type 'tool' names the tool.", param="tool_choice")
        out: dict[str, Any] = {"tool_choice": {"type": "function", "function": {"name": choice["name"]}}}
    elif kind in words:
        out = {"tool_choice": words[kind]}
    else:
        raise ApiError(400, f"tool_choice.type must be auto, any, tool or none, got {kind!r}.", param="tool_choice")
    single = choice.get("disable_parallel_tool_use")
    if single is not None:
        if not isinstance(single, bool):
            raise ApiError(400, "tool_choice.disable_parallel_tool_use must be true or false.", param="tool_choice")
        out["parallel_tool_calls"] = not single
    return out


def _output_format(config: Optional[dict[str, Any]], beta: Optional[dict[str, Any]]) -> dict[str, Any]:
    """``output_config.format`` (or the beta's ``output_format``) as the ``response_format`` chat completions
    constrains its output with: a JSON Schema the answer follows."""
    given = [(where, fmt) for where, fmt in (("output_config.format", (config or {}).get("format")),
                                             ("output_format", beta)) if fmt is not None]
    if not given:
        return {}
    if len(given) > 1:
        raise ApiError(400, "output_format and output_config.format both give the output's format; give it once, "
                       "as output_config.format (output_format is its older beta name).", param="output_format")
    where, fmt = given[0]
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise ApiError(400, f"{where} must be {{\"type\": \"json_schema\", \"schema\": {{...}}}} with the JSON Schema "
                       "as an object.", param=where)
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}}


def _thinking(thinking: dict[str, Any]) -> dict[str, Any]:
    kind = thinking.get("type")
    if kind == "disabled":
        return {"think": False}
    if kind == "adaptive":
        return {"think": True}
    if kind != "enabled":
        raise ApiError(400, f"thinking.type must be enabled, disabled or adaptive, got {kind!r}.", param="thinking")
    budget = thinking.get("budget_tokens")
    if budget is None:
        return {"think": True}
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
        raise ApiError(400, f"thinking.budget_tokens must be a whole number of tokens, got {budget!r}.",
                       param="thinking")
    return {"think": True, "think_budget": min(budget, MAX_THINK_BUDGET)}
