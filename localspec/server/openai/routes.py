"""OpenAI's chat completions and completions routes: ``POST /v1/chat/completions`` and ``POST /v1/completions``.

A body is checked into the server's request (``openai.requests``), admitted to the worker and answered
by the relay, whole or as server-sent events in OpenAI's chunk format ending with ``data: [DONE]``
(``openai.replies``); errors are OpenAI's error object.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from .. import relay
from ..generation import read_body
from ..http import ApiError
from ..request_log import note_error
from ..worker import Server
from .replies import CompletionReply
from .requests import parse_request


def register(app: FastAPI, server: Server) -> None:
    """Add the chat completions and completions routes to ``app``, generating on ``server``'s worker."""

    async def complete(request: Request, chat: bool) -> Any:
        try:
            req = await read_body(request, lambda body: parse_request(body, chat, server.defaults, server.limits))
        except ApiError as exc:
            return note_error(request.scope, exc).response()
        return await relay.answer(server, request, req, CompletionReply(server.name, req), ApiError.response)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await complete(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await complete(request, chat=False)
