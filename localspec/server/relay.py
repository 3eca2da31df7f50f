"""The generation of one admitted request, relayed to a client in the shape of the API it came in by.

The Anthropic Messages and OpenAI Responses routes translate their bodies into a ``ChatRequest`` and admit
it on the server's one worker and queue, as chat completions does; this module waits for the job's events
(the answer's text, its reasoning, the end or an error) and hands them to the API's reply builder
(``Reply``): one object once the generation is done, or server-sent events as it goes, with a keep-alive
while a long prompt is processed.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from ..results import Result
from .http import ApiError

#: Seconds between keep-alives while the first token is awaited (a long prompt being processed).
PING_SECONDS = 5.0
#: Seconds to wait for a first event before a stream starts with only the prompt's length known.
FIRST_SECONDS = 0.5


class Reply(Protocol):
    """One API's reply to one request: events as strings of server-sent events, or a whole object."""

    def start(self, prompt_tokens: int, cached_tokens: int) -> list[str]: ...

    def reasoning(self, text: str) -> list[str]: ...

    def text(self, text: str) -> list[str]: ...

    def end(self, result: Result) -> list[str]: ...

    def error(self, error: ApiError) -> list[str]: ...

    def ping(self) -> list[str]: ...

    def whole(self, result: Result) -> dict[str, Any]: ...


class Admits(Protocol):
    """What the relay needs of the server: admission, and giving a job up when its client leaves."""

    def admit(self, request: Any) -> Any: ...

    def abandon(self, job: Any) -> None: ...


NextEvent = Callable[[Any, Any, Request], Awaitable[tuple[str, Any]]]


class Events:
    """A job's events, awaited with a time limit that does not lose the event being waited for."""

    def __init__(self, server: Admits, job: Any, request: Request, next_event: NextEvent):
        self.server, self.job, self.request, self._next = server, job, request, next_event
        self._pending: Optional[asyncio.Future] = None

    async def get(self, timeout: Optional[float] = None) -> Optional[tuple[str, Any]]:
        """The next event, or None when ``timeout`` seconds pass first."""
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._next(self.server, self.job, self.request))
        done, _ = await asyncio.wait({self._pending}, timeout=timeout)
        if not done:
            return None
        event, self._pending = self._pending.result(), None
        return event

    def close(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
        self.server.abandon(self.job)


async def answer(server: Admits, job: Any, request: Request, reply: Reply, stream: bool,
                 fail: Callable[[ApiError], Any], next_event: NextEvent) -> Any:
    """The response to an admitted ``job``: ``reply``'s whole object or its stream; ``fail`` makes an
    error response (an error before the stream starts is answered as one)."""
    events = Events(server, job, request, next_event)
    try:
        first = await _first(events, stream)
    except BaseException:  # the handler was cancelled
        events.close()
        raise
    if first is not None and first[0] == "error":
        events.close()
        return fail(first[1])
    if not stream:
        return await _whole(events, first, reply, fail)
    return StreamingResponse(_events(events, first, reply), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _first(events: Events, stream: bool) -> Optional[tuple[str, Any]]:
    """The first event; for a stream, None once the prompt and the part of it the caches give are known but
    processing the rest takes a while."""
    while True:
        event = await events.get(FIRST_SECONDS if stream else None)
        started = events.job.stream
        if event is not None or (started is not None and started.cached_prompt_tokens is not None):
            return event


async def _whole(events: Events, event: Optional[tuple[str, Any]], reply: Reply,
                 fail: Callable[[ApiError], Any]) -> Any:
    try:
        while event is None or event[0] in ("text", "reasoning", "logprobs"):  # the result has them whole
            event = await events.get()
    finally:
        events.close()
    kind, value = event
    if kind == "error":
        return fail(value)
    if value is None:  # cancelled: nobody is listening
        return JSONResponse({}, status_code=499)
    return reply.whole(value)


async def _events(events: Events, event: Optional[tuple[str, Any]], reply: Reply) -> AsyncIterator[str]:
    try:
        stream = events.job.stream
        known = (stream.prompt_tokens, stream.cached_prompt_tokens or 0) if stream is not None else (0, 0)
        for piece in reply.start(*known):
            yield piece
        while True:
            if event is None:
                pieces = reply.ping()
            elif event[0] in ("text", "reasoning"):
                pieces = reply.text(event[1]) if event[0] == "text" else reply.reasoning(event[1])
            elif event[0] == "error":
                pieces = reply.error(event[1])
            elif event[0] == "done":
                pieces = reply.end(event[1]) if event[1] is not None else []
            else:
                pieces = []
            for piece in pieces:
                yield piece
            if event is not None and event[0] in ("error", "done"):
                break
            event = await events.get(PING_SECONDS)
    finally:
        events.close()  # the client went away (or we are done): stop generating
