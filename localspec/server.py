"""``localspec serve``: an OpenAI-compatible HTTP API over one loaded pair.

Endpoints: ``GET /health``, ``GET /v1/models``, ``POST /v1/chat/completions``
and ``POST /v1/completions``, streamed as server-sent events in OpenAI's chunk
format (ending with ``data: [DONE]``) or not. Every request runs through
``Pair.stream`` with speculative decoding (auto mode by default), so the output
is the target model's own. Responses carry OpenAI's ``usage``, llama-server's
``timings`` (``prompt_n``, ``prompt_ms``, ``predicted_n``, ``predicted_ms``,
``predicted_per_second``, ``draft_n``, ``draft_n_accepted``) and localspec's
own ``localspec`` stats.

Both models of a pair share one cache, so generations run one at a time on a
single worker thread; further requests wait in a bounded queue and get 503
with ``Retry-After`` once it is full. A client that goes away mid-stream
cancels its generation at the next token; closing the stream leaves both
caches consistent, so the next request is exact. A growing conversation
reuses the cached prefix and only processes its new tokens.

Needs the ``server`` extra (FastAPI, uvicorn); the rest of localspec does not.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hmac
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Optional, Union

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .api import Pair, Result, Stream
from .errors import ConfigError, ContextOverflowError, LocalspecError, SamplingError
from .options import GenerationOptions

#: Request fields that would change the output and that localspec does not implement, with the
#: values that mean "not used": a request giving anything else gets a 400, never a silent ignore.
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "n": (1,), "best_of": (1,), "logprobs": (False,), "top_logprobs": (0,), "echo": (False,), "suffix": ("",),
    "tools": ([],), "tool_choice": ("none", "auto"), "functions": ([],), "function_call": ("none", "auto"),
    "logit_bias": ({},), "presence_penalty": (0,), "frequency_penalty": (0,), "repeat_penalty": (1,),
    "typical_p": (1,), "mirostat": (0,), "grammar": ("",), "json_schema": ({},), "audio": ({},),
    "modalities": (["text"],), "prediction": ({},),
}
#: OpenAI's and localspec's option names -> GenerationOptions fields.
OPTION_FIELDS = {"max_tokens": "max_tokens", "max_completion_tokens": "max_tokens", "temperature": "temperature",
                 "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "seed": "seed", "stop": "stop",
                 "method": "method", "k": "k", "history": "history"}


class ApiError(Exception):
    """An error answered as OpenAI's error object."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: Optional[str] = None, code: Optional[str] = None, headers: Optional[dict[str, str]] = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def _library_error(exc: LocalspecError) -> ApiError:
    if isinstance(exc, ContextOverflowError):
        return ApiError(400, str(exc), code="context_length_exceeded", param="messages")
    if isinstance(exc, (ConfigError, SamplingError)):
        return ApiError(400, str(exc), code="invalid_value")
    return ApiError(500, str(exc), type="server_error")


@dataclass
class ChatRequest:
    """A parsed request: what to continue, with which options, and how to answer."""

    chat: bool
    messages: Optional[list[dict[str, str]]]
    prompt: Union[str, list[int], None]
    options: GenerationOptions
    stream: bool
    include_usage: bool


def parse_request(body: Any, chat: bool, defaults: GenerationOptions, models: tuple[str, ...]) -> ChatRequest:
    """Check a request body and turn it into options (raises ApiError with OpenAI's codes)."""
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    model = body.get("model")
    if model is not None and model not in models:
        raise ApiError(404, f"The model {model!r} does not exist; this server has {', '.join(models)}.",
                       param="model", code="model_not_found")
    for name, neutral in UNSUPPORTED.items():
        value = body.get(name)
        if value is not None and value not in neutral:
            raise ApiError(400, f"localspec does not support {name!r} (got {value!r}); leave it out.",
                           param=name, code="unsupported_parameter")
    fmt = body.get("response_format")
    if fmt not in (None, {"type": "text"}):
        raise ApiError(400, f"localspec only produces plain text; response_format {fmt!r} is not supported.",
                       param="response_format", code="unsupported_parameter")
    given: dict[str, Any] = {}
    speculative = body.get("speculative") or {}
    if not isinstance(speculative, dict):
        raise ApiError(400, "'speculative' must be an object such as {\"method\": \"auto\", \"k\": 8}.",
                       param="speculative")
    for source in (body, speculative):
        for name, target in OPTION_FIELDS.items():
            if source.get(name) is not None:
                given[target] = source[name]
    try:
        options = defaults.replace(**given)
    except LocalspecError as exc:
        param = next((n for n in OPTION_FIELDS if re.search(rf"\b{n}\b", str(exc))), None)
        raise ApiError(400, str(exc), param=param, code="invalid_value") from None
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be true or false.", param="stream")
    include_usage = bool((body.get("stream_options") or {}).get("include_usage", False))
    if chat:
        return ChatRequest(True, _messages(body.get("messages")), None, options, stream, include_usage)
    return ChatRequest(False, None, _prompt(body.get("prompt")), options, stream, include_usage)


def _messages(value: Any) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise ApiError(400, "'messages' must be a non-empty list of {role, content} objects.", param="messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{i}] needs a 'role' string.", param="messages")
        content = m.get("content")
        if isinstance(content, list):  # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise ApiError(400, f"messages[{i}] has a non-text content part; localspec models read text only.",
                               param="messages")
            content = "".join(str(p.get("text", "")) for p in content)
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content must be a string.", param="messages")
        out.append({"role": m["role"], "content": content})
    return out


def _prompt(value: Any) -> Union[str, list[int]]:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]  # one prompt in a list
    if isinstance(value, str) and value:
        return value
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return value
    raise ApiError(400, "'prompt' must be one non-empty string (or one list of token ids).", param="prompt")


def _stats(r: Result) -> dict[str, Any]:
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
    rounds = s.auto["rounds"] if s.auto else {s.method: s.rounds}
    ours = {"method": "auto" if s.auto else s.method, "k": s.k, "rounds": s.rounds,
            "rounds_per_method": {m: n for m, n in rounds.items() if n}, "drafted": s.drafted,
            "accepted": s.accepted, "acceptance_rate": s.acceptance_rate, "tokens_per_round": s.tokens_per_round,
            "drafted_by": s.drafted_by, "accepted_by": s.accepted_by}
    return {"timings": timings, "localspec": ours}


def _usage(r: Result) -> dict[str, int]:
    n = len(r.tokens)
    return {"prompt_tokens": len(r.prompt_tokens), "completion_tokens": n, "total_tokens": len(r.prompt_tokens) + n}


@dataclass
class Job:
    """One admitted request: its stream's events come back through ``events``."""

    request: ChatRequest
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    checked: float = field(default_factory=time.monotonic)  # when the client was last seen connected

    def put(self, kind: str, value: Any) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


class Server:
    """The pair, the single generation worker, and the admission count.

    Args:
        pair: the loaded models (used from the worker thread only).
        name: the model name clients use.
        defaults: options for what a request leaves out.
        api_key: if set, every /v1 request needs ``Authorization: Bearer KEY``.
        max_queue: requests that may wait while one generates; more get 503.
    """

    def __init__(self, pair: Pair, name: str, defaults: GenerationOptions, api_key: Optional[str] = None,
                 max_queue: int = 8):
        self.pair = pair
        self.names = (name,)
        self.defaults = defaults
        self.api_key = api_key
        self.max_queue = max_queue
        self.worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="localspec-generate")
        self.admitted = 0  # running + waiting; only touched on the event loop's thread (see release)
        self.counts = {"completed": 0, "cancelled": 0, "failed": 0}
        self.created = int(time.time())

    def release(self) -> None:
        """A job left the worker (called on the event loop's thread)."""
        self.admitted -= 1

    def generate(self, job: Job) -> None:
        """Run one job on the worker thread, sending events back to the loop."""
        try:
            self._generate(job)
        finally:
            job.loop.call_soon_threadsafe(self.release)  # admission ends when the worker is done with it

    def _generate(self, job: Job) -> None:
        if job.cancelled.is_set():  # its client left while it waited
            self.counts["cancelled"] += 1
            job.put("done", None)
            return
        stream: Optional[Stream] = None
        req = job.request
        sent = 0  # characters sent so far
        try:
            if req.chat:
                assert req.messages is not None
                stream = self.pair.stream_chat(req.messages, req.options)
            else:
                assert req.prompt is not None
                stream = self.pair.stream(req.prompt, req.options)
            for ev in stream:
                if job.cancelled.is_set():
                    break  # leaving the loop closes the stream: both caches stay consistent
                if ev.text:
                    job.put("text", ev.text)
                    sent += len(ev.text)
        except LocalspecError as exc:
            self.counts["failed"] += 1
            job.put("error", _library_error(exc))
            return
        except Exception as exc:  # a bug: answer 500 and keep serving
            self.counts["failed"] += 1
            job.put("error", ApiError(500, f"Generation failed: {exc!r}.", type="server_error"))
            return
        if job.cancelled.is_set():
            self.counts["cancelled"] += 1
            job.put("done", None)
            return
        assert stream is not None
        result = stream.result
        if len(result.text) > sent:
            job.put("text", result.text[sent:])  # held back until the end (an incomplete character)
        self.counts["completed"] += 1
        job.put("done", result)


def create_app(server: Server) -> FastAPI:
    """The FastAPI application serving ``server``'s pair."""
    app = FastAPI(title="localspec", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
        return ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}.", type=kind).response()

    @app.middleware("http")
    async def authorize(request: Request, call_next: Any) -> Any:
        if server.api_key and request.url.path.startswith("/v1"):
            header = request.headers.get("authorization", "")
            token = header[7:] if header.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(token.encode(), server.api_key.encode()):
                return ApiError(401, "Missing or wrong API key: send 'Authorization: Bearer KEY' with the key "
                                "the server was started with.", code="invalid_api_key").response()
        return await call_next(request)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": server.names[0], "running": min(server.admitted, 1),
                "queued": max(0, server.admitted - 1), "generations": dict(server.counts)}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": n, "object": "model", "created": server.created,
                                            "owned_by": "localspec"} for n in server.names]}

    async def complete(request: Request, chat: bool) -> Any:
        try:
            try:
                body = json.loads(await request.body())
            except ValueError as exc:
                raise ApiError(400, f"The request body is not valid JSON ({exc}).") from None
            req = parse_request(body, chat, server.defaults, server.names)
            if server.admitted > server.max_queue:
                raise ApiError(503, f"The server is busy: one generation is running and {server.max_queue} are "
                               "waiting; try again shortly.", type="server_error", code="server_busy",
                               headers={"Retry-After": "5"})
        except ApiError as exc:
            return exc.response()
        server.admitted += 1
        job = Job(req, asyncio.get_running_loop())
        server.worker.submit(server.generate, job)
        return await (_stream(server, job, request) if req.stream else _whole(server, job, request))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await complete(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await complete(request, chat=False)

    return app


async def _next_event(job: Job, request: Request) -> tuple[str, Any]:
    """The job's next event; a client that went away cancels the job (checked twice a second)."""
    while True:
        if time.monotonic() - job.checked > 0.5:
            job.checked = time.monotonic()
            if await request.is_disconnected():
                job.cancelled.set()
        try:
            return await asyncio.wait_for(job.events.get(), timeout=0.5)
        except asyncio.TimeoutError:
            continue


def _envelope(server: Server, job: Job, rid: str, chunk: bool) -> dict[str, Any]:
    kind = "chat.completion" if job.request.chat else "text_completion"
    return {"id": rid, "object": kind + (".chunk" if chunk and job.request.chat else ""), "created": int(time.time()),
            "model": server.names[0]}


async def _whole(server: Server, job: Job, request: Request) -> Any:
    """Answer once the generation is done."""
    rid = ("chatcmpl-" if job.request.chat else "cmpl-") + uuid.uuid4().hex[:24]
    text: list[str] = []
    try:
        while True:
            kind, value = await _next_event(job, request)
            if kind == "text":
                text.append(value)
            elif kind == "error":
                return value.response()
            else:
                break
    except BaseException:  # the server is stopping, or the handler was cancelled
        job.cancelled.set()
        raise
    if value is None:  # cancelled: nobody is listening
        return JSONResponse({}, status_code=499)
    r: Result = value
    choice: dict[str, Any] = {"index": 0, "finish_reason": r.finish_reason, "logprobs": None}
    if job.request.chat:
        choice["message"] = {"role": "assistant", "content": "".join(text)}
    else:
        choice["text"] = "".join(text)
    return {**_envelope(server, job, rid, False), "choices": [choice], "usage": _usage(r), **_stats(r)}


async def _stream(server: Server, job: Job, request: Request) -> Any:
    """Server-sent events; errors before the first token are answered as plain errors."""
    rid = ("chatcmpl-" if job.request.chat else "cmpl-") + uuid.uuid4().hex[:24]
    try:
        first = await _next_event(job, request)  # prefill happens before it: a too-long prompt fails here
    except BaseException:
        job.cancelled.set()
        raise
    if first[0] == "error":
        return first[1].response()

    def chunk(text: Optional[str], finish: Optional[str] = None, role: bool = False) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if job.request.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        return {**_envelope(server, job, rid, True), "choices": [choice]}

    def sse(obj: Any) -> str:
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

    async def events() -> AsyncIterator[str]:
        try:
            if job.request.chat:
                yield sse(chunk("", role=True))
            kind, value = first
            while True:
                if kind == "text":
                    yield sse(chunk(value))
                elif kind == "error":  # failed after streaming began: say so in the stream
                    yield sse({"error": {"message": value.message, "type": value.type, "code": value.code}})
                    break
                else:
                    if value is not None:
                        r: Result = value
                        final = {**chunk(None, r.finish_reason), **_stats(r)}
                        if job.request.chat:
                            final["choices"][0]["delta"] = {}
                        yield sse(final)
                        if job.request.include_usage:
                            yield sse({**_envelope(server, job, rid, True), "choices": [], "usage": _usage(r),
                                       **_stats(r)})
                    yield "data: [DONE]\n\n"
                    break
                kind, value = await _next_event(job, request)
        finally:
            job.cancelled.set()  # the client went away (or we are done): stop generating

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
