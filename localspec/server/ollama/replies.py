"""Ollama's API out: a generation's result as ``/api/chat``'s ``message`` or ``/api/generate``'s ``response``,
whole or as newline-delimited JSON objects, and Ollama's error, ``{"error": "..."}``.

A stream has no comment line: every line is a JSON object its clients parse (the ``ollama`` package parses
each line, a blank one too). While a long prompt is processed, the keep-alive is an object with nothing new in
it (empty text, ``"done": false``), which clients add nothing from.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Any, Optional

from fastapi.responses import Response

from ...results import Result
from ...structured.call_reader import CallEvent
from ..http import ApiError
from ..openai.replies import stats
from .requests import tagged

#: Ollama's reasons for a finished reply, by the library's finish reasons.
DONE_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop"}


def error_response(exc: ApiError) -> Response:
    """An error as Ollama answers one: ``{"error": "..."}`` with its status."""
    return Response(_line({"error": exc.message}).rstrip("\n"), status_code=exc.status, headers=exc.headers,
                    media_type="application/json")


def rfc3339(seconds: Optional[float] = None) -> str:
    """A time (default: now) as Ollama writes them."""
    moment = datetime.fromtimestamp(time.time() if seconds is None else seconds, timezone.utc)
    return moment.isoformat().replace("+00:00", "Z")


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


class OllamaReply:
    """The reply to one ``/api/chat`` or ``/api/generate`` request (``server.relay.Reply``).

    Args:
        model: the model's name.
        chat: ``/api/chat`` (else ``/api/generate``).
        started: when the request came (``time.monotonic``), for ``total_duration``.
    """

    media_type = "application/x-ndjson"

    def __init__(self, model: str, chat: bool, started: float):
        self.model, self.chat, self.started = tagged(model), chat, started

    def _object(self, text: str, thinking: Optional[str] = None, done: bool = False,
                calls: Optional[list[dict[str, Any]]] = None) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "created_at": rfc3339()}
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if thinking is not None:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            out["message"] = message
        else:
            out["response"] = text
            if thinking is not None:
                out["thinking"] = thinking
        out["done"] = done
        return out

    def loaded(self) -> dict[str, Any]:
        """The answer to a request with nothing to generate (Ollama loads the model)."""
        return {**self._object(""), "done": True, "done_reason": "load"}

    def start(self, prompt_tokens: int, cached_tokens: int) -> list[str]:
        """Nothing: the first object carries the first text (or, while the prompt is processed, nothing new)."""
        return []

    def ping(self) -> list[str]:
        return [_line(self._object(""))]

    def logprobs(self, entry: dict[str, Any]) -> None:
        """Not asked for here: ``logprobs`` is refused on Ollama's routes."""

    def reasoning(self, text: str) -> list[str]:
        return [_line(self._object("", thinking=text))]

    def content(self, found: list[CallEvent]) -> list[str]:
        """The answer's text as it comes; its calls come whole, at the end."""
        text = "".join(e.text for e in found if e.kind == "content")
        return [_line(self._object(text))] if text else []

    def end(self, r: Result, tail: list[CallEvent]) -> list[str]:
        """The last lines: held-back text with the calls, and the done object with the counts."""
        out = []
        text = "".join(e.text for e in tail if e.kind == "content")
        if text or r.tool_calls:
            out.append(_line(self._object(text, calls=_calls(r))))
        out.append(_line({**self._object(""), **self._counts(r)}))
        return out

    def error(self, error: ApiError) -> list[str]:
        """A failure after the stream began: said in the stream, as Ollama does."""
        return [_line({"error": error.message})]

    def whole(self, r: Result) -> dict[str, Any]:
        """The reply to a request that did not ask to stream."""
        text = (r.content or "") if r.tool_calls else r.text
        # no reasoning, or a reasoning closed at once (thinking off): no field, as Ollama omits an empty one
        return {**self._object(text, r.reasoning or None, calls=_calls(r)), **self._counts(r)}

    def _counts(self, r: Result) -> dict[str, Any]:
        s = r.stats
        return {"done": True, "done_reason": DONE_REASONS.get(r.finish_reason or "stop", "stop"),
                "total_duration": int(1e9 * (time.monotonic() - self.started)), "load_duration": 0,
                "prompt_eval_count": len(r.prompt_tokens), "prompt_eval_duration": int(1e9 * s.prefill_seconds),
                "eval_count": len(r.tokens), "eval_duration": int(1e9 * s.decode_seconds),
                "localspec": stats(r)["localspec"]}


def _calls(r: Result) -> Optional[list[dict[str, Any]]]:
    """The reply's calls as Ollama gives them, arguments as an object; a call cut off by ``num_predict`` (its
    arguments not yet JSON) is left out, and ``done_reason`` says "length"."""
    out: list[dict[str, Any]] = []
    for c in r.tool_calls or ():
        try:
            args = json.loads(c.arguments)
        except ValueError:
            continue
        out.append({"id": c.id, "function": {"index": len(out), "name": c.name, "arguments": args}})
    return out or None
