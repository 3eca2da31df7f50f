"""OpenAI's chat completions and completions bodies: typed models, and their translation into the server's
``GenerationRequest``.

Types and structure are checked by pydantic (strict: ``"2"`` is not a
number, ``true`` is not 1), value ranges by ``GenerationOptions`` (the same
bounds as the CLI and the Python API). Every mistake becomes one
``ApiError`` with OpenAI's ``param`` and ``code``: an unknown field, a field
localspec does not implement with a value that would change the output, a
role it cannot render, a value out of range. Nothing is silently ignored.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, ValidationError

from ...constraint import Constraint
from ...errors import LocalspecError
from ...methods import HISTORY
from ...options import MAX_LOGPROBS, GenerationOptions
from ...structured.tool_use import CHOICES, ToolUse
from ..generation import GenerationRequest, Limits
from ..http import ApiError
from ..images import from_url, is_image_part
from ..reasoning_fields import reasoning_fields

#: Request fields that would change the output and that localspec does not implement, with the values
#: that mean "not used": anything else gets a 400 naming the field.
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "n": (1,), "best_of": (1,), "echo": (False,),
    "functions": ([],), "function_call": ("none", "auto"), "ignore_eos": (False,), "typical_p": (1,),
    "mirostat": (0,), "audio": ({},), "modalities": (["text"],),
}
#: The fields that constrain the output, and the constraint each asks for: OpenAI's, then llama-server's.
CONSTRAINT_FIELDS: dict[str, Callable[[Any], Optional[Constraint]]] = {
    "response_format": Constraint.response_format,
    "json_schema": lambda v: Constraint.json_schema(v) if v not in ({}, None) else None,
    "grammar": lambda v: Constraint.gbnf(v) if isinstance(v, str) and v else None,
}
#: localspec's and llama-server's own sampling and speculation fields, which the other APIs' bodies pass on.
OWN_FIELDS = ("method", "k", "speculative", "history", "seed", "min_p", "top_k", "repeat_penalty",
              "repetition_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty", "logit_bias", "think",
              "think_budget")
#: Fields of an earlier assistant message that clients send back as they got them; only their empty values.
MESSAGE_EXTRAS = ("name", "refusal", "function_call", "audio", "annotations")
#: The content parts that carry an image: OpenAI's, and the library's own (another API's image, read).
IMAGE_PARTS = ("image_url", "image")
#: The roles a chat template renders. "developer" is OpenAI's newer name for "system"; "tool" answers a call.
Role = Literal["system", "user", "assistant", "developer", "tool"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class Speculative(_Strict):
    """localspec's own fields, grouped: ``{"method": "lookup", "k": 4}``."""

    method: Optional[str] = None
    k: Optional[int] = None
    history: Optional[bool] = None


class Prediction(_Strict):
    """OpenAI's predicted output: ``{"type": "content", "content": TEXT or text parts}``."""

    type: Literal["content"]
    content: Union[str, list[dict[str, Any]]]


class CalledFunction(_Strict):
    name: str
    arguments: str


class MessageToolCall(_Strict):
    """A call in an earlier assistant message, as the reply gave it."""

    id: str
    type: Literal["function"]
    function: CalledFunction
    index: Optional[int] = None  # kept by clients that put the call together from streamed deltas


class Message(_Strict):
    role: Role
    content: Union[str, list[dict[str, Any]], None] = None
    name: Optional[str] = None
    refusal: Optional[str] = None
    tool_calls: Optional[list[MessageToolCall]] = None
    tool_call_id: Optional[str] = None
    function_call: Optional[Any] = None
    audio: Optional[Any] = None
    annotations: Optional[list[Any]] = None


class _Body(_Strict):
    """Fields both endpoints take. ``None`` (JSON null) always means "not given"."""

    model: Optional[str] = None
    max_tokens: Optional[int] = None
    max_completion_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    seed: Optional[int] = None
    stop: Union[str, list[str], None] = None
    stream: Optional[bool] = None
    stream_options: Optional[StreamOptions] = None
    method: Optional[str] = None
    k: Optional[int] = None
    history: Optional[bool] = None
    think: Optional[bool] = None  # a reasoning model's thinking on or off (localspec's, as the Python API's)
    think_budget: Optional[int] = None  # the most tokens it thinks for
    speculative: Optional[Speculative] = None
    user: Optional[str] = None  # an end-user id for the caller's own logs; changes nothing
    logit_bias: Optional[dict[str, Union[int, float]]] = None
    presence_penalty: Union[int, float, None] = None
    frequency_penalty: Union[int, float, None] = None
    repeat_penalty: Union[int, float, None] = None  # llama-server's and llama-cpp-python's name
    repetition_penalty: Union[int, float, None] = None  # vLLM's name for the same penalty
    repeat_last_n: Optional[int] = None
    logprobs: Union[bool, int, None] = None  # chat: true/false (with top_logprobs); completions: how many
    top_logprobs: Optional[int] = None
    tools: Optional[list[Any]] = None  # checked by structured.tool_use.ToolUse
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: Optional[bool] = None
    # Not implemented: only the values in UNSUPPORTED are accepted.
    n: Any = None
    best_of: Any = None
    echo: Any = None
    functions: Any = None
    function_call: Any = None
    ignore_eos: Any = None
    typical_p: Any = None
    mirostat: Any = None
    grammar: Any = None
    json_schema: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Optional[Prediction] = None
    response_format: Any = None


class ChatBody(_Body):
    messages: list[Message]
    reasoning_effort: Optional[str] = None  # OpenAI's: "none" turns a reasoning model's thinking off
    chat_template_kwargs: Optional[dict[str, Any]] = None  # llama-server's and vLLM's template variables


class CompletionBody(_Body):
    prompt: Union[str, list[int], list[str], list[list[int]]]
    suffix: Optional[str] = None  # fill-in-the-middle: the text after the one to generate


#: Body fields -> GenerationOptions fields.
OPTION_FIELDS = {"max_tokens": "max_tokens", "max_completion_tokens": "max_tokens", "temperature": "temperature",
                 "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "seed": "seed", "stop": "stop",
                 "method": "method", "k": "k", "history": "history", "logit_bias": "logit_bias",
                 "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
                 "repeat_penalty": "repeat_penalty", "repetition_penalty": "repeat_penalty",
                 "repeat_last_n": "repeat_last_n", "think": "think", "think_budget": "think_budget"}


def parse_request(body: Any, chat: bool, defaults: GenerationOptions, limits: Limits) -> GenerationRequest:
    """Check a request body and turn it into options.

    Raises:
        ApiError: with OpenAI's status, ``param`` and ``code`` for the first thing wrong.
    """
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    try:
        req: _Body = (ChatBody if chat else CompletionBody).model_validate(body)
    except ValidationError as exc:
        raise _validation_error(exc) from None
    except RecursionError:
        raise ApiError(400, "The request body is nested too deeply.") from None
    if req.model is not None and not limits.serves(req.model):
        raise ApiError(404, f"The model {req.model!r} does not exist; this server has {', '.join(limits.models)}.",
                       param="model", code="model_not_found")
    for name, neutral in UNSUPPORTED.items():
        value = getattr(req, name)
        if value is not None and not _is_neutral(value, neutral):
            raise ApiError(400, f"localspec does not support {name!r} (got {_short(value)}); leave it out.",
                           param=name, code="unsupported_parameter")
    options = _options(req, defaults, limits)
    template_vars = None
    if isinstance(req, ChatBody):
        options, template_vars = reasoning_fields(req.reasoning_effort, req.chat_template_kwargs, options)
    stream = bool(req.stream)
    if req.stream_options is not None and not stream:
        raise ApiError(400, "'stream_options' is only allowed with \"stream\": true.", param="stream_options",
                       code="invalid_value")
    include_usage = req.stream_options.include_usage if req.stream_options else False
    if isinstance(req, ChatBody):
        return GenerationRequest(True, _messages(req.messages, limits), None, options, stream, include_usage,
                                 tools=_tools(req), template_vars=template_vars)
    assert isinstance(req, CompletionBody)
    given = next((f for f in ("tools", "tool_choice", "parallel_tool_calls") if getattr(req, f) is not None), None)
    if given is not None:
        raise ApiError(400, f"'{given}' goes with /v1/chat/completions: a completion continues raw text, which no "
                       "chat template wraps with tools.", param=given, code="unsupported_parameter")
    prompt = "" if req.suffix and req.prompt == "" else _prompt(req.prompt)  # FIM at a file's start
    if req.suffix:  # "" is OpenAI's "no suffix"
        _check_text(req.suffix, "suffix", "suffix")
        if not isinstance(prompt, str):
            raise ApiError(400, "A 'suffix' goes with a text 'prompt' (the text before the one to fill in), not "
                           "token ids.", param="suffix", code="invalid_value")
    return GenerationRequest(False, None, prompt, options, stream, include_usage, req.suffix or None)


def _options(req: _Body, defaults: GenerationOptions, limits: Limits) -> GenerationOptions:
    given: dict[str, Any] = {}
    for source in (req, req.speculative):
        for name, target in OPTION_FIELDS.items():
            value = getattr(source, name, None)
            if value is None:
                continue
            if target in given and given[target] != value:  # e.g. max_tokens and max_completion_tokens
                raise ApiError(400, f"The request gives {target!r} twice with different values ({given[target]!r} "
                               f"and {value!r}); give it once.", param=name, code="invalid_value")
            given[target] = value
    if not limits.history and (given.get("history") is True or given.get("method") == HISTORY.name):
        raise ApiError(400, "History is off on this server (--no-history or LOCALSPEC_HISTORY=off); "
                       "leave out 'history' and method 'history'.",
                       param="history" if given.get("history") is True else "method", code="history_off")
    if not limits.history:
        given["history"] = False
    constraint = _constraint(req)
    if constraint is not None:
        given["grammar"] = constraint
    if req.prediction is not None:
        given["prediction"] = _text_of(req.prediction.content, "prediction", "prediction") or None
    if req.logprobs is not None or req.top_logprobs is not None:  # given: on or off, whatever the default
        given["logprobs"] = _logprobs(req)
    try:
        options = defaults.replace(**given)
    except LocalspecError as exc:
        param = next((n for n in (*OPTION_FIELDS, "logprobs") if re.search(rf"\b{n}\b", str(exc))), None)
        raise ApiError(400, str(exc), param=param, code="invalid_value") from None
    if limits.max_tokens is not None and options.max_tokens > limits.max_tokens:
        options = options.replace(max_tokens=limits.max_tokens)  # the operator's cap, as llama-server's n_predict
    return options


def _text_of(content: Union[str, list[dict[str, Any]]], where: str, param: str) -> str:
    """A message's or a prediction's ``content``: the text, or its text parts joined (nothing else is read)."""
    if isinstance(content, list):  # content parts: text only
        for j, part in enumerate(content):
            _text_part(part, f"{where}.content[{j}]", param)
        content = "".join(p["text"] for p in content)
    _check_text(content, f"{where}.content", param)
    return content


def _content(content: Union[str, list[dict[str, Any]]], where: str,
             limits: Limits) -> Union[str, list[dict[str, Any]]]:
    """A message's ``content``: its text as ``_text_of`` reads it, or, where it holds images, its text and image
    parts in order (each image the library's part, read now: ``server.images``)."""
    if not (isinstance(content, list) and any(p.get("type") in IMAGE_PARTS for p in content)):
        return _text_of(content, where, "messages")
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        if is_image_part(part):  # made from another API's image by its parser
            parts.append(part)
        elif part.get("type") == "image_url":
            parts.append(_image_url(part, at, limits))
        else:
            parts.append({"type": "text", "text": _text_part(part, at, "messages")})
            _check_text(parts[-1]["text"], f"{at}.text", "messages")
    return parts


def _image_url(part: dict[str, Any], where: str, limits: Limits) -> dict[str, Any]:
    """An ``image_url`` part (``{"url": URL, "detail": ...}``, or the URL alone) as the library's image part."""
    value = part.get("image_url")
    keys = [k for k in part if k not in ("type", "image_url")]
    keys += [f"image_url.{k}" for k in value if k not in ("url", "detail")] if isinstance(value, dict) else []
    if keys:
        raise ApiError(400, f"{where} has {keys[0]!r}, which localspec does not take; send {{\"type\": "
                       "\"image_url\", \"image_url\": {\"url\": URL}}.", param="messages", code="unknown_parameter")
    return from_url(value.get("url") if isinstance(value, dict) else value, where, limits, "messages")


def _text_part(part: dict[str, Any], where: str, param: str) -> str:
    """A text part's text (any other part is a 400)."""
    kind = part.get("type")
    if kind == "image_url":  # a prediction's
        raise ApiError(400, f"{where} is an image; a prediction is text only.", param=param, code="invalid_value")
    if kind == "image":
        raise ApiError(400, f"{where} is an 'image' part, which OpenAI's API does not have; send an image as "
                       "{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/png;base64,...\"}}.",
                       param=param, code="invalid_value")
    if kind != "text" or not isinstance(part.get("text"), str):
        raise ApiError(400, f"{where} is a {kind!r} part; localspec reads text parts (and image_url parts in "
                       "messages).", param=param, code="unsupported_parameter")
    unknown = next((key for key in part if key not in ("type", "text")), None)
    if unknown is not None:
        raise ApiError(400, f"{where} has {unknown!r}, which localspec does not take; send only type and text.",
                       param=param, code="unknown_parameter")
    return str(part["text"])


def _logprobs(req: _Body) -> Optional[int]:
    """How many alternatives to give with each token's log-probability (None: no logprobs), as chat asks
    (``logprobs: true`` and ``top_logprobs``) or a completion does (``logprobs: N``)."""
    lp, top = req.logprobs, req.top_logprobs
    if isinstance(req, ChatBody):
        if lp is not None and not isinstance(lp, bool):
            raise ApiError(400, "For chat, 'logprobs' is true or false; give the number of alternatives as "
                           "'top_logprobs'.", param="logprobs", code="invalid_type")
        if top not in (None, 0) and lp is not True:
            raise ApiError(400, "'top_logprobs' needs \"logprobs\": true.", param="top_logprobs",
                           code="invalid_value")
        if top is not None and not 0 <= top <= MAX_LOGPROBS:
            raise ApiError(400, f"'top_logprobs' must be from 0 to {MAX_LOGPROBS}, got {top}.", param="top_logprobs",
                           code="invalid_value")
        return (top or 0) if lp else None
    if top not in (None, 0):
        raise ApiError(400, "Completions take 'logprobs': N (the alternatives per token), not 'top_logprobs'.",
                       param="top_logprobs", code="unknown_parameter")
    if lp is True:
        raise ApiError(400, f"For completions, 'logprobs' is a number (the alternatives per token, 0 to "
                       f"{MAX_LOGPROBS}).", param="logprobs", code="invalid_type")
    return None if lp is False else lp


def _constraint(req: _Body) -> Optional[Constraint]:
    """The one constraint the request asks for (response_format, or llama-server's json_schema or grammar)."""
    found: list[tuple[str, Constraint]] = []
    for name, make in CONSTRAINT_FIELDS.items():
        value = getattr(req, name)
        if value is None:
            continue
        if name == "grammar" and not isinstance(value, str):
            raise ApiError(400, "'grammar' must be a GBNF grammar as a string.", param=name, code="invalid_value")
        try:
            made = make(value)
        except LocalspecError as exc:
            raise ApiError(400, str(exc), param=name, code="invalid_value") from None
        if made is not None:
            found.append((name, made))
    if len(found) > 1:
        raise ApiError(400, f"Give one of {', '.join(CONSTRAINT_FIELDS)}, not {found[0][0]!r} and {found[1][0]!r}.",
                       param=found[1][0], code="invalid_value")
    return found[0][1] if found else None


def _tools(req: ChatBody) -> Optional[ToolUse]:
    """The tools a chat request offers, and its tool_choice and parallel_tool_calls."""
    choice = req.tool_choice
    if isinstance(choice, str) and choice not in CHOICES:
        raise ApiError(400, f"'tool_choice' must be none, auto, required or {{\"type\": \"function\", \"function\": "
                       f"{{\"name\": ...}}}}, got {choice!r}.", param="tool_choice", code="invalid_value")
    try:
        return ToolUse.from_openai(req.tools, choice, req.parallel_tool_calls)
    except LocalspecError as exc:
        param = "tool_choice" if "tool_choice" in str(exc) else "tools"
        raise ApiError(400, str(exc), param=param, code="invalid_value") from None


def _is_neutral(value: Any, neutral: tuple[Any, ...]) -> bool:
    """``value`` is one of the values that mean "not used" (``true`` is not 1 here)."""
    return any(value == n and isinstance(value, bool) == isinstance(n, bool) for n in neutral)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _field_path(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """A pydantic location without the labels it adds for each member of a union (``str``, ``list[int]``)."""
    return tuple(p for p in loc if not (isinstance(p, str) and (p in ("str", "int", "float", "bool") or "[" in p)))


def _validation_error(exc: ValidationError) -> ApiError:
    """The first of pydantic's complaints as one sentence, with the top-level field as ``param``."""
    errors = exc.errors(include_url=False)
    # Within the first field at fault, the deepest complaint is the one about what the client meant: for
    # "stop": [1], "stop[0] should be a string", not "stop should be a string".
    first = _field_path(errors[0]["loc"])[:1]
    err = max((e for e in errors if _field_path(e["loc"])[:1] == first), key=lambda e: len(_field_path(e["loc"])))
    loc = _field_path(err["loc"])
    param = str(loc[0]) if loc else None
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".") or "the body"
    if err["type"] == "extra_forbidden" and len(loc) == 1:
        return ApiError(400, f"localspec does not know the field {param!r}; leave it out (docs/server.md "
                        "lists the fields it takes).", param=param, code="unknown_parameter")
    if err["type"] == "extra_forbidden":
        return ApiError(400, f"{where} is not a field localspec takes; leave it out.", param=param,
                        code="unknown_parameter")
    if err["type"] == "missing":
        return ApiError(400, f"'{where}' is required.", param=param, code="missing_parameter")
    # A union's members each complain at the same place: "a valid string or a valid list".
    wanted = dict.fromkeys(e["msg"].rstrip(".").removeprefix("Input should be ") for e in errors
                           if _field_path(e["loc"]) == loc)
    return ApiError(400, f"'{where}' should be {' or '.join(wanted)} (got {_short(err.get('input'))}).",
                    param=param, code="invalid_type")


def _messages(messages: list[Message], limits: Limits) -> list[dict[str, Any]]:
    if not messages:
        raise ApiError(400, "'messages' must be a non-empty list of {role, content} objects.", param="messages")
    out = []
    for i, m in enumerate(messages):
        for extra in MESSAGE_EXTRAS:
            if getattr(m, extra) not in (None, [], "") and not (extra == "name" and m.role == "tool"):
                raise ApiError(400, f"messages[{i}].{extra} is not supported by localspec; leave it out.",
                               param="messages", code="unsupported_parameter")
        if (m.role == "tool") != (m.tool_call_id is not None):
            raise ApiError(400, f"messages[{i}] has role {m.role!r} " + ("but no tool_call_id (the id of the call it "
                           "answers)." if m.role == "tool" else "and a tool_call_id, which only a 'tool' message has."),
                           param="messages", code="invalid_value")
        if m.tool_calls and m.role != "assistant":
            raise ApiError(400, f"messages[{i}] has role {m.role!r} and tool_calls, which only an assistant message "
                           "has.", param="messages", code="invalid_value")
        if m.content is None and not (m.role == "assistant" and m.tool_calls):
            raise ApiError(400, f"messages[{i}] ({m.role}) has no content; give its text as 'content'.",
                           param="messages", code="invalid_value")
        message: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role,
                                   "content": _content(m.content or "", f"messages[{i}]", limits)}
        if m.tool_calls:
            message["tool_calls"] = [c.model_dump(exclude={"index"}) for c in m.tool_calls]
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        if m.role == "tool" and m.name:
            message["name"] = m.name  # the function answered, which some templates show
        out.append(message)
    return out


def _prompt(value: Union[str, list[int], list[str], list[list[int]]]) -> Union[str, list[int]]:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]  # one prompt in a list
    if isinstance(value, str) and value:
        _check_text(value, "prompt", "prompt")
        return value
    if isinstance(value, list) and value and all(isinstance(t, int) for t in value):
        return value  # type: ignore[return-value]
    raise ApiError(400, "'prompt' must be one non-empty string (or one list of token ids).", param="prompt")


def _check_text(text: str, where: str, param: str) -> None:
    """Refuse text that cannot be encoded as UTF-8 (JSON can carry lone surrogates such as "\\ud800")."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ApiError(400, f"'{where}' is not valid Unicode text: it has a lone surrogate "
                       f"(U+{ord(text[exc.start]):04X}) at character {exc.start}.", param=param,
                       code="invalid_value") from None
