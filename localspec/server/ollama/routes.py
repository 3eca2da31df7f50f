"""Ollama's API on ``localspec serve``, for the apps that speak only it.

``GET /`` ("Ollama is running"), ``GET /api/version``, ``GET /api/tags``, ``POST /api/show``,
``GET /api/ps``, ``POST /api/chat`` and ``POST /api/generate``, streamed as newline-delimited JSON unless
a request says ``"stream": false``. A request is translated into the library's one request type
(``server_ollama_requests``) and admitted to the server's one worker and queue, behind the same guards as
the OpenAI routes; its result is translated back here. Errors are Ollama's ``{"error": "..."}``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from ...api import Pair
from ...options import GenerationOptions
from ...reasoning.template import model_reasoning
from ...results import Result
from ...runtime.gguf_metadata import read_local
from ...structured.call_reader import CallReader, call_reader
from ...structured.tool_use import can_call
from ..http import ApiError, ASGIApp, Message, Receive, Scope, Send
from ..openai.replies import stats
from ..openai.requests import ChatRequest, Limits, parse_body
from . import requests


class Server(Protocol):
    """What these routes use of the server that registers them (``localspec.server.worker.Server``)."""

    @property
    def pair(self) -> Pair: ...

    @property
    def name(self) -> str: ...

    @property
    def limits(self) -> Limits: ...

    @property
    def defaults(self) -> GenerationOptions: ...

    def admit(self, request: ChatRequest) -> Any: ...

    def abandon(self, job: Any) -> None: ...


Job = Any  # the server's job of one request, handed back to its ``next_event``

#: The Ollama version reported: apps check it (VS Code's Ollama provider wants at least 0.6.4).
VERSION = "0.12.0"
#: The paths answered in Ollama's shapes.
PREFIX = "/api/"
#: Ollama's reasons for a finished reply, by the library's finish reasons.
DONE_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop"}

NextEvent = Callable[[Any, Any, Request], Awaitable[tuple[str, Any]]]  # the server's, for a server and job


@dataclass(frozen=True)
class ModelCard:
    """What Ollama's listing routes say of the served model, read once from its file and template."""

    name: str
    size: int
    modified_at: str
    digest: str
    details: dict[str, Any]
    model_info: dict[str, Any]
    capabilities: list[str]
    template: str
    n_ctx: int

    @classmethod
    def of(cls, server: Server) -> ModelCard:
        """The card of ``server``'s target model (read before the server answers its first request)."""
        target = server.pair.target
        header = read_local(target.path)
        stat = target.path.stat()
        arch = header.architecture or "unknown"
        details = {"parent_model": "", "format": "gguf", "family": arch, "families": [arch],
                   "parameter_size": header.size_label or "", "quantization_level": header.quantization or ""}
        info = {k: v for k, v in header.metadata.items()
                if isinstance(v, (str, int, float, bool)) and not k.startswith("tokenizer.")}
        info.setdefault("general.parameter_count", header.parameters or 0)
        template = target.chat_template() or ""
        # Not the file's own hash (that would read gigabytes at start): a name for this file as it is now.
        identity = f"{target.path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()
        return cls(requests.tagged(server.name), stat.st_size, _time(stat.st_mtime),
                   hashlib.sha256(identity).hexdigest(), details, info, _capabilities(server), template,
                   target.n_ctx)

    def listed(self) -> dict[str, Any]:
        """The model as ``/api/tags`` lists it."""
        return {"name": self.name, "model": self.name, "modified_at": self.modified_at, "size": self.size,
                "digest": self.digest, "details": self.details}


def _capabilities(server: Server) -> list[str]:
    """``completion``; ``tools`` where the template writes calls as localspec reads them; ``insert`` for a
    fill-in-the-middle model; ``thinking`` for a reasoning model."""
    target = server.pair.target
    found = ["completion"]
    if can_call(target):
        found.append("tools")
    if target.fim_tokens() is not None:
        found.append("insert")
    if model_reasoning(target) is not None:
        found.append("thinking")
    return found


def _time(seconds: Optional[float] = None) -> str:
    """An RFC 3339 time, as Ollama writes them."""
    moment = datetime.fromtimestamp(time.time() if seconds is None else seconds, timezone.utc)
    return moment.isoformat().replace("+00:00", "Z")


def error(exc: ApiError) -> JSONResponse:
    """An error as Ollama answers one: ``{"error": "..."}`` with its status."""
    return JSONResponse({"error": exc.message}, status_code=exc.status, headers=exc.headers)


def register(app: FastAPI, server: Server, next_event: NextEvent) -> None:
    """Add Ollama's routes to ``app``, serving through ``server``'s worker (``next_event``: the server's way to
    wait for a job's next event, abandoning the job when its client goes away), and ``OllamaErrors`` around
    the application (registered after the guards, it goes outside them)."""
    card = ModelCard.of(server)
    app.add_middleware(OllamaErrors)

    @app.api_route("/", methods=["GET", "HEAD"])
    async def root() -> PlainTextResponse:
        return PlainTextResponse("Ollama is running")

    @app.get("/api/version")
    async def version() -> dict[str, Any]:
        return {"version": VERSION}

    @app.get("/api/tags")
    async def tags() -> dict[str, Any]:
        return {"models": [card.listed()]}

    @app.get("/api/ps")
    async def ps() -> dict[str, Any]:
        return {"models": [{**card.listed(), "expires_at": "2318-01-01T00:00:00Z", "size_vram": 0,
                            "context_length": card.n_ctx}]}

    @app.post("/api/show")
    async def show(request: Request) -> Any:
        try:
            body = requests.parse(parse_body(await request.body()), requests.ShowBody)
            requests.model_name(body.model or body.name, server.limits)
        except ApiError as exc:
            return error(exc)
        return {"license": str(card.model_info.get("general.license", "")), "modelfile": "",
                "parameters": f"num_ctx {card.n_ctx}", "template": card.template, "details": card.details,
                "model_info": card.model_info, "capabilities": card.capabilities, "modified_at": card.modified_at}

    @app.post("/api/chat")
    async def chat(request: Request) -> Any:
        return await _answer(server, next_event, request, chat=True)

    @app.post("/api/generate")
    async def generate(request: Request) -> Any:
        return await _answer(server, next_event, request, chat=False)


class OllamaErrors:
    """ASGI middleware: a refusal on Ollama's paths (by the guards, or of a path that does not exist) comes
    back as Ollama's ``{"error": "..."}`` instead of OpenAI's error object."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(PREFIX):
            send = _Reshaped(send)
        await self.app(scope, receive, send)


class _Reshaped:
    """Passes a response on; an error's OpenAI body is rewritten as soon as it is whole (a refusal may hold
    its end back while the guards read the rest of the request)."""

    def __init__(self, send: Send):
        self.send = send
        self.start: Optional[Message] = None  # an error's start, held until its body is known
        self.body = b""

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] >= 400:
            self.start = message
            return
        if self.start is None or message["type"] != "http.response.body":
            await self.send(message)
            return
        self.body += message.get("body", b"")
        try:
            found = json.loads(self.body)
        except ValueError:
            if message.get("more_body", False):
                return  # not whole yet
            found = None
        if isinstance(found, dict) and isinstance(found.get("error"), dict):
            self.body = json.dumps({"error": str(found["error"].get("message", ""))}).encode()
        start, self.start = self.start, None
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        await self.send({**start, "headers": [*headers, (b"content-length", str(len(self.body)).encode())]})
        await self.send({**message, "body": self.body})


def _parse(raw: bytes, server: Server, chat: bool) -> Optional[ChatRequest]:
    body = requests.parse(parse_body(raw), requests.ChatBody if chat else requests.GenerateBody)
    make = requests.chat_request if chat else requests.generate_request
    return make(body, server.defaults, server.limits)


async def _answer(server: Server, next_event: NextEvent, request: Request, chat: bool) -> Any:
    """Check the body, admit the generation, and answer it whole or as it comes."""
    started = time.monotonic()
    try:
        raw = await request.body()
        req = await asyncio.to_thread(_parse, raw, server, chat)  # a large body: off the event loop
        if req is None:  # Ollama's way to load a model: nothing to generate
            return Reply(server.name, chat, started).loaded()
        job = server.admit(req)
    except ApiError as exc:
        return error(exc)
    reply = Reply(server.name, chat, started, call_reader(req.tools))
    return await (_stream(server, job, request, next_event, reply) if req.stream else
                  _whole(server, job, request, next_event, reply))


async def _whole(server: Server, job: Job, request: Request, next_event: NextEvent, reply: Reply) -> Any:
    try:
        while True:
            kind, value = await next_event(server, job, request)
            if kind == "error":
                return error(value)
            if kind == "done":
                break
    except BaseException:  # the handler was cancelled
        server.abandon(job)
        raise
    if value is None:  # cancelled: nobody is listening
        return JSONResponse({}, status_code=499)
    return reply.whole(value)


async def _stream(server: Server, job: Job, request: Request, next_event: NextEvent, reply: Reply) -> Any:
    """Newline-delimited JSON; an error before the first token is answered as a plain error."""
    try:
        first = await next_event(server, job, request)
    except BaseException:
        server.abandon(job)
        raise
    if first[0] == "error":
        return error(first[1])

    async def lines() -> AsyncIterator[str]:
        try:
            kind, value = first
            while kind != "done":
                if kind == "error":  # failed after streaming began: said in the stream, as Ollama does
                    yield _line({"error": value.message})
                    return
                for piece in reply.piece(kind, value):
                    yield piece
                kind, value = await next_event(server, job, request)
            if value is not None:
                for piece in reply.end(value):
                    yield piece
        finally:
            server.abandon(job)  # the client went away (or we are done): stop generating

    return StreamingResponse(lines(), media_type="application/x-ndjson", headers={"Cache-Control": "no-cache"})


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


class Reply:
    """The objects of one Ollama reply: ``/api/chat``'s ``message`` or ``/api/generate``'s ``response``.

    Args:
        model: the model's name.
        chat: ``/api/chat`` (else ``/api/generate``).
        started: when the request came (``time.monotonic``), for ``total_duration``.
        reader: reads tool calls out of streamed text, when the request offered tools.
    """

    def __init__(self, model: str, chat: bool, started: float, reader: Optional[CallReader] = None):
        self.model, self.chat, self.started, self.reader = requests.tagged(model), chat, started, reader

    def _object(self, text: str, thinking: Optional[str] = None, done: bool = False,
                calls: Optional[list[dict[str, Any]]] = None) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "created_at": _time()}
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

    def piece(self, kind: str, value: Any) -> list[str]:
        """The lines for one event of the generation (text, or reasoning); logprobs are not asked for here."""
        if kind == "reasoning":
            return [_line(self._object("", thinking=value))]
        if kind != "text":
            return []
        if self.reader is None:
            return [_line(self._object(value))]
        content = "".join(e.text for e in self.reader.feed(value) if e.kind == "content")
        return [_line(self._object(content))] if content else []  # calls come whole, at the end

    def end(self, r: Result) -> list[str]:
        """The last lines: held-back text, the calls, and the done object with the counts."""
        out = []
        if self.reader is not None:
            content = "".join(e.text for e in self.reader.close() if e.kind == "content")
            if content or r.tool_calls:
                out.append(_line(self._object(content, calls=_calls(r))))
        out.append(_line({**self._object(""), **self._counts(r)}))
        return out

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
