"""OpenAI's chat completions and completions out: a whole completion, the chunks of a streamed one, usage
and timings.

Built from a checked request (``GenerationRequest``) and what its generation gave; the relay
(``server.relay``) hands ``CompletionReply`` the generation's events and sends what it writes.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Optional

from ...methods import PREDICTION
from ...results import Result
from ...structured.call_reader import CallEvent
from ..generation import GenerationRequest
from ..http import ApiError
from . import logprobs as server_logprobs


def reply_id(request: GenerationRequest) -> str:
    """A new id for the reply, prefixed as OpenAI prefixes it."""
    return ("chatcmpl-" if request.chat else "cmpl-") + uuid.uuid4().hex[:24]


def sse(obj: Any) -> str:
    """One server-sent event carrying ``obj`` as JSON."""
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def envelope(model: str, request: GenerationRequest, rid: str, chunk: bool) -> dict[str, Any]:
    """The fields every reply object starts with."""
    kind = "chat.completion" if request.chat else "text_completion"
    return {"id": rid, "object": kind + (".chunk" if chunk and request.chat else ""), "created": int(time.time()),
            "model": model}


def stats(r: Result) -> dict[str, Any]:
    """llama-server's timings and localspec's speculation stats."""
    s = r.stats
    processed = s.prompt_tokens - s.cached_prompt_tokens  # the rest came from the cache
    timings = {
        "prompt_n": processed, "cache_n": s.cached_prompt_tokens, "prompt_ms": 1000 * s.prefill_seconds,
        "prompt_per_second": processed / s.prefill_seconds if s.prefill_seconds else 0.0,
        "predicted_n": s.generated_tokens, "predicted_ms": 1000 * s.decode_seconds,
        "predicted_per_second": s.generated_tokens / s.decode_seconds if s.decode_seconds else 0.0,
        "draft_n": s.drafted, "draft_n_accepted": s.accepted,
    }
    ours = {"method": s.method, "k": s.k, "rounds": s.rounds, "restored_prompt_tokens": s.restored_prompt_tokens,
            "rounds_per_method": {m: n for m, n in s.rounds_by_method.items() if n}, "drafted": s.drafted,
            "accepted": s.accepted, "acceptance_rate": s.acceptance_rate, "tokens_per_round": s.tokens_per_round,
            "drafted_by": s.drafted_by, "accepted_by": s.accepted_by, "batch_width": s.batch_width}
    return {"timings": timings, "localspec": ours}


def usage(request: GenerationRequest, r: Result) -> dict[str, Any]:
    """OpenAI's usage; with a prediction, how many of its tokens were accepted and rejected, as OpenAI counts."""
    n = len(r.tokens)
    out: dict[str, Any] = {"prompt_tokens": len(r.prompt_tokens), "completion_tokens": n,
                           "total_tokens": len(r.prompt_tokens) + n,
                           "prompt_tokens_details": {"cached_tokens": r.stats.cached_prompt_tokens}}
    details: dict[str, int] = {}
    if r.reasoning is not None:
        details["reasoning_tokens"] = r.reasoning_tokens
    if request.options.prediction is not None:
        accepted = r.stats.accepted_by.get(PREDICTION.name, 0)
        details["accepted_prediction_tokens"] = accepted
        details["rejected_prediction_tokens"] = r.stats.drafted_by.get(PREDICTION.name, 0) - accepted
    if details:
        out["completion_tokens_details"] = details
    return out


def logprobs(request: GenerationRequest, entries: list[dict[str, Any]], offset: int = 0) -> Optional[dict[str, Any]]:
    """A choice's ``logprobs`` in the request's shape; None when it did not ask for them."""
    if request.options.logprobs is None:
        return None
    if request.chat:
        return server_logprobs.chat(list(entries))
    prompt = request.prompt
    return server_logprobs.completion(entries, offset + (len(prompt) if isinstance(prompt, str) else 0))


def whole(model: str, request: GenerationRequest, r: Result, text: str,
          entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The reply to a request that did not ask to stream: ``text`` as generated, the token ``entries``'
    log-probabilities."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": r.finish_reason, "logprobs": logprobs(request, entries)}
    if request.chat:
        choice["message"] = {"role": "assistant", "content": text}
        if r.reasoning is not None:  # a reasoning model's thinking, as llama-server and vLLM give it
            choice["message"]["reasoning_content"] = r.reasoning
        if r.tool_calls:  # the text was the calls and what came around them
            choice["message"].update(content=r.content, tool_calls=[c.to_openai() for c in r.tool_calls])
    else:
        choice["text"] = text
        if r.reasoning is not None:  # a completion has no message: its choice carries the reasoning
            choice["reasoning_content"] = r.reasoning
    return {**envelope(model, request, reply_id(request), False), "choices": [choice], "usage": usage(request, r),
            **stats(r)}


class CompletionReply:
    """The reply to one chat completions or completions request (``server.relay.Reply``): whole, or its chunks
    in order (the role, text or calls as they come, the end, the usage, ``[DONE]``).

    Token log-probabilities are handed in (``logprobs``) before the text they belong to; each chunk carries
    those not sent yet, and a whole reply all of them.
    """

    media_type = "text/event-stream"

    def __init__(self, model: str, request: GenerationRequest):
        self.model, self.request = model, request
        self.rid = reply_id(request)
        self._entries: list[dict[str, Any]] = []  # the tokens of the text not yet sent
        self._offset = 0  # where the next token's text starts (a completion's text_offset, counted as unstreamed)

    def logprobs(self, entry: dict[str, Any]) -> None:
        self._entries.append(entry)

    def whole(self, r: Result) -> dict[str, Any]:
        return whole(self.model, self.request, r, r.text, self._entries)

    def start(self, prompt_tokens: int, cached_tokens: int) -> list[str]:
        """A chat stream's first chunk: the assistant's role."""
        return [sse(self._chunk("", role=True))] if self.request.chat else []

    def ping(self) -> list[str]:
        return [": keep-alive\n\n"]  # an SSE comment: clients skip it

    def reasoning(self, text: str) -> list[str]:
        """A chunk of a reasoning model's thinking (chat: ``delta.reasoning_content``; a completion's choice:
        ``reasoning_content``)."""
        return [sse(self._chunk(None, reasoning=text))]

    def content(self, found: list[CallEvent]) -> list[str]:
        """The chunks for what the call reader found: content, a call's start, more of its arguments."""
        out = []
        for e in found:
            if e.kind == "content":
                out.append(sse(self._chunk(e.text)))
            elif e.kind == "call":
                out.append(sse(self._chunk(None, call={"index": e.index, "id": e.id, "type": "function",
                                                       "function": {"name": e.text, "arguments": ""}})))
            else:
                out.append(sse(self._chunk(None, call={"index": e.index, "function": {"arguments": e.text}})))
        return out

    def end(self, r: Result, tail: list[CallEvent]) -> list[str]:
        """The held-back calls, the final chunk (finish reason, timings), the usage chunk if the request asked
        for it, and ``[DONE]``."""
        out = self.content(tail)
        final = {**self._chunk(None, r.finish_reason), **stats(r)}
        if self.request.chat:
            final["choices"][0]["delta"] = {}
        out.append(sse(final))
        if self.request.include_usage:
            out.append(sse({**envelope(self.model, self.request, self.rid, True), "choices": [],
                            "usage": usage(self.request, r), **stats(r)}))
        return out + ["data: [DONE]\n\n"]

    def error(self, error: ApiError) -> list[str]:
        return [sse({"error": {"message": error.message, "type": error.type, "code": error.code}})]

    def _chunk(self, text: Optional[str], finish: Optional[str] = None, role: bool = False,
               call: Optional[dict[str, Any]] = None, reasoning: Optional[str] = None) -> dict[str, Any]:
        request = self.request
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish,
                                  "logprobs": logprobs(request, self._entries, self._offset) if not role else None}
        self._offset += sum(len(e["token"]) for e in self._entries)
        self._entries.clear()
        if request.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            if call is not None:
                delta["tool_calls"] = [call]
            if reasoning is not None:
                delta["reasoning_content"] = reasoning
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
            if reasoning is not None:
                choice["reasoning_content"] = reasoning
        return {**envelope(self.model, request, self.rid, True), "choices": [choice]}
