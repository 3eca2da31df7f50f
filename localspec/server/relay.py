"""The one relay between a request and its generation, whatever API the request came by.

A route checks its body into a ``GenerationRequest`` and hands it here with its API's ``Reply`` (how the
API writes a generation's events, and its whole-object answer) and ``Render`` (how it answers an error).
The relay admits the request to the server's worker, waits for the job's events and writes them through
the reply: one object once the generation is done, or a stream as it goes. A stream's first bytes go out
once the prompt's length and the part of it the caches give are known (within ``FIRST_SECONDS`` of
that), with the reply's keep-alive at once and every ``PING_SECONDS`` while a long prompt is processed. The
answer's text is read for tool calls by one reader, as it streams, when the request offered tools. A
client that goes away, at any point, gives its job up; an error before a stream starts is an error
response, one after it is said in the stream.
"""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any, AsyncIterator, Callable, Optional, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..results import Result
from ..structured.call_reader import CallEvent, CallReader, call_reader
from .generation import GenerationRequest
from .http import CLIENT_CLOSED, ApiError, Render
from .request_log import Entry, describe, entry_of, note_error, progress, progress_line
from .worker import Job, Server, Task

#: Seconds between keep-alives while the first token is awaited (a long prompt being processed).
PING_SECONDS = 5.0
#: Seconds to wait for a first event before a stream starts with only the prompt's length known.
FIRST_SECONDS = 0.5
#: Seconds between looks at whether a waiting client is still connected.
CHECK_SECONDS = 0.25
#: The events that carry part of the answer (a whole answer reads them from the result), or say how it goes.
PIECES = ("text", "reasoning", "logprobs", "waiting")

Event = tuple[str, Any]


class Reply(Protocol):
    """How one API answers one request: a stream's pieces (each a string of its wire format: server-sent
    events or JSON lines), or the whole object."""

    #: The stream's media type.
    media_type: str

    def start(self, prompt_tokens: int, cached_tokens: int) -> list[str]:
        """A stream's first pieces, sent once the prompt is known (possibly none)."""

    def ping(self) -> list[str]:
        """A keep-alive its clients skip, while a long prompt is processed (possibly none)."""

    def logprobs(self, entry: dict[str, Any]) -> None:
        """A token's log-probabilities, before the text it belongs to."""

    def reasoning(self, text: str) -> list[str]:
        """More of a reasoning model's thinking."""

    def content(self, found: list[CallEvent]) -> list[str]:
        """More of the answer: its text, and the tool calls read in it."""

    def end(self, result: Result, tail: list[CallEvent]) -> list[str]:
        """A stream's last pieces: what the call reader held back to the end (``tail``), then the end."""

    def error(self, error: ApiError) -> list[str]:
        """A failure after the stream began, said in the stream."""

    def whole(self, result: Result) -> dict[str, Any]:
        """The answer to a request that did not ask to stream."""


class Events:
    """A job's events, as its relay waits for them: a client found gone (looked at every ``CHECK_SECONDS``)
    gives the job up, and a wait with a time limit does not lose the event it waited for."""

    def __init__(self, server: Server, job: Job, request: Request):
        self.server, self.job, self.request = server, job, request
        self._pending: Optional[asyncio.Future] = None

    async def get(self, timeout: Optional[float] = None) -> Optional[Event]:
        """The next event, or None when ``timeout`` seconds pass first."""
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._next())
        done, _ = await asyncio.wait({self._pending}, timeout=timeout)
        if not done:
            return None
        event, self._pending = self._pending.result(), None
        return event

    async def _next(self) -> Event:
        job = self.job
        while True:
            if not job.cancelled.is_set() and time.monotonic() - job.checked >= CHECK_SECONDS:
                job.checked = time.monotonic()
                self._progress()
                if await self.request.is_disconnected():
                    self.server.abandon(job)
                    if job not in self.server.jobs:  # it never started: nothing more will come
                        return "done", None
            try:
                return await asyncio.wait_for(job.events.get(), timeout=CHECK_SECONDS)
            except asyncio.TimeoutError:
                continue

    def _progress(self) -> None:
        """A line in the request log now and then while the job's prompt is read."""
        entry, stream = entry_of(self.request.scope), self.job.stream
        if entry is None or entry.say is None or stream is None or stream.prompt_read is None:
            return
        line = progress(entry, stream.prompt_read, stream.prompt_tokens, time.monotonic())
        if line is not None:
            entry.say(line)

    def close(self) -> None:
        """Stop waiting, and give the job up (a finished one: nothing happens)."""
        if self._pending is not None:
            self._pending.cancel()
        self.server.abandon(self.job)
        entry, stream = entry_of(self.request.scope), self.job.stream
        if entry is not None and entry.stats is None and stream is not None:  # given up: what it had done
            entry.read_so_far = stream.prompt_read  # None unless it was still reading its prompt
            entry.stats = copy.copy(stream.stats)  # the worker may still be changing its own


async def answer(server: Server, request: Request, req: GenerationRequest, reply: Reply, render: Render) -> Any:
    """Admit ``req`` and answer it: ``reply``'s whole object, or its stream if ``req`` asks for one; errors
    (a full queue, a failure before the stream starts) through ``render``."""
    render = _noting(request, render)
    _opened(request, server, req)
    events = _admitted(server, request, req, render)
    if isinstance(events, Response):
        return events
    try:
        first = await _first(events, req.stream)
    except BaseException:  # the handler was cancelled
        events.close()
        raise
    if first is not None and first[0] == "error":
        events.close()
        return render(first[1])
    if not req.stream:
        return await _whole(events, first, render, reply.logprobs, reply.whole, generation=True)
    return StreamingResponse(_stream(events, first, reply, call_reader(req.tools)), media_type=reply.media_type,
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def run_task(server: Server, request: Request, req: GenerationRequest, task: Task, render: Render,
                   build: Callable[[Any], Any]) -> Any:
    """Admit ``task`` (work on the pair other than a generation) for ``req`` and answer ``build`` of what it
    returns; errors through ``render``."""
    render = _noting(request, render)
    events = _admitted(server, request, req, render, task)
    if isinstance(events, Response):
        return events
    try:
        first = await events.get()
    except BaseException:
        events.close()
        raise
    return await _whole(events, first, render, lambda entry: None, build)


def _noting(request: Request, render: Render) -> Render:
    """``render``, saying the error in the request's log line too."""
    return lambda error: render(note_error(request.scope, error))


def _opened(request: Request, server: Server, req: GenerationRequest) -> None:
    """What the request's log line says of a generation before it starts."""
    entry = entry_of(request.scope)
    if entry is not None:
        entry.model, entry.prompt = server.name, describe(req)


def _ended(entry: Optional[Entry], result: Optional[Result]) -> None:
    """What the log line says of a generation that ended (None: cancelled, its client gone)."""
    if entry is not None:
        entry.outcome = "cancelled" if result is None else result.finish_reason
        if result is not None:  # a cancelled one's stats are what it had done (``Events.close``)
            entry.stats = result.stats


def _first_token(entry: Optional[Entry]) -> None:
    if entry is not None and entry.first_token is None:
        entry.first_token = time.monotonic() - entry.started


def _admitted(server: Server, request: Request, req: GenerationRequest, render: Render,
              task: Optional[Task] = None) -> Events | Response:
    try:
        return Events(server, server.admit(req, task), request)
    except ApiError as exc:  # the queue is full, or the server is stopping
        return render(exc)


async def _first(events: Events, stream: bool) -> Optional[Event]:
    """The first event; for a stream, None once the prompt and the part of it the caches give are known but
    processing the rest takes a while."""
    while True:
        event = await events.get(FIRST_SECONDS if stream else None)
        started = events.job.stream
        if event is not None or (started is not None and started.cached_prompt_tokens is not None):
            return event


async def _whole(events: Events, event: Optional[Event], render: Render, logprobs: Callable[[Any], None],
                 build: Callable[[Any], Any], generation: bool = False) -> Any:
    """The answer once the job is done: ``build`` of its value; ``generation``: the value is a generation's
    result, which the request's log line tells of."""
    entry = entry_of(events.request.scope)
    try:
        while event is None or event[0] in PIECES:  # the result has the text and the reasoning whole
            if event is not None and event[0] == "logprobs":
                logprobs(event[1])
            elif event is not None and event[0] == "waiting":
                _noted(entry, event)
            elif event is not None:
                _first_token(entry)
            event = await events.get()
    finally:
        events.close()
    kind, value = event
    if kind == "error":
        return render(value)
    if generation:
        _ended(entry, value)
    if value is None:  # cancelled: nobody is listening
        return JSONResponse({}, status_code=CLIENT_CLOSED)  # nobody reads it
    return build(value)


async def _stream(events: Events, event: Optional[Event], reply: Reply,
                  reader: Optional[CallReader]) -> AsyncIterator[str]:
    try:
        stream = events.job.stream
        known = (stream.prompt_tokens, stream.cached_prompt_tokens or 0) if stream is not None else (0, 0)
        if event is not None and event[0] == "waiting":  # it waits for room: its prompt's length is known
            known = (event[1][1], 0)
        for piece in reply.start(*known):
            yield piece
        entry = entry_of(events.request.scope)
        while True:
            _noted(entry, event)
            for piece in _pieces(reply, reader, event):
                yield piece
            if event is not None and event[0] in ("error", "done"):
                break
            event = await events.get(PING_SECONDS)
    finally:
        events.close()  # the client went away (or we are done): stop generating


def _noted(entry: Optional[Entry], event: Optional[Event]) -> None:
    """What the request's log line learns from a streamed event."""
    if entry is None or event is None:
        return
    kind, value = event
    if kind in ("text", "reasoning"):
        _first_token(entry)
    elif kind == "waiting":
        entry.waited = value[0]
        if entry.say is not None:
            entry.say(progress_line(entry, value[0]))
    elif kind == "error":
        entry.noted(value)
    elif kind == "done":
        _ended(entry, value)


def _pieces(reply: Reply, reader: Optional[CallReader], event: Optional[Event]) -> list[str]:
    """What ``reply`` writes for one event (None: the first token is still awaited)."""
    if event is None or event[0] == "waiting":  # the first token is still awaited
        return reply.ping()
    kind, value = event
    if kind == "logprobs":
        reply.logprobs(value)
        return []
    if kind == "reasoning":
        return reply.reasoning(value)
    if kind == "text":
        return reply.content(reader.feed(value) if reader is not None else [CallEvent("content", value)])
    if kind == "error":
        return reply.error(value)
    if value is None:  # cancelled: its client has gone
        return []
    return reply.end(value, reader.close() if reader is not None else [])
