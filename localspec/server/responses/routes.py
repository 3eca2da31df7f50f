"""OpenAI's Responses route: ``POST /v1/responses``.

A body is translated into the server's request (``responses.requests``), admitted to the worker and
answered by the relay as a ``response`` object or its typed events (``responses.replies``); errors are
OpenAI's error object, naming the Responses field at fault.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from .. import relay
from ..generation import read_body
from ..http import ApiError
from ..request_log import note_error
from ..worker import Server
from .replies import ResponseReply
from .requests import error_response, parse_responses


def register(app: FastAPI, server: Server) -> None:
    """Add the Responses route to ``app``, generating on ``server``'s worker."""

    @app.post("/v1/responses")
    async def responses(request: Request) -> Any:
        try:
            req, body = await read_body(request, lambda b: parse_responses(b, server.defaults, server.limits))
        except ApiError as exc:
            return error_response(note_error(request.scope, exc))
        return await relay.answer(server, request, req, ResponseReply(server.name, req, body), error_response)
