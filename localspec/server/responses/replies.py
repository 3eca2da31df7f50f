"""OpenAI's Responses API out: a generation's result as a ``response`` object, or as the stream of typed
events (``response.created`` ... ``response.completed``), each ``data`` carrying its ``type`` and
``sequence_number``."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Optional

from ...results import Result
from ...structured.call_reader import CallEvent, ToolCall
from ..generation import GenerationRequest
from ..http import ApiError
from ..openai.replies import stats
from .requests import ResponsesBody, namespaces


def _id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def usage(r: Result) -> dict[str, Any]:
    """The Responses API's usage: prompt tokens (those the prompt cache gave) and generated tokens."""
    n_in, n_out = len(r.prompt_tokens), len(r.tokens)
    return {"input_tokens": n_in, "input_tokens_details": {"cached_tokens": r.stats.cached_prompt_tokens},
            "output_tokens": n_out, "output_tokens_details": {"reasoning_tokens": r.reasoning_tokens},
            "total_tokens": n_in + n_out}


def message_item(ident: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status == "completed" \
        else []
    return {"type": "message", "id": ident, "status": status, "role": "assistant", "content": content}


def call_item(ident: str, call: ToolCall, status: str = "completed",
              namespace: Optional[str] = None) -> dict[str, Any]:
    """A function_call item; ``namespace``: the namespace tool the function was offered in, if one."""
    item = {"type": "function_call", "id": ident, "call_id": call.id, "name": call.name,
            "arguments": call.arguments, "status": status}
    return {**item, "namespace": namespace} if namespace else item


def reasoning_item(ident: str, text: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": ident, "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


class ResponseReply:
    """The reply to one Responses request (``server.relay.Reply``)."""

    media_type = "text/event-stream"

    def __init__(self, model: str, request: GenerationRequest, body: ResponsesBody):
        self.model, self.request, self.body = model, request, body
        self.id, self.created = _id("resp_"), int(time.time())
        self._spaces = namespaces(body.tools)  # a namespaced function's namespace, given back in its calls
        self._seq = 0
        self._output: list[dict[str, Any]] = []  # the items done so far
        self._open: Optional[dict[str, Any]] = None  # the item being streamed: its fields and text so far

    def response(self, status: str, output: list[dict[str, Any]], r: Optional[Result] = None) -> dict[str, Any]:
        """The ``response`` object with ``output`` (and, once there is one, the result's usage)."""
        b = self.body
        text = "".join(p["text"] for item in output if item["type"] == "message" for p in item["content"])
        out: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created, "status": status, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": b.instructions, "max_output_tokens": b.max_output_tokens, "model": self.model,
            "output": output, "output_text": text, "parallel_tool_calls": b.parallel_tool_calls is not False,
            "previous_response_id": None, "reasoning": {"effort": (b.reasoning or {}).get("effort"), "summary": None},
            "store": False, "temperature": self.request.options.temperature, "text": b.text or {"format": {
                "type": "text"}}, "tool_choice": b.tool_choice or "auto", "tools": b.tools or [],
            "top_p": self.request.options.top_p, "truncation": "disabled", "usage": usage(r) if r else None,
            "metadata": {}}
        return {**out, **stats(r)} if r else out

    def whole(self, r: Result) -> dict[str, Any]:
        output: list[dict[str, Any]] = []
        if r.reasoning:
            output.append(reasoning_item(_id("rs_"), r.reasoning))
        text = r.content if r.tool_calls is not None else r.text
        if text or not r.tool_calls:
            output.append(message_item(_id("msg_"), text or ""))
        output += [call_item(_id("fc_"), c, namespace=self._spaces.get(c.name)) for c in r.tool_calls or []]
        return self.response(_status(r), output, r)

    def start(self, prompt_tokens: int, cached_tokens: int) -> list[str]:
        return [self._event("response.created", response=self.response("in_progress", [])),
                self._event("response.in_progress", response=self.response("in_progress", []))]

    def ping(self) -> list[str]:
        return [": keep-alive\n\n"]  # an SSE comment: clients skip it

    def logprobs(self, entry: dict[str, Any]) -> None:
        """Not asked for on this API."""

    def reasoning(self, text: str) -> list[str]:
        out = self._item("reasoning")
        item = self._current()
        item["text"] += text
        return out + [self._event("response.reasoning_text.delta", item_id=item["id"], output_index=item["index"],
                                  content_index=0, delta=text)]

    def content(self, found: list[CallEvent]) -> list[str]:
        return [piece for e in found for piece in self._call_event(e)]

    def end(self, r: Result, tail: list[CallEvent]) -> list[str]:
        out = self.content(tail) + self._done()
        return out + [self._event("response.completed", response=self.response(_status(r), self._output, r))]

    def error(self, error: ApiError) -> list[str]:
        failed = self.response("failed", self._output)
        failed["error"] = {"code": error.code or error.type, "message": error.message}
        return [self._event("error", code=error.code, message=error.message, param=error.param),
                self._event("response.failed", response=failed)]

    def _call_event(self, e: CallEvent) -> list[str]:
        if e.kind == "content":
            return self._text(e.text)
        if e.kind == "call":
            return self._item("function_call", fresh=True, call_id=e.id, name=e.text)
        item = self._current()
        item["text"] += e.text
        return [self._event("response.function_call_arguments.delta", item_id=item["id"],
                            output_index=item["index"], delta=e.text)]

    def _text(self, text: str) -> list[str]:
        if not text:
            return []
        out = self._item("message")
        item = self._current()
        item["text"] += text
        return out + [self._event("response.output_text.delta", item_id=item["id"], output_index=item["index"],
                                  content_index=0, delta=text, logprobs=[])]

    def _current(self) -> dict[str, Any]:
        assert self._open is not None
        return self._open

    def _item(self, kind: str, fresh: bool = False, **fields: str) -> list[str]:
        """Open an output item of ``kind`` unless one is open (``fresh``: a new one anyway)."""
        if self._open is not None and self._open["type"] == kind and not fresh:
            return []
        out = self._done()
        prefix = {"message": "msg_", "function_call": "fc_", "reasoning": "rs_"}[kind]
        self._open = {"type": kind, "id": _id(prefix), "index": len(self._output), "text": "", **fields}
        out.append(self._event("response.output_item.added", output_index=self._open["index"],
                               item=self._item_of(self._open, "in_progress")))
        if kind == "message":
            out.append(self._event("response.content_part.added", item_id=self._open["id"],
                                   output_index=self._open["index"], content_index=0,
                                   part={"type": "output_text", "text": "", "annotations": []}))
        return out

    def _item_of(self, item: dict[str, Any], status: str) -> dict[str, Any]:
        if item["type"] == "message":
            return message_item(item["id"], item["text"], status)
        if item["type"] == "function_call":
            return call_item(item["id"], ToolCall(item["call_id"], item["name"], item["text"]), status,
                             self._spaces.get(item["name"]))
        return reasoning_item(item["id"], item["text"])

    def _done(self) -> list[str]:
        """Close the open item with its ``.done`` events."""
        item, self._open = self._open, None
        if item is None:
            return []
        where = {"item_id": item["id"], "output_index": item["index"]}
        out = []
        if item["type"] == "message":
            part = {"type": "output_text", "text": item["text"], "annotations": []}
            out += [self._event("response.output_text.done", **where, content_index=0, text=item["text"],
                                logprobs=[]),
                    self._event("response.content_part.done", **where, content_index=0, part=part)]
        elif item["type"] == "function_call":
            out.append(self._event("response.function_call_arguments.done", **where, name=item["name"],
                                   arguments=item["text"]))
        else:
            out.append(self._event("response.reasoning_text.done", **where, content_index=0, text=item["text"]))
        done = self._item_of(item, "completed")
        self._output.append(done)
        return out + [self._event("response.output_item.done", output_index=item["index"], item=done)]

    def _event(self, kind: str, **data: Any) -> str:
        body = {"type": kind, "sequence_number": self._seq, **data}
        self._seq += 1
        return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"


def _status(r: Result) -> str:
    return "incomplete" if r.finish_reason == "length" else "completed"
