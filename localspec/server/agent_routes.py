"""The Anthropic Messages and OpenAI Responses routes of ``localspec serve``.

``POST /v1/messages`` (also ``?beta=true``), ``POST /v1/messages/count_tokens`` and ``POST /v1/responses``
translate their bodies into the server's request type (``server_anthropic``, ``server_responses``), admit
it on the same worker and queue as chat completions, behind the same guards, and answer in their own shapes
(``server_anthropic_replies``, ``server_responses_replies``, relayed by ``server_relay``). A count of a
prompt's tokens is admitted to the same queue too: it uses the models, which only the worker touches.

``AnthropicHeaders`` lets Anthropic's clients through the guards: their ``x-api-key`` header counts as the
bearer key, and a refusal on a Messages path (or on ``/v1/models`` to a request naming ``anthropic-version``)
comes back as Anthropic's error object.
"""

from __future__ import annotations

import asyncio
import datetime
import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ..errors import LocalspecError
from .anthropic.replies import MessageReply, error_body
from .anthropic.requests import error_response, parse_messages
from .http import ApiError, ASGIApp, Message, Receive, Scope, Send
from .openai.requests import ChatRequest, parse_body
from .relay import NextEvent, answer
from .responses.replies import ResponseReply
from .responses.requests import error_response as responses_error
from .responses.requests import parse_responses

#: The paths answered in Anthropic's shapes.
ANTHROPIC_PREFIX = "/v1/messages"
#: The header every request of Anthropic's SDKs carries: on the path both APIs share, it picks Anthropic's shapes.
ANTHROPIC_VERSION = b"anthropic-version"
#: The path both APIs answer (the models, and one model by name).
SHARED_PATH = "/v1/models"


def from_anthropic(request: Request) -> bool:
    """Whether a request comes from an Anthropic client (it names the API version it speaks)."""
    return ANTHROPIC_VERSION.decode() in request.headers


def anthropic_model(name: str, created: int) -> dict[str, Any]:
    """A model as Anthropic's Models API describes one (``created``: seconds since the epoch)."""
    when = datetime.datetime.fromtimestamp(created, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"type": "model", "id": name, "display_name": name, "created_at": when, "lifecycle": "active"}


def register(app: FastAPI, server: Any, next_event: NextEvent) -> None:
    """Add the Messages and Responses routes to ``app`` (after its guards: ``AnthropicHeaders`` goes
    outside them).

    Args:
        app: the server's application.
        server: the ``localspec.server.worker.Server`` whose worker and queue generate.
        next_event: how the server waits for a job's next event (noticing a client that left).
    """

    @app.post("/v1/messages")
    async def messages(request: Request) -> Any:
        try:
            req = await _parsed(request, lambda body: parse_messages(body, server.defaults, server.limits))
            job = server.admit(req)
        except ApiError as exc:
            return error_response(exc)
        reply = MessageReply(server.name, req)
        return await answer(server, job, request, reply, req.stream, error_response, next_event)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Any:
        try:
            req = await _parsed(request, lambda body: parse_messages(body, server.defaults, server.limits, True))
            # The models are the worker's to use: counting waits its turn as a generation does, within the queue's
            # limit, and leaves the queue when its client goes away.
            job = server.admit(req, _count)
        except ApiError as exc:
            return error_response(exc)
        try:
            kind, value = await next_event(server, job, request)
        finally:
            server.abandon(job)  # its client left (or the count is done, and this does nothing)
        if kind == "error":
            return error_response(value)
        if value is None:  # cancelled: nobody is listening
            return JSONResponse({}, status_code=499)
        return {"input_tokens": value}

    @app.post("/v1/responses")
    async def responses(request: Request) -> Any:
        try:
            req, body = await _parsed(request, lambda b: parse_responses(b, server.defaults, server.limits))
            job = server.admit(req)
        except ApiError as exc:
            return responses_error(exc)
        reply = ResponseReply(server.name, req, body)
        return await answer(server, job, request, reply, req.stream, responses_error, next_event)

    app.add_middleware(AnthropicHeaders)


async def _parsed(request: Request, parse: Any) -> Any:
    body = await request.body()
    # Parsing a large body takes a while: off the event loop, so other clients are not kept waiting.
    return await asyncio.to_thread(lambda: parse(parse_body(body)))


def _count(pair: Any, req: ChatRequest) -> int:
    """The prompt tokens of a request, as its generation would render them."""
    assert req.messages is not None
    tools = [t.to_openai() for t in req.tools.tools] if req.tools and req.tools.choice != "none" else ()
    try:
        text = pair.format_chat(req.messages, tools=tools)
    except LocalspecError as exc:  # the template refuses the conversation: the request is at fault
        raise ApiError(400, f"The chat template cannot render these messages: {exc}") from None
    return len(pair.target.tokenize(text, add_special=False))


class AnthropicHeaders:
    """ASGI middleware: ``x-api-key`` as the bearer key; refusals on Messages paths, and on the models' paths to
    a request with ``anthropic-version``, in Anthropic's shape."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = list(scope["headers"])
        names = {k.lower() for k, _ in headers}
        key = next((v for k, v in headers if k.lower() == b"x-api-key"), None)
        if key is not None and b"authorization" not in names:
            scope = dict(scope, headers=[*headers, (b"authorization", b"Bearer " + key)])
        path = scope["path"]
        shared = path == SHARED_PATH or path.startswith(SHARED_PATH + "/")
        if not path.startswith(ANTHROPIC_PREFIX) and not (shared and ANTHROPIC_VERSION in names):
            await self.app(scope, receive, send)
            return
        await self.app(scope, receive, _Reshaped(send))


class _Reshaped:
    """Passes a response on, rewriting an OpenAI-shaped error body as Anthropic's."""

    def __init__(self, send: Send):
        self.send = send
        self.start: Message | None = None
        self.body = b""

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] >= 400:
            self.start = message  # held until the body is known
            return
        if self.start is None or message["type"] != "http.response.body":
            await self.send(message)
            return
        self.body += message.get("body", b"")
        if message.get("more_body", False):
            return
        status, body = self.start["status"], self.body
        try:
            found = json.loads(body)
        except ValueError:
            found = None
        if isinstance(found, dict) and isinstance(found.get("error"), dict) and found.get("type") != "error":
            status = 529 if status == 503 else status
            body = bytes(JSONResponse(error_body(status, str(found["error"].get("message", "")))).body)
        headers = [(k, v) for k, v in self.start.get("headers", []) if k.lower() != b"content-length"]
        await self.send({**self.start, "status": status, "headers": [*headers, (b"content-length",
                                                                               str(len(body)).encode())]})
        await self.send({"type": "http.response.body", "body": body})
