"""Anthropic's Messages routes: ``POST /v1/messages`` (also ``?beta=true``) and ``POST
/v1/messages/count_tokens``.

A body is translated into the server's request (``anthropic.requests``), admitted to the worker and
answered by the relay in Anthropic's shapes (``anthropic.replies``); errors are Anthropic's error object. A
count of a prompt's tokens is admitted to the same queue: it uses the models, which only the worker touches.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from ...api import Pair
from ...errors import LocalspecError
from ...images import image_messages, prompt_tokens
from ...runtime.vision import ImageError
from .. import relay
from ..generation import GenerationRequest, read_body
from ..http import ApiError
from ..request_log import note_error
from ..worker import Server
from .replies import MessageReply
from .requests import error_response, parse_messages


def register(app: FastAPI, server: Server) -> None:
    """Add the Messages routes to ``app``, generating (and counting) on ``server``'s worker."""

    @app.post("/v1/messages")
    async def messages(request: Request) -> Any:
        try:
            req = await read_body(request, lambda body: parse_messages(body, server.defaults, server.limits))
        except ApiError as exc:
            return error_response(note_error(request.scope, exc))
        return await relay.answer(server, request, req, MessageReply(server.name, req), error_response)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Any:
        try:
            req = await read_body(request, lambda body: parse_messages(body, server.defaults, server.limits, True))
        except ApiError as exc:
            return error_response(note_error(request.scope, exc))
        # The models are the worker's to use: counting waits its turn as a generation does, within the queue's
        # limit, and leaves the queue when its client goes away.
        return await relay.run_task(server, request, req, count, error_response,
                                    lambda n: {"input_tokens": n})


def count(pair: Pair, req: GenerationRequest) -> int:
    """The prompt tokens of a request, as its generation would render them (an image: the positions it takes)."""
    assert req.messages is not None
    tools = [t.to_openai() for t in req.tools.tools] if req.tools and req.tools.choice != "none" else ()
    try:
        messages, images = image_messages(pair.target, req.messages)
        text = pair.format_chat(messages, tools=tools)
        return len(prompt_tokens(pair.target, text, images))
    except ImageError as exc:  # an image the projector cannot read
        raise ApiError(400, str(exc)) from None
    except LocalspecError as exc:  # the template refuses the conversation: the request is at fault
        raise ApiError(400, f"The chat template cannot render these messages: {exc}") from None
