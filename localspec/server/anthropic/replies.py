"""Anthropic's Messages API out: a generation's result as a ``message``, or as the stream of events
Anthropic sends (``message_start``, content blocks with their deltas, ``message_delta``, ``message_stop``,
``ping`` while waiting)."""

from __future__ import annotations

import datetime
import json
import uuid
from typing import Any, Optional

from ...results import Result
from ...structured.call_reader import CallEvent, ToolCall
from ..generation import GenerationRequest
from ..http import ApiError
from ..openai.replies import stats

#: Anthropic's error type for each status the server answers with.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 408: "timeout_error", 413: "request_too_large",
               415: "invalid_request_error", 429: "rate_limit_error", 499: "api_error", 529: "overloaded_error"}
#: Anthropic's stop_reason for each finish_reason.
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "interrupted": "end_turn"}


def event(name: str, data: dict[str, Any]) -> str:
    """One server-sent event as Anthropic writes them: its name, and its data carrying the same ``type``."""
    return f"event: {name}\ndata: {json.dumps({'type': name, **data}, ensure_ascii=False)}\n\n"


def tool_id(call_id: str) -> str:
    """A call's id as Anthropic prefixes one."""
    return "toolu_" + call_id.removeprefix("call_")


def stop_reason(r: Result) -> tuple[str, Optional[str]]:
    """``stop_reason`` and ``stop_sequence`` for a result."""
    if r.stop_string is not None:
        return "stop_sequence", r.stop_string
    return STOP_REASONS.get(r.finish_reason or "stop", "end_turn"), None


def usage(prompt_tokens: int, cached_tokens: int, output_tokens: int) -> dict[str, int]:
    """Anthropic's usage, as its API counts: ``input_tokens`` the prompt tokens processed, the prompt's other
    tokens (those the prompt cache gave) in ``cache_read_input_tokens``, and the tokens generated."""
    return {"input_tokens": prompt_tokens - cached_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached_tokens, "output_tokens": output_tokens}


def result_usage(r: Result) -> dict[str, int]:
    """A generation's usage (``usage``)."""
    return usage(len(r.prompt_tokens), r.stats.cached_prompt_tokens, len(r.tokens))


def _input(call: ToolCall) -> Any:
    try:
        value = json.loads(call.arguments)
    except ValueError:  # cut off by max_tokens
        return {}
    return value if isinstance(value, dict) else {}


def error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error object for ``status``."""
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def status_of(error: ApiError) -> int:
    """The status Anthropic answers ``error`` with: a busy or stopping server is 529, overloaded."""
    return 529 if error.status == 503 else error.status


def model_object(name: str, created: int) -> dict[str, Any]:
    """A model as Anthropic's Models API describes one (``created``: seconds since the epoch)."""
    when = datetime.datetime.fromtimestamp(created, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"type": "model", "id": name, "display_name": name, "created_at": when, "lifecycle": "active"}


class MessageReply:
    """The reply to one Messages request (``server.relay.Reply``)."""

    media_type = "text/event-stream"

    def __init__(self, model: str, request: GenerationRequest):
        self.model, self.request = model, request
        self.id = "msg_" + uuid.uuid4().hex[:24]
        self._open: Optional[str] = None  # the kind of the content block open now, if one is
        self._index = -1  # its index

    def whole(self, r: Result) -> dict[str, Any]:
        blocks: list[dict[str, Any]] = []
        if r.reasoning:
            blocks.append({"type": "thinking", "thinking": r.reasoning, "signature": ""})
        text = r.content if r.tool_calls is not None else r.text
        if text or not r.tool_calls:
            blocks.append({"type": "text", "text": text or ""})
        for call in r.tool_calls or []:
            blocks.append({"type": "tool_use", "id": tool_id(call.id), "name": call.name, "input": _input(call)})
        reason, sequence = stop_reason(r)
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": blocks,
                "stop_reason": reason, "stop_sequence": sequence, "usage": result_usage(r), **stats(r)}

    def start(self, prompt_tokens: int, cached_tokens: int) -> list[str]:
        message: dict[str, Any] = {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                                   "content": [], "stop_reason": None, "stop_sequence": None,
                                   "usage": usage(prompt_tokens, cached_tokens, 0)}
        return [event("message_start", {"message": message}), self.ping()[0]]

    def ping(self) -> list[str]:
        return [event("ping", {})]

    def logprobs(self, entry: dict[str, Any]) -> None:
        """Not asked for on this API."""

    def reasoning(self, text: str) -> list[str]:
        out = self._block("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        return out + [self._delta({"type": "thinking_delta", "thinking": text})]

    def content(self, found: list[CallEvent]) -> list[str]:
        return [piece for e in found for piece in self._call_event(e)]

    def end(self, r: Result, tail: list[CallEvent]) -> list[str]:
        out = self.content(tail) + self._close()
        reason, sequence = stop_reason(r)
        out.append(event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": sequence},
                                           "usage": result_usage(r), **stats(r)}))
        return out + [event("message_stop", {})]

    def error(self, error: ApiError) -> list[str]:
        return [event("error", {"error": error_body(status_of(error), error.message)["error"]})]

    def _call_event(self, e: CallEvent) -> list[str]:
        if e.kind == "content":
            return self._text(e.text)
        if e.kind == "call":
            start = {"type": "tool_use", "id": tool_id(e.id), "name": e.text, "input": {}}
            return self._block("tool_use", start, fresh=True)  # each call is a block of its own
        return [self._delta({"type": "input_json_delta", "partial_json": e.text})]

    def _text(self, text: str) -> list[str]:
        if not text:
            return []
        return self._block("text", {"type": "text", "text": ""}) + [self._delta({"type": "text_delta", "text": text})]

    def _block(self, kind: str, start: dict[str, Any], fresh: bool = False) -> list[str]:
        """Open a block of ``kind`` unless one is open (``fresh``: a new one anyway), closing the one before."""
        if self._open == kind and not fresh:
            return []
        out = self._close()
        self._open, self._index = kind, self._index + 1
        return out + [event("content_block_start", {"index": self._index, "content_block": start})]

    def _close(self) -> list[str]:
        if self._open is None:
            return []
        self._open = None
        return [event("content_block_stop", {"index": self._index})]

    def _delta(self, delta: dict[str, Any]) -> str:
        return event("content_block_delta", {"index": self._index, "delta": delta})
