"""The server's HTTP boundary: the error every API answers (``ApiError``, rendered in the shape of the API a
path belongs to), and the checks every request passes first.

A server on 127.0.0.1 is reachable from every web page its user opens, so
``Guard`` (a pure ASGI middleware: it does not hide a client's disconnect
from the endpoints, as Starlette's ``BaseHTTPMiddleware`` does) treats the
request line and headers as input too, before any endpoint runs:

* **Host**: on a loopback bind only ``localhost``, ``127.0.0.1`` and ``[::1]``
  (any port) are accepted; a page that rebinds its own name to 127.0.0.1
  sends its own name and gets 403.
* **Origin**: a browser's cross-site request carries one; it must be one the
  operator allowed (``--allow-origin``), else 403.
* **API key**: when set, on every path but ``/health``, checked against the
  ASGI path itself (not a URL rebuilt from the Host header); it comes as
  ``Authorization: Bearer KEY``, or as Anthropic's clients send it, ``x-api-key``.
* **Content type**: POST bodies must be ``application/json`` (415), which a
  page cannot send cross-site without a CORS preflight.
* **Body size**: over ``max_body`` bytes gets 413 as soon as that is known.

A refusal is answered in the shape of the API its path belongs to (``Guard``'s
``shape``) and sent whole before the rest of the body is read and dropped (up
to ``DRAIN_BYTES``, within ``DRAIN_SECONDS``), and the connection closes after
that: a client that writes its whole body before it reads (as ``requests``,
``httpx`` and curl do) reads the answer instead of a reset connection.
"""

from __future__ import annotations

import asyncio
import hmac
from typing import Any, Awaitable, Callable, MutableMapping, Optional, Sequence

from starlette.datastructures import Headers
from starlette.responses import JSONResponse, Response

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Paths anyone may read without the API key.
OPEN_PATHS = ("/health",)
#: Seconds a client may take to send a request body.
BODY_SECONDS = 30.0
#: The most of a refused request's body read (and dropped) after the answer, and for how long, before closing.
DRAIN_BYTES, DRAIN_SECONDS = 1 << 30, 10.0
#: Refusals after which the rest of the body is read: the client may still be sending it.
DRAINED = (401, 403, 413, 415)


class ApiError(Exception):
    """An error a request gets: its status, and OpenAI's fields for it (each API renders it in its own shape)."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: Optional[str] = None, code: Optional[str] = None, headers: Optional[dict[str, str]] = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        """OpenAI's error object."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        """The error as OpenAI's API answers one."""
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


#: The status of a request whose client went away before its answer (nginx's "client closed request").
CLIENT_CLOSED = 499
#: How an API answers an error.
Render = Callable[[ApiError], Response]
#: The way errors are answered on a request's path (and headers): by the API it belongs to.
Shape = Callable[[Scope], Render]


def openai_shape(scope: Scope) -> Render:
    """OpenAI's error object, whatever the path."""
    return ApiError.response


def host_name(host: str) -> Optional[str]:
    """The name part of a Host header, lower-cased (``[::1]:8000`` -> ``[::1]``); None if malformed."""
    host = host.strip().lower()
    if host.startswith("["):  # an IPv6 literal: [::1] or [::1]:8000
        name, bracket, rest = host.partition("]")
        name += bracket
    else:
        name, colon, port = host.partition(":")
        rest = colon + port
    if not name or (rest and not (rest[0] == ":" and rest[1:].isdigit() and len(rest) <= 6)):
        return None
    return name


class Guard:
    """ASGI middleware that answers bad requests before the application sees them.

    Args:
        app: the application to protect.
        hosts: the Host names accepted (lower-case, IPv6 in brackets); empty accepts any (a non-loopback bind).
        origins: the Origin values accepted; ``"*"`` accepts any.
        api_key: required as ``Authorization: Bearer KEY`` on every path but ``/health``; None for none.
        max_body: the largest request body, in bytes.
        body_seconds: how long a client may take to send the body (408 after that).
        shape: how a refusal is answered on a request's path: in the shape of the API the path belongs to.
    """

    def __init__(self, app: ASGIApp, *, hosts: Sequence[str], origins: Sequence[str], api_key: Optional[str],
                 max_body: int, body_seconds: float = BODY_SECONDS, shape: Shape = openai_shape):
        self.app = app
        self.shape = shape
        self.body_seconds = body_seconds
        self.hosts = frozenset(hosts)
        self.origins = frozenset(origins)
        self.api_key = api_key
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan events
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        try:
            self.check(scope, headers)
            if scope["method"] == "POST":
                receive = await self._buffered(receive)
        except ApiError as exc:
            response = self.shape(scope)(exc)
            origin = headers.get("origin")
            if origin is not None and self._allowed(origin):  # so the page can read why
                response.headers["Access-Control-Allow-Origin"] = origin
                response.headers["Vary"] = "Origin"
            waits = "100-continue" in headers.get("expect", "").lower()  # it sends no body unless told to
            if scope["method"] == "POST" and exc.status in DRAINED and not waits:
                await _answer_then_drain(response, scope, receive, send)
            else:
                await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _allowed(self, origin: str) -> bool:
        return "*" in self.origins or origin in self.origins

    def check(self, scope: Scope, headers: Headers) -> None:
        """Raise ApiError for a request that must not reach the application."""
        if self.hosts and host_name(headers.get("host", "")) not in self.hosts:
            raise ApiError(403, f"Host {headers.get('host', '')!r} is not this server's loopback address; "
                           f"address it as {' or '.join(sorted(self.hosts))} (a page that points its own name at "
                           "this machine is refused).", type="permission_error", code="host_not_allowed")
        origin = headers.get("origin")
        if origin is not None and not self._allowed(origin):
            hint = f"start the server with --allow-origin {origin} to let that page use it" if \
                origin.startswith(("http://", "https://")) else "only pages the operator names are allowed"
            raise ApiError(403, f"Requests from web pages at {origin!r} are not allowed; {hint}.",
                           type="permission_error", code="origin_not_allowed")
        preflight = scope["method"] == "OPTIONS" and origin is not None  # carries no credentials by design
        if self.api_key and not preflight and scope["path"] not in OPEN_PATHS:
            token = _key(headers)
            if not hmac.compare_digest(token.encode("latin-1", "replace"), self.api_key.encode()):
                raise ApiError(401, "Missing or wrong API key: send 'Authorization: Bearer KEY' with the key "
                               "the server was started with.", code="invalid_api_key")
        if scope["method"] == "POST":
            kind = headers.get("content-type", "").partition(";")[0].strip().lower()
            if kind != "application/json":
                raise ApiError(415, f"The request body must be JSON sent as 'Content-Type: application/json', "
                               f"not {kind or 'no content type'!r}.", code="unsupported_media_type")
            length = headers.get("content-length")
            if length is not None and (not length.isdigit() or int(length) > self.max_body):
                raise self._too_large(f"The request body ({length} bytes)")

    def _too_large(self, what: str) -> ApiError:
        return ApiError(413, f"{what} is larger than this server's limit of {self.max_body} bytes (--max-body).",
                        code="body_too_large")

    async def _buffered(self, receive: Receive) -> Receive:
        """Read the whole body (at most ``max_body`` bytes, in ``body_seconds``) and hand it on in one message."""
        chunks, size = [], 0
        deadline = asyncio.get_running_loop().time() + self.body_seconds
        while True:
            try:
                message = await asyncio.wait_for(receive(), deadline - asyncio.get_running_loop().time())
            except asyncio.TimeoutError:
                raise ApiError(408, f"The client took longer than {self.body_seconds:g} s to send the request body.",
                               code="body_timeout") from None
            if message["type"] == "http.disconnect":
                raise ApiError(400, "The client left before sending the whole body.")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise self._too_large("The request body")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # later calls wait for the client to leave

        return replay


def _key(headers: Headers) -> str:
    """The API key a request carries: ``Authorization: Bearer KEY``, else Anthropic's ``x-api-key``."""
    auth = headers.get("authorization")
    if auth is None:
        return headers.get("x-api-key", "")
    return auth[7:] if auth.lower().startswith("bearer ") else ""


async def _answer_then_drain(response: Response, scope: Scope, receive: Receive, send: Send) -> None:
    """Send ``response`` (all its bytes, ``Connection: close``), read what is left of the body, then end it."""
    response.headers["Connection"] = "close"

    async def held(message: Message) -> None:  # the response's end waits until the body is read
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            await send({**message, "more_body": True})
            await _drain(receive)
            message = {"type": "http.response.body", "body": b"", "more_body": False}
        await send(message)

    await response(scope, receive, held)


async def _drain(receive: Receive) -> None:
    """Read and drop the request body, at most ``DRAIN_BYTES`` of it within ``DRAIN_SECONDS``."""
    loop = asyncio.get_running_loop()
    deadline, left = loop.time() + DRAIN_SECONDS, DRAIN_BYTES
    while left > 0:
        try:
            message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            return
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
        left -= len(message.get("body", b""))
