"""The server's generations: admitted requests (``Job``), their queue, and their events.

A pair loaded with N sequences (``serve --parallel``) runs up to N generations at
once, each on a lane of the pair (its own sequence of each model's context), all
on one generation thread: each is a member of the pair's step loop
(``StepBatcher``), which decodes them together, a step at a time. Further
requests wait in a bounded queue and get 503 with ``Retry-After`` once it is
full; a request whose cells do not fit beside the running ones waits for room
before it reads its prompt. A job's events (its text, reasoning and token
log-probabilities as they come, then its end or an error) go back to the event
loop, where the relay (``server.relay``) writes them to the client in its API's
shape. A client that goes away, streaming or not, cancels its generation at the
next token, or leaves the queue if it was still waiting; ``stop`` cancels every
generation when the process ends. Closing a stream leaves both caches
consistent, so the next request is exact. A growing conversation reuses the
cached prefix and only processes its new tokens.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

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
from ..runtime.batching import StepBatcher
from . import metrics as server_metrics
from .generation import GenerationRequest, Limits
from .http import ApiError
from .openai import logprobs as server_logprobs


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
Task = Callable[[Pair, GenerationRequest], Any]


@dataclass(eq=False)
class _Work:
    """Work for the generation thread (``Server.call``), and what came of it."""

    fn: Callable[[], Any]
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)

    def __call__(self) -> None:
        try:
            self.future.set_result(self.fn())
        except BaseException as exc:  # ``call``'s caller raises it
            self.future.set_exception(exc)


@dataclass(eq=False)  # compared (and hashed) by identity: the server keeps a set of them
class Job:
    """One admitted request: its stream's events come back through ``events`` (a task's: its value, or an
    error)."""

    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    task: Optional[Task] = None  # run instead of a generation; "done" carries what it returns
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    stream: Optional[Stream] = None  # once the worker has started it
    waited: Optional[str] = None  # what it waited for before it began, in a sentence (room in the cells)
    checked: float = field(default_factory=time.monotonic)  # when the client was last seen connected
    admitted: Optional[set[Job]] = None  # the server's admitted jobs, which its final event takes it out of

    def put(self, kind: str, value: Any) -> None:
        self.loop.call_soon_threadsafe(self._deliver, kind, value)

    def _deliver(self, kind: str, value: Any) -> None:
        """On the loop: a final event leaves admission in the same callback, so a client that has its answer
        never finds the request still counted as running."""
        if kind in ("done", "error") and self.admitted is not None:
            self.admitted.discard(self)
        self.events.put_nowait((kind, value))


class Server:
    """The pair, its generation thread, and the admitted jobs.

    A pair loaded with several sequences (``parallel``) runs as many requests at once, each on its own lane
    (``Pair.lanes``), their decode calls batched together by one step loop; the rest wait in line.

    Args:
        pair: the loaded models (used from the generation thread only). Requests may hold images where its
            target has a projector, and ``http(s)`` image URLs where ``pair.fetch`` reads them (set it first).
        name: the model name clients use.
        defaults: options for what a request leaves out.
        max_queue: requests that may wait while the others generate; more get 503.
        max_tokens: the most tokens one request may generate (larger requests are capped); None: the context.
        history: False keeps every request out of the history store, whatever it asks.
        keep_billing_header: keep Claude Code's billing-header block in Messages requests (see ``Limits``).
    """

    def __init__(self, pair: Pair, name: str, defaults: GenerationOptions, *, max_queue: int = 8,
                 max_tokens: Optional[int] = None, history: bool = True, keep_billing_header: bool = False):
        self.pair = pair
        self.defaults = defaults
        self.limits = Limits((name,), max_tokens, history, keep_billing_header,
                             vision=pair.target.projector is not None, fetch=pair.fetch)
        self.max_queue = max_queue
        #: Requests that run at once: the pair's sequences.
        self.parallel = pair.lanes.width
        self.batcher: Optional[StepBatcher] = None
        if self.parallel > 1:  # every lane's decode calls go together, from the first request to the last
            self.batcher = StepBatcher()
            pair.lanes.attach(self.batcher)
        self.jobs: set[Job] = set()  # running + waiting; only touched on the event loop's thread
        #: Generations by outcome; "refused": the request was at fault (a 4xx found on the worker), "failed": 5xx.
        self.counts = {"completed": 0, "cancelled": 0, "refused": 0, "failed": 0}
        self._counting = threading.Lock()  # the event loop reads them while the generation thread counts
        self.totals = server_metrics.Totals()  # tokens and requests, for /metrics
        self.created = int(time.time())
        self.stopping = False
        self._inbox: deque[Any] = deque()  # jobs not started yet, and work for the generation thread (``call``)
        self._inbox_lock = threading.Lock()
        self._wake = threading.Event()  # something came into the inbox, or the server closes
        self._closing = False
        self._started = 0  # jobs started and not yet done (the generation thread's own count)
        self._thread = threading.Thread(target=self._serve, name="localspec-generate", daemon=True)
        self._thread.start()

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
        # Measured now, not in the first requests, on the thread that will generate: llama.cpp's OpenMP threads
        # belong to the thread that calls it, and a second team left over from another thread slowed every
        # later batch by a fifth.
        server.call(pair.choose_threads)
        if REGISTRY.get(defaults.method).adaptive or server.parallel > 1:
            server.call(pair.calibrate)
        if server.batcher is not None:  # again, now that the costs that size its prompt chunks are known
            pair.lanes.attach(server.batcher)
        return server

    @property
    def name(self) -> str:
        return self.limits.models[0]

    @property
    def room_waits(self) -> int:
        """Requests that waited for room in the shared cells before they began."""
        return self.pair.lanes.room_waits

    @property
    def set_aside(self) -> int:
        """Generations set aside for want of cells, and brought back when room came."""
        return self.batcher.set_aside if self.batcher is not None else 0

    def occupancy(self) -> tuple[int, int]:
        """(running, waiting): the generations under way (up to ``parallel``) and the requests queued."""
        return min(len(self.jobs), self.parallel), max(0, len(self.jobs) - self.parallel)

    def call(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` on the generation thread, between its steps; its value, or its error raised here."""
        work = _Work(fn)
        self._post(work)
        return work.future.result()

    def close(self) -> None:
        """Wait for the generations under way to finish (queued requests are dropped), then stop batching."""
        with self._inbox_lock:
            self._closing = True
            dropped, self._inbox = list(self._inbox), deque()
        for item in dropped:
            if isinstance(item, _Work):
                item.future.set_exception(RuntimeError("The server is closed."))
        self._wake.set()
        self._thread.join()
        if self.batcher is not None:
            self.pair.lanes.attach(None)
            self.batcher.close()

    def admit(self, request: GenerationRequest, task: Optional[Task] = None) -> Job:
        """Queue a generation on the generation thread, or ``task`` (which uses the pair too), behind the same
        limit (called on the event loop's thread).

        Raises:
            ApiError: 503 when the server is stopping or the queue is full.
        """
        if self.stopping:
            raise ApiError(503, "The server is shutting down.", type="server_error", code="server_stopping")
        if len(self.jobs) >= self.parallel + self.max_queue:
            running = "one generation is" if self.parallel == 1 else f"{self.parallel} generations are"
            raise ApiError(503, f"The server is busy: {running} running and {self.max_queue} are "
                           "waiting; try again shortly.", type="server_error", code="server_busy",
                           headers={"Retry-After": "5"})
        job = Job(request, asyncio.get_running_loop(), task, admitted=self.jobs)
        self.jobs.add(job)
        self._post(job)
        return job

    def _post(self, item: Any) -> None:
        with self._inbox_lock:
            if self._closing:
                if isinstance(item, _Work):
                    item.future.set_exception(RuntimeError("The server is closed."))
                return
            self._inbox.append(item)
        self._wake.set()

    def abandon(self, job: Job) -> None:
        """Its client left: stop the generation at once, or drop it from the queue now."""
        job.cancelled.set()
        if job.stream is not None:
            job.stream.cancel()  # a prompt being processed stops within milliseconds
        elif self._unqueue(job):
            self._count(job, "cancelled")

    def _unqueue(self, job: Job) -> bool:
        """Take a job that has not started out of the queue; False if it started (or was taken)."""
        with self._inbox_lock:
            if job not in self._inbox:
                return False
            self._inbox.remove(job)
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

    def _bump(self, outcome: str) -> None:
        with self._counting:
            self.counts[outcome] += 1

    def _count(self, job: Job, outcome: str) -> None:
        """Count a generation's outcome (a task is not a generation)."""
        if job.task is None:
            self._bump(outcome)

    # -- the generation thread ----------------------------------------------------------------

    def _serve(self) -> None:
        """The generation thread: start what the inbox holds as lanes come free, and drive the step loop while
        generations run; sleep while there is nothing to do."""
        batcher = self.batcher
        while True:
            self._wake.clear()  # before the inbox is read: what comes after wakes it again
            self._start_waiting()
            if batcher is not None and batcher.members:
                batcher.drive(until=self._startable)  # back here once something in the inbox can start
            elif self._closing:
                return
            elif not self._startable():
                self._wake.wait()

    def _startable(self) -> bool:
        """Whether the inbox holds something that can start now (or the server closes)."""
        if not self._wake.is_set():
            return False
        with self._inbox_lock:
            head = self._inbox[0] if self._inbox else None
        return self._closing or (head is not None and self._can_start(head))

    def _can_start(self, head: Any) -> bool:
        """A job while a lane is free; ``call``'s work once no generation is under way (it may decode on the
        pair's own sequence, which a generation may be in the middle of)."""
        if isinstance(head, _Work):
            return self.batcher is None or not self.batcher.members
        return self._started < self.parallel

    def _start_waiting(self) -> None:
        """Start the inbox's jobs while lanes are free, in order, and run its calls."""
        while True:
            with self._inbox_lock:
                head = self._inbox[0] if self._inbox else None
                if head is None or not self._can_start(head):
                    return
                self._inbox.popleft()
            if isinstance(head, _Work):  # ``call``'s: its future carries what came of it
                head()
            elif self.batcher is not None:
                self._started += 1
                self.batcher.spawn(self.generate, head)
            else:  # one sequence: the generation runs here, to its end
                self._started += 1
                self.generate(head)

    def generate(self, job: Job) -> None:
        """Run one job on a free lane, sending events back to the loop."""
        try:
            if job.task is not None:
                self._run_task(job)
            else:
                seq = self.pair.lanes.acquire(job.cancelled, lambda line, prompt: self._waits(job, line, prompt))
                try:
                    self._generate(job, self.pair if seq == 0 else self.pair.lanes.lane(seq))
                finally:
                    self.pair.lanes.release(seq)
        finally:
            self._started -= 1
            self._wake.set()  # a lane is free: a job waiting in the inbox starts at the loop's next look
            job.loop.call_soon_threadsafe(self.jobs.discard, job)  # admission ends when the worker is done

    @staticmethod
    def _waits(job: Job, line: str, prompt: int) -> None:
        """The job waits for room before it begins (``prompt``: its prompt's tokens): its client hears at once
        (its stream starts)."""
        job.waited = line
        job.put("waiting", (line, prompt))

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

    def _generate(self, job: Job, pair: Pair) -> None:
        if job.cancelled.is_set():  # its client left, or the server is stopping, while it waited
            self._cancelled(job)
            return
        stream: Optional[Stream] = None
        req = job.request
        sent = thought = 0  # characters of the answer and of the reasoning sent so far
        try:
            if req.chat:
                assert req.messages is not None
                stream = pair.stream_chat(req.messages, req.options, tools=req.tools,
                                          template_vars=req.template_vars)
            elif req.suffix is not None:
                assert isinstance(req.prompt, str)
                stream = pair.stream_infill(req.prompt, req.suffix, req.options)
            else:
                assert req.prompt is not None
                stream = pair.stream(req.prompt, req.options)
            job.stream = stream
            if job.cancelled.is_set():  # its client left while the stream was being set up
                stream.cancel()
            for ev in stream:
                if job.cancelled.is_set():
                    break  # leaving the loop closes the stream: both caches stay consistent
                if ev.logprob is not None:  # before its text, so a chunk carries the tokens that made it
                    job.put("logprobs", server_logprobs.entry(ev, pair.target.token_bytes))
                if ev.reasoning:
                    job.put("reasoning", ev.reasoning)
                    thought += len(ev.reasoning)
                if ev.text:
                    job.put("text", ev.text)
                    sent += len(ev.text)
        except LocalspecError as exc:
            error = _library_error(exc, req.chat)
            self._bump("failed" if error.status >= 500 else "refused")
            job.put("error", error)
            return
        except Exception as exc:  # a bug: answer 500 and keep serving
            self._bump("failed")
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
        self._bump("completed")
        self.totals.generated(result.stats)
        job.put("done", result)
