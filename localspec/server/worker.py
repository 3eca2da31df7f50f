"""The server's generation workers: admitted requests (``Job``), their queue, and their events.

A pair loaded with N sequences (``serve --parallel``) runs up to N generations
at once, each on a worker thread of its own and a lane of the pair (its own
sequence of each model's context), their decode calls batched into one step;
further requests wait in a bounded queue and get 503 with ``Retry-After`` once
it is full. A job's events (its text, reasoning and
token log-probabilities as they come, then its end or an error) go back to the
event loop, where the relay (``server.relay``) writes them to the client in its
API's shape. A client that goes away, streaming or not, cancels its generation
at the next token, or leaves the queue if it was still waiting; ``stop``
cancels every generation when the process ends. Closing a stream leaves both
caches consistent, so the next request is exact. A growing conversation reuses
the cached prefix and only processes its new tokens.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
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


@dataclass(eq=False)  # compared (and hashed) by identity: the server keeps a set of them
class Job:
    """One admitted request: its stream's events come back through ``events`` (a task's: its value, or an
    error)."""

    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    task: Optional[Task] = None  # run instead of a generation; "done" carries what it returns
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    future: Optional[concurrent.futures.Future] = None  # its place on the worker, while it waits or runs
    stream: Optional[Stream] = None  # once the worker has started it
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
    """The pair, its generation workers, and the admitted jobs.

    A pair loaded with several sequences (``parallel``) runs as many requests at once, each on its own lane
    (``Pair.lanes``), their decode calls batched together; the rest wait in line.

    Args:
        pair: the loaded models (used from the worker threads only).
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
        self.limits = Limits((name,), max_tokens, history, keep_billing_header)
        self.max_queue = max_queue
        #: Requests that run at once: the pair's sequences.
        self.parallel = pair.lanes.width
        self.worker = concurrent.futures.ThreadPoolExecutor(max_workers=self.parallel,
                                                            thread_name_prefix="localspec-generate")
        self.batcher: Optional[StepBatcher] = None
        if self.parallel > 1:  # every lane's decode calls go together, from the first request to the last
            self.batcher = StepBatcher()
            pair.lanes.attach(self.batcher)
        self.jobs: set[Job] = set()  # running + waiting; only touched on the event loop's thread
        #: Generations by outcome; "refused": the request was at fault (a 4xx found on the worker), "failed": 5xx.
        self.counts = {"completed": 0, "cancelled": 0, "refused": 0, "failed": 0}
        self._counting = threading.Lock()  # the workers count at once
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
        # Measured now, not in the first requests (and never in a lane while others run), on the worker thread
        # that will generate (a batcher's decodes go to its own thread): llama.cpp's OpenMP threads belong to
        # the thread that calls it, and a second team left over from another thread slowed every later batch
        # by a fifth.
        server.worker.submit(pair.choose_threads).result()
        if REGISTRY.get(defaults.method).adaptive or server.parallel > 1:
            server.worker.submit(pair.calibrate).result()
        if server.batcher is not None:  # again, now that the costs that size its prompt chunks are known
            pair.lanes.attach(server.batcher)
        return server

    @property
    def name(self) -> str:
        return self.limits.models[0]

    def occupancy(self) -> tuple[int, int]:
        """(running, waiting): the generations on the workers (up to ``parallel``) and the requests queued."""
        return min(len(self.jobs), self.parallel), max(0, len(self.jobs) - self.parallel)

    def close(self) -> None:
        """Wait for the workers to finish what they run (queued requests are dropped), then stop batching."""
        self.worker.shutdown(wait=True, cancel_futures=True)
        if self.batcher is not None:
            self.pair.lanes.attach(None)
            self.batcher.close()

    def admit(self, request: GenerationRequest, task: Optional[Task] = None) -> Job:
        """Queue a generation on the worker, or ``task`` (which uses the pair too), behind the same limit
        (called on the event loop's thread).

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

    def _bump(self, outcome: str) -> None:
        with self._counting:
            self.counts[outcome] += 1

    def _count(self, job: Job, outcome: str) -> None:
        """Count a generation's outcome (a task is not a generation)."""
        if job.task is None:
            self._bump(outcome)

    def generate(self, job: Job) -> None:
        """Run one job on a worker thread, on a free lane, sending events back to the loop."""
        try:
            if job.task is not None:
                self._run_task(job)
            else:
                seq = self.pair.lanes.acquire(job.cancelled)  # never waits: a worker holds at most one lane
                try:
                    self._generate(job, self.pair if seq == 0 else self.pair.lanes.lane(seq))
                finally:
                    self.pair.lanes.release(seq)
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
            # it decodes with the other lanes from here (its setup above held none of their steps back)
            with self.batcher.member() if self.batcher is not None else contextlib.nullcontext():
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
