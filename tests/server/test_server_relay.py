"""The relay between a job's events and an API's reply: a stream starts once the prompt is known and pings
while its first token is awaited; an error before the stream is an error response; a leaving client
abandons the job."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace
from typing import Optional

from localspec.options import GenerationOptions
from localspec.server import relay as server_relay
from localspec.server.anthropic.replies import MessageReply
from localspec.server.anthropic.requests import error_response
from localspec.server.generation import GenerationRequest
from localspec.server.http import ApiError

REQUEST = GenerationRequest(True, [], None, GenerationOptions(), True, False)


class FakeServer:
    """Admits the one job it was given; counts how often it was given up."""

    def __init__(self, job) -> None:
        self.job, self.jobs, self.abandoned = job, [job], 0

    def admit(self, request, task=None):
        return self.job

    def abandon(self, job) -> None:
        self.abandoned += 1


class Connected:
    """A client that stays (its request's scope holds no log entry)."""

    scope: dict = {}

    async def is_disconnected(self) -> bool:
        return False


def _job(prompt_tokens: int = 7, cached: Optional[int] = 3):
    return SimpleNamespace(events=asyncio.Queue(), cancelled=threading.Event(), checked=time.monotonic(),
                           stream=SimpleNamespace(prompt_tokens=prompt_tokens, cached_prompt_tokens=cached))


def _reply() -> MessageReply:
    return MessageReply("m", REQUEST)


async def _collect(response) -> list[str]:
    return [piece async for piece in response.body_iterator]


def test_a_slow_first_token_gets_message_start_at_once_then_pings(monkeypatch):
    monkeypatch.setattr(server_relay, "FIRST_SECONDS", 0.01)
    monkeypatch.setattr(server_relay, "PING_SECONDS", 0.02)

    async def run() -> list[str]:
        job = _job(7)
        server = FakeServer(job)

        async def later() -> None:
            await asyncio.sleep(0.15)  # the prompt being processed
            job.events.put_nowait(("error", ApiError(500, "boom", type="server_error")))

        task = asyncio.ensure_future(later())
        response = await server_relay.answer(server, Connected(), REQUEST, _reply(), error_response)
        pieces = await _collect(response)
        await task
        assert server.abandoned >= 1  # the job is given up once the stream ends
        return pieces

    pieces = asyncio.run(run())
    names = [p.split("\n", 1)[0].removeprefix("event: ") for p in pieces]
    assert names[0] == "message_start"  # Anthropic's count: the prompt less what the cache gave, given apart
    assert '"input_tokens": 4' in pieces[0] and '"cache_read_input_tokens": 3' in pieces[0]
    assert names.count("ping") >= 3 and names[-1] == "error"


def test_an_error_before_the_stream_is_an_error_response():
    async def run():
        job = _job()
        job.events.put_nowait(("error", ApiError(400, "too long", code="context_length_exceeded")))
        return await server_relay.answer(FakeServer(job), Connected(), REQUEST, _reply(), error_response)

    response = asyncio.run(run())
    assert response.status_code == 400 and b"prompt is too long" in response.body


def test_message_start_waits_for_the_part_of_the_prompt_the_cache_gives(monkeypatch):
    """Anthropic counts cached tokens apart from input_tokens: message_start gives both, as message_delta does."""
    monkeypatch.setattr(server_relay, "FIRST_SECONDS", 0.01)

    async def run() -> list[str]:
        job = _job(7, cached=None)
        server = FakeServer(job)

        async def later() -> None:
            await asyncio.sleep(0.1)  # the prompt cache being looked in
            job.stream.cached_prompt_tokens = 5
            await asyncio.sleep(0.1)
            job.events.put_nowait(("error", ApiError(500, "boom", type="server_error")))

        task = asyncio.ensure_future(later())
        response = await server_relay.answer(server, Connected(), REQUEST, _reply(), error_response)
        pieces = await _collect(response)
        await task
        return pieces

    start = asyncio.run(run())[0]
    assert start.startswith("event: message_start")
    assert '"input_tokens": 2' in start and '"cache_read_input_tokens": 5' in start


class Refusing(FakeServer):
    def admit(self, request, task=None):
        raise ApiError(503, "busy", type="server_error", code="server_busy", headers={"Retry-After": "5"})


def test_a_full_queue_is_answered_in_the_routes_shape():
    response = asyncio.run(server_relay.answer(Refusing(_job()), Connected(), REQUEST, _reply(), error_response))
    assert response.status_code == 529 and b"overloaded_error" in response.body  # Anthropic's, by its renderer
    assert response.headers["Retry-After"] == "5"


def test_a_whole_answer_whose_client_left_is_499_on_every_api():
    from localspec.server.ollama.replies import OllamaReply
    from localspec.server.ollama.replies import error_response as ollama_error
    from localspec.server.openai.replies import CompletionReply
    from localspec.server.responses.replies import ResponseReply
    from localspec.server.responses.requests import ResponsesBody
    from localspec.server.responses.requests import error_response as responses_error

    whole = GenerationRequest(True, [], None, GenerationOptions(), False, False)
    replies = [(CompletionReply("m", whole), ApiError.response), (MessageReply("m", whole), error_response),
               (ResponseReply("m", whole, ResponsesBody(input="x")), responses_error),
               (OllamaReply("m", True, time.monotonic()), ollama_error)]
    for reply, render in replies:
        job = _job()
        job.events.put_nowait(("text", "partial"))
        job.events.put_nowait(("done", None))  # cancelled: nobody is listening
        server = FakeServer(job)
        response = asyncio.run(server_relay.answer(server, Connected(), whole, reply, render))
        assert response.status_code == 499 and server.abandoned >= 1, reply
