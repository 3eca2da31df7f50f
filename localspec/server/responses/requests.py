"""OpenAI's Responses API in: a ``/v1/responses`` body translated into the server's one request type.

The server keeps no responses: each request carries its whole conversation (``instructions`` and
``input``), and ``previous_response_id`` is a 400 saying so. Input items (messages with text and
``input_image`` parts, ``function_call`` and ``function_call_output``) are written as the chat messages they
mean (an image as the library's image part, ``server.images``), ``text.format`` as ``response_format`` and
``reasoning.effort`` as ``reasoning_effort``, then checked by ``openai.requests.parse_request`` as a chat
completion is. Fields that change nothing here (``store``, ``include``, ``metadata``, ``prompt_cache_key``
and fields the API adds later) are ignored.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationError

from ...options import GenerationOptions
from ..generation import GenerationRequest, Limits
from ..http import ApiError
from ..images import check_vision, from_url
from ..openai.requests import OWN_FIELDS, parse_request

#: Input roles, as chat messages take them.
ROLES = ("user", "assistant", "system", "developer")
#: Chat request fields -> the Responses fields they came from, for errors.
PARAMS = {"max_tokens": "max_output_tokens", "response_format": "text.format", "reasoning_effort": "reasoning.effort",
          "messages": "input"}
#: Tools that run on OpenAI's servers, which a local model cannot call: left out of what the model is offered
#: (Codex sends web_search with every request).
HOSTED = frozenset({"web_search", "web_search_preview", "file_search", "code_interpreter", "image_generation",
                    "computer_use_preview", "mcp", "tool_search"})
#: The text parts a message item may have.
TEXT_PARTS = ("input_text", "output_text", "text", "summary_text")


class ResponsesBody(BaseModel):
    """The fields of a Responses body this server reads (strictly typed); any other is ignored."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: Optional[str] = None
    input: Union[str, list[dict[str, Any]]]
    instructions: Optional[str] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: Optional[bool] = None
    max_output_tokens: Optional[int] = None
    temperature: Union[int, float, None] = None
    top_p: Union[int, float, None] = None
    text: Optional[dict[str, Any]] = None
    reasoning: Optional[dict[str, Any]] = None
    stream: Optional[bool] = None
    previous_response_id: Optional[str] = None
    background: Optional[bool] = None


def parse_responses(body: Any, defaults: GenerationOptions,
                    limits: Limits) -> tuple[GenerationRequest, ResponsesBody]:
    """A Responses body as the server's request, and the body as read (its reply echoes some fields).

    Raises:
        ApiError: 400 (404 for an unknown model) with OpenAI's ``param`` for the first thing wrong.
    """
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    try:
        req = ResponsesBody.model_validate(body)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in err["loc"] if not (isinstance(p, str) and "[" in p)) or "body"
        raise ApiError(400, f"'{where}': {err['msg']}.", param=str(err["loc"][0]) if err["loc"] else None,
                       code="missing_required_parameter" if err["type"] == "missing" else "invalid_type") from None
    except RecursionError:
        raise ApiError(400, "The request body is nested too deeply.") from None
    if req.previous_response_id is not None:
        raise ApiError(400, "This server keeps no responses (it is stateless, as with \"store\": false); send the "
                       "whole conversation in 'input' instead of 'previous_response_id'.",
                       param="previous_response_id", code="previous_response_not_found")
    if req.background:
        raise ApiError(400, "Background responses need a stored response, and this server keeps none.",
                       param="background", code="unsupported_parameter")
    chat: dict[str, Any] = {"messages": _instructions(req.instructions) + _input(req.input, limits)}
    if req.model is not None:
        chat["model"] = req.model
    tools = _tools(req.tools or [])
    if tools:
        chat["tools"] = tools
    if req.tool_choice is not None and (tools or req.tool_choice != "auto"):
        chat["tool_choice"] = _tool_choice(req.tool_choice)
    if req.text is not None:
        chat.update(_format(req.text))
    if req.reasoning is not None and req.reasoning.get("effort") is not None:
        chat["reasoning_effort"] = req.reasoning["effort"]
    chat.update({k: body[k] for k in OWN_FIELDS if body.get(k) is not None})  # localspec's own, checked there
    given = {"parallel_tool_calls": req.parallel_tool_calls, "max_tokens": req.max_output_tokens,
             "temperature": req.temperature, "top_p": req.top_p, "stream": req.stream}
    chat.update({k: v for k, v in given.items() if v is not None})
    try:
        return parse_request(chat, True, defaults, limits), req
    except ApiError as exc:
        raise renamed(exc) from None


def renamed(error: ApiError) -> ApiError:
    """``error`` (about the chat request a body became) with ``param`` naming the Responses field."""
    error.param = PARAMS.get(error.param or "", error.param)
    return error


def error_response(error: ApiError) -> JSONResponse:
    """``error`` as OpenAI's error object, naming the Responses field (a prompt over the context: 'input')."""
    return renamed(error).response()


def _instructions(text: Optional[str]) -> list[dict[str, Any]]:
    return [{"role": "system", "content": text}] if text else []


def _input(items: Union[str, list[dict[str, Any]]], limits: Limits) -> list[dict[str, Any]]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not items:
        raise ApiError(400, "'input' must be a string or a non-empty list of items.", param="input")
    out: list[dict[str, Any]] = []
    calls: set[str] = set()  # the call_ids of the function calls so far
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        where = f"input[{i}]"
        if kind == "message":
            out.append(_message(item, where, limits))
        elif kind == "function_call":
            _function_call(item, where, out, calls)
        elif kind == "function_call_output":
            out.append(_function_output(item, where, calls, limits))
        elif kind == "reasoning":
            continue  # earlier reasoning: the chat template leaves it out of the prompt
        else:
            raise ApiError(400, f"{where} has the unknown item type {kind!r}; localspec takes message, "
                           "function_call, function_call_output and reasoning items.", param="input",
                           code="invalid_value")
    return out


def _message(item: dict[str, Any], where: str, limits: Limits) -> dict[str, Any]:
    role, content = item.get("role"), item.get("content")
    if role not in ROLES:
        raise ApiError(400, f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}.", param="input",
                       code="invalid_value")
    if isinstance(content, list):
        content = _parts(content, f"{where}.content", limits)
    if not isinstance(content, (str, list)):
        raise ApiError(400, f"{where}.content must be a string or a list of text and input_image parts.",
                       param="input", code="invalid_type")
    return {"role": role, "content": content}


def _parts(parts: list[Any], where: str, limits: Limits) -> Union[str, list[dict[str, Any]]]:
    """Content parts: their texts joined, or, where they hold images, text and image parts in order."""
    if not any(isinstance(p, dict) and p.get("type") == "input_image" for p in parts):
        return "".join(_part(p, f"{where}[{j}]") for j, p in enumerate(parts))
    return [_image(p, f"{where}[{j}]", limits) if isinstance(p, dict) and p.get("type") == "input_image" else
            {"type": "text", "text": _part(p, f"{where}[{j}]")} for j, p in enumerate(parts)]


def _image(part: dict[str, Any], where: str, limits: Limits) -> dict[str, Any]:
    """An ``input_image`` part's ``image_url`` (a data URL, or an http(s) one where the server fetches) read."""
    check_vision(where, limits, "input")
    if part.get("file_id") is not None:
        raise ApiError(400, f"{where} names a file_id, a file kept by OpenAI's Files API, which this server does "
                       "not have; send the image as a data:image/...;base64 URL in image_url.", param="input",
                       code="unsupported_parameter")
    return from_url(part.get("image_url"), f"{where}.image_url", limits, "input")


def _part(part: Any, where: str) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in ("input_file", "input_audio"):
        raise ApiError(400, f"{where} is an {kind} part, but this server reads text and images only.", param="input",
                       code="unsupported_parameter")
    if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
        raise ApiError(400, f"{where} must be a text part ({', '.join(TEXT_PARTS[:2])}) with its text, got "
                       f"type {kind!r}.", param="input", code="invalid_value")
    return str(part["text"])


def _function_call(item: dict[str, Any], where: str, out: list[dict[str, Any]], calls: set[str]) -> None:
    """Add a call to the assistant message before it (or to a new one)."""
    ident, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
    if not all(isinstance(v, str) for v in (ident, name, arguments)) or not ident:
        raise ApiError(400, f"{where}: a function_call item needs its call_id, name and arguments as strings.",
                       param="input", code="invalid_value")
    call = {"id": ident, "type": "function", "function": {"name": name, "arguments": arguments}}
    if not out or out[-1]["role"] != "assistant":
        out.append({"role": "assistant", "content": ""})
    out[-1].setdefault("tool_calls", []).append(call)
    calls.add(str(ident))


def _function_output(item: dict[str, Any], where: str, calls: set[str], limits: Limits) -> dict[str, Any]:
    ident, output = item.get("call_id"), item.get("output")
    if not isinstance(ident, str) or ident not in calls:
        raise ApiError(400, f"{where}: function_call_output's call_id {ident!r} answers no function_call before "
                       "it in 'input'.", param="input", code="invalid_value")
    if isinstance(output, list):
        output = _parts(output, f"{where}.output", limits)
    if not isinstance(output, (str, list)):
        raise ApiError(400, f"{where}.output must be a string or a list of text and input_image parts.",
                       param="input", code="invalid_type")
    return {"role": "tool", "tool_call_id": ident, "content": output}


def _tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The function tools offered, as chat's: a namespace's functions among them under their own names, the
    hosted tools left out."""
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type")
        if kind in HOSTED:
            continue
        if kind == "namespace" and isinstance(tool.get("tools"), list):
            out += [_tool(t, f"{i}].tools[{j}") for j, t in enumerate(tool["tools"])]
        else:
            out.append(_tool(tool, i))
    return out


def namespaces(tools: Optional[list[dict[str, Any]]]) -> dict[str, str]:
    """Each function offered inside a namespace tool, and the namespace's name (for its calls' ``namespace``)."""
    return {t["name"]: space["name"] for space in tools or []
            if isinstance(space, dict) and space.get("type") == "namespace" and isinstance(space.get("name"), str)
            for t in space.get("tools") or [] if isinstance(t, dict) and isinstance(t.get("name"), str)}


def _tool(tool: dict[str, Any], i: Union[int, str]) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise ApiError(400, f"tools[{i}] has type {kind!r}; localspec offers function tools (alone or in a "
                       "namespace); leave it out.", param="tools", code="unsupported_parameter")
    fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
    return {"type": "function", "function": fn}


def _tool_choice(choice: Union[str, dict[str, Any]]) -> Union[str, dict[str, Any]]:
    if isinstance(choice, str):
        return choice
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise ApiError(400, "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"name\": ...}.",
                       param="tool_choice", code="invalid_value")
    return {"type": "function", "function": {"name": choice["name"]}}


def _format(text: dict[str, Any]) -> dict[str, Any]:
    fmt = text.get("format")
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return {}
    if not isinstance(fmt, dict) or fmt.get("type") not in ("json_schema", "json_object"):
        raise ApiError(400, "'text.format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                       "{\"type\": \"json_schema\", \"name\": ..., \"schema\": {...}}.", param="text.format",
                       code="invalid_value")
    if fmt["type"] == "json_object":
        return {"response_format": {"type": "json_object"}}
    if not isinstance(fmt.get("schema"), dict):
        raise ApiError(400, "'text.format' of type json_schema needs its 'schema', the JSON Schema as an object.",
                       param="text.format", code="invalid_value")
    schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    return {"response_format": {"type": "json_schema", "json_schema": schema}}
