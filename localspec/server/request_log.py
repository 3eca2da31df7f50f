"""What ``serve`` says about each request: one line when it ends, and progress while a long prompt is read.

``RequestLog`` is the outermost middleware: it opens an ``Entry`` for every HTTP request, puts it in the
request's scope, and writes the entry's line when the response has been sent, or when the client hung up
first. The parts that know more fill the entry in as they go: a refusal's sentence (``note_error``, called
wherever an error is answered, so the line carries the sentence the error body does), and for a generation
the relay's outcome, statistics and first token. While a prompt is being read the relay asks ``progress``
for a line now and then.

Nothing of a prompt's text is written unless the log is verbose.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..events import GenerationStats
from .http import CLIENT_CLOSED, ApiError

#: Seconds between two progress lines of one prompt.
PROGRESS_SECONDS = 10.0
#: The characters of a prompt a verbose line shows.
PROMPT_CHARS = 120
#: Paths that monitors poll: their lines only in a verbose log, so they do not bury the requests'.
POLLED = ("/health", "/metrics")

#: The API a path belongs to, by prefix (the first that matches).
APIS = (("/v1/chat/completions", "openai"), ("/v1/completions", "openai"), ("/v1/responses", "responses"),
        ("/v1/messages", "anthropic"), ("/api/", "ollama"), ("/v1/models", "models"), ("/metrics", "metrics"),
        ("/health", "health"))


def api_of(path: str) -> str:
    """The API a path belongs to ("-" for none of them)."""
    return next((api for prefix, api in APIS if path.startswith(prefix)), "-")


@dataclass
class Entry:
    """One request, as its line will say it; filled in by whoever learns something of it.

    Attributes:
        method: the HTTP method.
        path: the path, without the query.
        started: ``time.monotonic()`` when the request came in.
        wall: ``time.time()`` then, for the line's clock time.
        status: the status answered (None until the response starts).
        model: the model a generation ran on.
        error: the sentence of the error answered, if one was.
        error_status: that error's status (a stream's error comes after its 200).
        outcome: how a generation ended: its finish reason, or "cancelled" (its client hung up).
        stats: a generation's statistics: a finished one's, or what one given up had done.
        first_token: seconds from ``started`` to the first token sent.
        prompt: the start of the prompt's text (written only by a verbose log).
        completed: whether the whole response was sent.
        read_so_far: for a generation given up while it read its prompt, the prompt tokens the model held.
        say: where the request's progress lines go (the log's own lines).
        progress_at: when the last progress line was written (monotonic seconds).
        reading_since: when the prompt was first seen being read, and how many of its tokens were read then.
        waited: why a generation waited for room in the shared cells before it began, if it did.
    """

    method: str
    path: str
    started: float
    wall: float
    status: Optional[int] = None
    model: Optional[str] = None
    error: Optional[str] = None
    error_status: int = 0
    outcome: Optional[str] = None
    stats: Optional[GenerationStats] = None
    first_token: Optional[float] = None
    prompt: Optional[str] = None
    completed: bool = False
    read_so_far: Optional[int] = None
    say: Optional[Callable[[str], None]] = field(default=None, repr=False)
    progress_at: float = 0.0
    reading_since: Optional[tuple[float, int]] = None
    waited: Optional[str] = None

    def line(self, now: float, verbose: bool = False) -> str:
        """The request's line: clock time, API and route, model, status, then what it did and how it ended."""
        parts = [time.strftime("%H:%M:%S", time.localtime(self.wall)), api_of(self.path),
                 f"{self.method} {self.path}", self.model or "-", str(self.status if self.status is not None
                                                                     else CLIENT_CLOSED)]
        if self.stats is not None:
            parts.append(_generation(self.stats, self.first_token, self.read_so_far))
        if self.waited is not None:
            parts.append("waited for room")
        parts.append(f"{now - self.started:.2f} s")
        ended = self._ended()
        if ended:
            parts.append(ended)
        if verbose and self.prompt:
            parts.append(f"prompt {self.prompt!r}")
        return " | ".join(parts)

    def noted(self, error: ApiError) -> None:
        """Record the error the request is answered with."""
        self.error, self.error_status = error.message, error.status

    def _ended(self) -> str:
        if self.error is not None:
            return f"{'failed' if self.error_status >= 500 else 'refused'}: {self.error}"
        if self.status in (None, CLIENT_CLOSED) or self.outcome == "cancelled" or not self.completed:
            return "cancelled by the client"
        return f"ended: {self.outcome}" if self.outcome else ""


def _generation(stats: GenerationStats, first_token: Optional[float], read_so_far: Optional[int] = None) -> str:
    """A generation's counts: prompt tokens read (``read_so_far``: of a prompt given up while it was read, the
    tokens the model held) and restored, tokens generated, drafted and accepted."""
    read = stats.prompt_tokens - stats.cached_prompt_tokens
    if read_so_far is not None:
        read = read_so_far - stats.cached_prompt_tokens
    live = stats.cached_prompt_tokens - stats.restored_prompt_tokens
    prompt = f"prompt {stats.prompt_tokens} (read {read}, restored {stats.restored_prompt_tokens}"
    prompt += f", kept {live})" if live else ")"
    first = f", first token {first_token:.2f} s" if first_token is not None else ""
    return (f"{prompt}, generated {stats.generated_tokens} (drafted {stats.drafted}, accepted {stats.accepted})"
            f"{first}")


def entry_of(scope: Scope) -> Optional[Entry]:
    """The request's entry, if a ``RequestLog`` opened one."""
    state = scope.get("state")
    return state.get("log") if isinstance(state, dict) else None


def note_error(scope: Scope, error: ApiError) -> ApiError:
    """Record the error a request is answered with; returns it, to be rendered."""
    entry = entry_of(scope)
    if entry is not None:
        entry.noted(error)
    return error


def progress(entry: Entry, read: int, total: int, now: float) -> Optional[str]:
    """A progress line for a prompt being read (``read`` of its ``total`` tokens held so far), at most every
    ``PROGRESS_SECONDS`` from the request's start: tokens read, and the speed since it was first seen
    reading; None when it is not yet time for one."""
    if entry.reading_since is None:
        entry.reading_since = (now, read)
    if now - max(entry.progress_at, entry.started) < PROGRESS_SECONDS:
        return None
    entry.progress_at = now
    since, at = entry.reading_since
    speed = f", {(read - at) / (now - since):.1f} tokens/s" if now > since and read > at else ""
    return progress_line(entry, f"reading the prompt: {read} of {total} tokens{speed}")


def progress_line(entry: Entry, what: str) -> str:
    """A line of how a request goes (``what``), before its own line when it ends."""
    return (f"{time.strftime('%H:%M:%S')} | {api_of(entry.path)} | {entry.method} {entry.path} | "
            f"{entry.model or '-'} | {what}")


class RequestLog:
    """ASGI middleware: a line for every HTTP request once it is answered (or its client hangs up); polls of
    ``POLLED`` paths only when verbose or refused.

    Args:
        app: the application.
        say: where lines go (one call per line).
        verbose: add the start of the prompt to a generation's line.
    """

    def __init__(self, app: ASGIApp, *, say: Callable[[str], None], verbose: bool = False,
                 clock: Callable[[], float] = time.monotonic):
        self.app, self.say, self.verbose, self.clock = app, say, verbose, clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan events
            await self.app(scope, receive, send)
            return
        entry = Entry(scope["method"], scope["path"], self.clock(), time.time(), say=self.say)
        scope.setdefault("state", {})["log"] = entry

        async def sent(message: Message) -> None:
            if message["type"] == "http.response.start":
                entry.status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                entry.completed = True
            await send(message)

        try:
            await self.app(scope, receive, sent)
        except Exception as exc:  # answered 500 by the outermost error handler, after this line
            if entry.status is None:
                entry.status = 500
                entry.noted(ApiError(500, f"The request failed: {exc!r}.", type="server_error"))
            raise
        finally:
            if self.verbose or entry.path not in POLLED or entry.error is not None:
                self.say(entry.line(self.clock(), self.verbose))


def describe(req: Any) -> str:
    """The start of a request's prompt: its last message's text, or the prompt itself."""
    if getattr(req, "messages", None):
        content = req.messages[-1].get("content")
        text = content if isinstance(content, str) else " ".join(  # an image as [image], not its bytes
            str(p.get("text", "")) if p.get("type") == "text" else f"[{p.get('type')}]" for p in content or [])
    else:
        text = str(getattr(req, "prompt", "") or "")
    return text[:PROMPT_CHARS]
