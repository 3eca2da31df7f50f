"""``localspec serve``: an OpenAI-compatible HTTP API over one loaded pair.

Endpoints: ``GET /health``, ``GET /v1/models`` (and ``/v1/models/{name}``), ``POST /v1/chat/completions``
and ``POST /v1/completions``, streamed as server-sent events in OpenAI's chunk
format (ending with ``data: [DONE]``) or not. Every request runs through
``Pair.stream`` with speculative decoding (auto mode by default), so the output
is the target model's own. Responses carry OpenAI's ``usage``, llama-server's
``timings`` (``prompt_n``, ``prompt_ms``, ``predicted_n``, ``predicted_ms``,
``predicted_per_second``, ``draft_n``, ``draft_n_accepted``) and localspec's
own ``localspec`` stats.

Both models of a pair share one cache, so generations run one at a time on a
single worker thread; further requests wait in a bounded queue and get 503
with ``Retry-After`` once it is full. A client that goes away, streaming or
not, cancels its generation at the next token, or leaves the queue if it was
still waiting; SIGTERM and Ctrl-C cancel every generation and end the process
(``run``). Closing a stream leaves both caches consistent, so the next request
is exact. A growing conversation reuses the cached prefix and only processes
its new tokens.

Requests are checked at two depths: the HTTP boundary (Host, Origin, API key,
content type, body size) in ``server_http``, the JSON body in
``server_requests``; the replies' OpenAI shapes are built in ``server_replies``.

Needs the ``server`` extra (FastAPI, uvicorn); the rest of localspec does not.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Optional, Sequence

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware

from ..api import Pair
from ..errors import (
    ConfigError,
    ContextOverflowError,
    LocalspecError,
    NotInstalledError,
    SamplingError,
    TokenIdError,
    ToolsUnsupportedError,
)
from ..methods import REGISTRY
from ..options import GenerationOptions
from ..results import Stream
from ..structured.call_reader import call_reader
from . import agent_routes as server_apis
from . import metrics as server_metrics
from .access import LOOPBACK_NAMES
from .http import ApiError, Guard
from .ollama import routes as ollama
from .openai import logprobs as server_logprobs
from .openai import replies
from .openai.requests import ChatRequest, Limits, parse_body, parse_request

#: The largest request body by default, in bytes (a full 32k-token context of text is about 130 kB).
MAX_BODY = 4 * 1024 * 1024


def _library_error(exc: LocalspecError, chat: bool) -> ApiError:
    if isinstance(exc, ContextOverflowError):
        return ApiError(400, str(exc), code="context_length_exceeded", param="messages" if chat else "prompt")
    if isinstance(exc, TokenIdError):
        return ApiError(400, str(exc), code="invalid_token_id",
                        param="logit_bias" if str(exc).startswith("logit_bias") else "prompt")
    if isinstance(exc, ToolsUnsupportedError):  # the model cannot take the request's tools
        return ApiError(400, str(exc), param="tools", code="unsupported_parameter")
    if isinstance(exc, (ConfigError, SamplingError)):
        return ApiError(400, str(exc), code="invalid_value")
    if isinstance(exc, NotInstalledError):  # the server lacks a part, not the request
        return ApiError(501, str(exc), type="server_error", code="not_installed")
    return ApiError(500, str(exc), type="server_error")


#: Work on the pair other than a generation, run on the worker for an admitted request (counting its tokens).
Task = Callable[[Pair, ChatRequest], Any]


@dataclass(eq=False)  # compared (and hashed) by identity: the server keeps a set of them
class Job:
    """One admitted request: its stream's events come back through ``events`` (a task's: its value, or an
    error)."""

    request: ChatRequest
    loop: asyncio.AbstractEventLoop
    task: Optional[Task] = None  # run instead of a generation; "done" carries what it returns
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    future: Optional[concurrent.futures.Future] = None  # its place on the worker, while it waits or runs
    stream: Optional[Stream] = None  # once the worker has started it
    checked: float = field(default_factory=time.monotonic)  # when the client was last seen connected

    def put(self, kind: str, value: Any) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


class Server:
    """The pair, the single generation worker, and the admitted jobs.

    Args:
        pair: the loaded models (used from the worker thread only).
        name: the model name clients use.
        defaults: options for what a request leaves out.
        max_queue: requests that may wait while one generates; more get 503.
        max_tokens: the most tokens one request may generate (larger requests are capped); None: the context.
        history: False keeps every request out of the history store, whatever it asks.
        keep_billing_header: keep Claude Code's billing-header block in Messages requests (see ``Limits``).
    """

    def __init__(self, pair: Pair, name: str, defaults: GenerationOptions, *, max_queue: int = 8,
                 max_tokens: Optional[int] = None, history: bool = True, keep_billing_header: bool = False):
        self.pair = pair
        self.defaults = defaults
        self.limits = Limits((name,), max_tokens, history, keep_billing_header)
        self.max_queue = max_queue
        self.worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="localspec-generate")
        self.jobs: set[Job] = set()  # running + waiting; only touched on the event loop's thread
        #: Generations by outcome; "refused": the request was at fault (a 4xx found on the worker), "failed": 5xx.
        self.counts = {"completed": 0, "cancelled": 0, "refused": 0, "failed": 0}
        self.totals = server_metrics.Totals()  # tokens and requests, for /metrics
        self.created = int(time.time())
        self.stopping = False

    @classmethod
    def for_pair(cls, pair: Pair, name: str, defaults: GenerationOptions, *, max_queue: int = 8,
                 max_tokens: Optional[int] = None, keep_billing_header: bool = False) -> Server:
        """A server for ``pair`` as ``localspec serve`` runs one, ready for its first request.

        ``defaults.history`` off is absolute: no request can turn it back on. Without ``max_tokens`` a
        request may fill the context. An adaptive default method measures the machine now rather than in
        the first request.
        """
        if not defaults.history:
            pair.set_history(False)
        if max_tokens is None:
            defaults = defaults.replace(max_tokens=pair.target.n_ctx)
        server = cls(pair, name, defaults, max_queue=max_queue, max_tokens=max_tokens,
                     history=pair.history is not None, keep_billing_header=keep_billing_header)
        if REGISTRY.get(defaults.method).adaptive:
            # On the worker thread that will generate: llama.cpp's OpenMP threads belong to the thread that
            # calls it, and a second team left over from another thread slowed every later batch by a fifth.
            server.worker.submit(pair.calibrate).result()
        return server

    @property
    def name(self) -> str:
        return self.limits.models[0]

    def occupancy(self) -> tuple[int, int]:
        """(running, waiting): the generation on the worker (0 or 1) and the requests queued behind it."""
        return min(len(self.jobs), 1), max(0, len(self.jobs) - 1)

    def admit(self, request: ChatRequest, task: Optional[Task] = None) -> Job:
        """Queue a generation on the worker, or ``task`` (which uses the pair too), behind the same limit
        (called on the event loop's thread).

        Raises:
            ApiError: 503 when the server is stopping or the queue is full.
        """
        if self.stopping:
            raise ApiError(503, "The server is shutting down.", type="server_error", code="server_stopping")
        if len(self.jobs) > self.max_queue:
            raise ApiError(503, f"The server is busy: one generation is running and {self.max_queue} are "
                           "waiting; try again shortly.", type="server_error", code="server_busy",
                           headers={"Retry-After": "5"})
        job = Job(request, asyncio.get_running_loop(), task)
        self.jobs.add(job)
        job.future = self.worker.submit(self.generate, job)
        return job

    def abandon(self, job: Job) -> None:
        """Its client left: stop the generation at once, or drop it from the queue now."""
        job.cancelled.set()
        if job.stream is not None:
            job.stream.cancel()  # a prompt being processed stops within milliseconds
        elif self._unqueue(job):
            self._count(job, "cancelled")

    def _unqueue(self, job: Job) -> bool:
        """Take a job that has not started off the worker's queue; False if it started (or was taken)."""
        assert job.future is not None
        if job.future.cancelled() or not job.future.cancel():
            return False
        self.jobs.discard(job)
        return True

    def stop(self) -> None:
        """Refuse new requests, and cancel every admitted one with a 503 at once (the process is exiting)."""
        self.stopping = True
        stopping = ApiError(503, "The server is shutting down; the generation was stopped.", type="server_error",
                            code="server_stopping")
        for job in list(self.jobs):
            job.cancelled.set()
            if job.stream is not None:
                job.stream.cancel()
            if self._unqueue(job):
                self._count(job, "cancelled")
            job.events.put_nowait(("error", stopping))  # its client hears now, not after the worker

    def _count(self, job: Job, outcome: str) -> None:
        """Count a generation's outcome (a task is not a generation)."""
        if job.task is None:
            self.counts[outcome] += 1

    def generate(self, job: Job) -> None:
        """Run one job on the worker thread, sending events back to the loop."""
        try:
            if job.task is not None:
                self._run_task(job)
            else:
                self._generate(job)
        finally:
            job.loop.call_soon_threadsafe(self.jobs.discard, job)  # admission ends when the worker is done

    def _cancelled(self, job: Job) -> None:
        self._count(job, "cancelled")
        job.put("done", None)

    def _run_task(self, job: Job) -> None:
        assert job.task is not None
        if job.cancelled.is_set():  # its client left, or the server is stopping, while it waited
            job.put("done", None)
            return
        try:
            value = job.task(self.pair, job.request)
        except ApiError as exc:
            job.put("error", exc)
        except LocalspecError as exc:
            job.put("error", _library_error(exc, job.request.chat))
        except Exception as exc:  # a bug: answer 500 and keep serving
            job.put("error", ApiError(500, f"The request failed: {exc!r}.", type="server_error"))
        else:
            job.put("done", value)

    def _generate(self, job: Job) -> None:
        if job.cancelled.is_set():  # its client left, or the server is stopping, while it waited
            self._cancelled(job)
            return
        stream: Optional[Stream] = None
        req = job.request
        sent = thought = 0  # characters of the answer and of the reasoning sent so far
        try:
            if req.chat:
                assert req.messages is not None
                stream = self.pair.stream_chat(req.messages, req.options, tools=req.tools,
                                               template_vars=req.template_vars)
            elif req.suffix is not None:
                assert isinstance(req.prompt, str)
                stream = self.pair.stream_infill(req.prompt, req.suffix, req.options)
            else:
                assert req.prompt is not None
                stream = self.pair.stream(req.prompt, req.options)
            job.stream = stream
            if job.cancelled.is_set():  # its client left while the stream was being set up
                stream.cancel()
            for ev in stream:
                if job.cancelled.is_set():
                    break  # leaving the loop closes the stream: both caches stay consistent
                if ev.logprob is not None:  # before its text, so a chunk carries the tokens that made it
                    job.put("logprobs", server_logprobs.entry(ev, self.pair.target.token_bytes))
                if ev.reasoning:
                    job.put("reasoning", ev.reasoning)
                    thought += len(ev.reasoning)
                if ev.text:
                    job.put("text", ev.text)
                    sent += len(ev.text)
        except LocalspecError as exc:
            error = _library_error(exc, req.chat)
            self.counts["failed" if error.status >= 500 else "refused"] += 1
            job.put("error", error)
            return
        except Exception as exc:  # a bug: answer 500 and keep serving
            self.counts["failed"] += 1
            job.put("error", ApiError(500, f"Generation failed: {exc!r}.", type="server_error"))
            return
        if job.cancelled.is_set():
            self._cancelled(job)
            return
        assert stream is not None
        result = stream.result
        if result.reasoning is not None and len(result.reasoning) > thought:
            job.put("reasoning", result.reasoning[thought:])  # held back until the end (a marker's start)
        if len(result.text) > sent:
            job.put("text", result.text[sent:])  # held back until the end (an incomplete character)
        self.counts["completed"] += 1
        self.totals.generated(result.stats)
        job.put("done", result)


def _openai_model(name: str, created: int) -> dict[str, Any]:
    """A model as OpenAI's API describes one."""
    return {"id": name, "object": "model", "created": created, "owned_by": "localspec"}


def create_app(server: Server, *, hosts: Sequence[str] = LOOPBACK_NAMES, origins: Sequence[str] = (),
               api_key: Optional[str] = None, max_body: int = MAX_BODY, metrics: bool = False) -> FastAPI:
    """The FastAPI application serving ``server``'s pair.

    Args:
        server: the pair and its worker.
        hosts: the Host names accepted (loopback names for a loopback bind; empty: any).
        origins: the web page origins allowed to call the API (``"*"``: any), with CORS headers for them.
        api_key: if set, every request but ``/health`` needs ``Authorization: Bearer KEY``.
        max_body: the largest request body in bytes.
        metrics: serve ``GET /metrics`` (Prometheus' text format; behind the API key like the rest).
    """
    app = FastAPI(title="localspec", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
        return ApiError(exc.status_code, f"{request.method} {request.scope['path']}: {exc.detail}.",
                        type=kind).response()

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> dict[str, Any]:
        running, queued = server.occupancy()
        return {"status": "stopping" if server.stopping else "ok", "model": server.name,
                "running": running, "queued": queued, "generations": dict(server.counts)}

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        names = server.limits.models
        if server_apis.from_anthropic(request):  # Anthropic's SDK lists models in its own shape
            return {"data": [server_apis.anthropic_model(n, server.created) for n in names], "has_more": False,
                    "first_id": names[0] if names else None, "last_id": names[-1] if names else None}
        return {"object": "list", "data": [_openai_model(n, server.created) for n in names]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str, request: Request) -> Any:
        if not name:  # /v1/models/ is the list
            return await models(request)
        if not server.limits.serves(name):
            # in Anthropic's shape to its SDK (AnthropicHeaders)
            return ApiError(404, f"The model {name!r} does not exist; this server has "
                                 f"{', '.join(server.limits.models)}.", param="model",
                            code="model_not_found").response()
        if server_apis.from_anthropic(request):
            return server_apis.anthropic_model(name, server.created)
        return _openai_model(name, server.created)

    async def complete(request: Request, chat: bool) -> Any:
        try:
            body = await request.body()
            # Parsing a large body takes a while: off the event loop, so other clients are not kept waiting.
            req = await asyncio.to_thread(lambda: parse_request(parse_body(body), chat, server.defaults,
                                                                server.limits))
            job = server.admit(req)
        except ApiError as exc:
            return exc.response()
        return await (_stream(server, job, request) if req.stream else _whole(server, job, request))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await complete(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await complete(request, chat=False)

    if origins:  # CORS headers (and preflight answers) for the allowed pages only
        # Any request header: the SDKs' own (x-api-key, anthropic-version, x-stainless-*) change between releases,
        # and only pages the operator named get this far.
        app.add_middleware(CORSMiddleware, allow_origins=list(origins), allow_methods=["GET", "POST"],
                           allow_headers=["*"])
    app.add_middleware(Guard, hosts=hosts, origins=origins, api_key=api_key, max_body=max_body)
    ollama.register(app, server, _next_event)  # Ollama's API, for the apps that speak only it
    server_apis.register(app, server, _next_event)  # Anthropic Messages and OpenAI Responses, behind the guards
    if metrics:
        registry = server_metrics.registry(server.totals, lambda: dict(server.counts), server.occupancy)

        @app.get("/metrics")
        async def scrape() -> Response:
            return Response(server_metrics.render(registry), media_type=server_metrics.CONTENT_TYPE)

        routes = frozenset(getattr(route, "path", "") for route in app.routes)
        # Outermost, so the guards' refusals are counted too.
        app.add_middleware(server_metrics.CountRequests, totals=server.totals, routes=routes)
    return app


async def _next_event(server: Server, job: Job, request: Request) -> tuple[str, Any]:
    """The job's next event; a client that went away abandons the job (checked every quarter second)."""
    while True:
        if not job.cancelled.is_set() and time.monotonic() - job.checked >= 0.25:
            job.checked = time.monotonic()
            if await request.is_disconnected():
                server.abandon(job)
                if job not in server.jobs:  # it never started: nothing more will come
                    return "done", None
        try:
            return await asyncio.wait_for(job.events.get(), timeout=0.25)
        except asyncio.TimeoutError:
            continue


async def _whole(server: Server, job: Job, request: Request) -> Any:
    """Answer once the generation is done."""
    text: list[str] = []
    entries: list[dict[str, Any]] = []
    try:
        while True:
            kind, value = await _next_event(server, job, request)
            if kind == "text":
                text.append(value)
            elif kind == "logprobs":
                entries.append(value)
            elif kind == "reasoning":
                continue  # the result has it whole
            elif kind == "error":
                return value.response()
            else:
                break
    except BaseException:  # the handler was cancelled
        server.abandon(job)
        raise
    if value is None:  # cancelled: nobody is listening
        return JSONResponse({}, status_code=499)
    return replies.whole(server.name, job.request, value, "".join(text), entries)


async def _stream(server: Server, job: Job, request: Request) -> Any:
    """Server-sent events; errors before the first token are answered as plain errors."""
    try:
        first = await _next_event(server, job, request)  # prefill happens before it: a too-long prompt fails here
    except BaseException:
        server.abandon(job)
        raise
    if first[0] == "error":
        return first[1].response()
    chunks = replies.Chunks(server.name, job.request)
    reader = call_reader(job.request.tools)

    async def events() -> AsyncIterator[str]:
        try:
            for piece in chunks.start():
                yield piece
            kind, value = first
            while True:
                if kind == "logprobs":
                    chunks.add_logprobs(value)
                elif kind == "reasoning":
                    yield chunks.reasoning(value)
                elif kind == "text":
                    for piece in chunks.calls(reader.feed(value)) if reader else (chunks.text(value),):
                        yield piece
                elif kind == "error":  # failed after streaming began: say so in the stream
                    yield replies.sse({"error": {"message": value.message, "type": value.type, "code": value.code}})
                    break
                else:
                    if value is not None:
                        for piece in chunks.calls(reader.close()) if reader else ():
                            yield piece
                        for piece in chunks.end(value, job.request.include_usage):
                            yield piece
                    yield "data: [DONE]\n\n"
                    break
                kind, value = await _next_event(server, job, request)
        finally:
            server.abandon(job)  # the client went away (or we are done): stop generating

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


class _Uvicorn(uvicorn.Server):
    """uvicorn, with SIGTERM and Ctrl-C cancelling the generations it would otherwise wait for."""

    def __init__(self, config: uvicorn.Config, server: Server):
        super().__init__(config)
        self.localspec = server
        self.loop: Optional[asyncio.AbstractEventLoop] = None

    async def startup(self, sockets: Any = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.loop is not None:  # a signal handler: the jobs are the loop's to touch
            self.loop.call_soon_threadsafe(self.localspec.stop)
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: Any = None) -> None:
        await super().shutdown(sockets)
        # The worker finishes its cancelled generation (and records it) before the process goes.
        stop = functools.partial(self.localspec.worker.shutdown, wait=True, cancel_futures=True)
        await asyncio.get_running_loop().run_in_executor(None, stop)


def run(server: Server, app: FastAPI, host: str, port: int) -> None:
    """Serve ``app`` until SIGTERM or Ctrl-C, which cancel the generations and end the process within seconds."""
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=3)
    _Uvicorn(config, server).run()
