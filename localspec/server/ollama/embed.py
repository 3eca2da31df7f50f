"""Ollama's embedding routes: ``POST /api/embed`` (``input``: a text or texts; vectors of length 1) and the older
``POST /api/embeddings`` (``prompt``: one text; the vector as the model gives it), on the embedding model the
server loaded beside its pair. Ollama cuts an input longer than the model reads unless ``truncate`` is false;
so does this. Errors are Ollama's ``{"error": "..."}``.
"""

from __future__ import annotations

import time
from typing import Any, Optional, Union

from fastapi import FastAPI, Request

from ..embedding import EmbeddingService
from ..generation import parse_model, read_body
from ..http import ApiError
from ..request_log import note_error
from .replies import error_response
from .requests import StrictBody, tagged


class EmbedBody(StrictBody):
    model: Optional[str] = None
    input: Union[str, list[str]]
    truncate: Optional[bool] = None
    dimensions: Optional[int] = None
    keep_alive: Union[int, float, str, None] = None  # the model stays loaded as long as the server runs
    options: Optional[dict[str, Any]] = None  # load-time options: nothing to change on a loaded model


class EmbeddingsBody(StrictBody):
    model: Optional[str] = None
    prompt: str
    keep_alive: Union[int, float, str, None] = None
    options: Optional[dict[str, Any]] = None


def register(app: FastAPI, service: EmbeddingService) -> None:
    """Add ``/api/embed`` and ``/api/embeddings`` to ``app``, answered by ``service``'s embedding model."""

    @app.post("/api/embed")
    async def embed(request: Request) -> Any:
        started = time.monotonic()
        try:
            body = await read_body(request, lambda raw: parse_model(raw, EmbedBody))
            model = service.embedder_for(body.model)
            got = await service.embed(model, body.input, truncate=body.truncate is not False,
                                      dimensions=body.dimensions)
        except ApiError as exc:
            return error_response(note_error(request.scope, exc))
        return {"model": tagged(model.name), "embeddings": [[float(x) for x in row] for row in got.rows],
                "total_duration": int((time.monotonic() - started) * 1e9), "load_duration": 0,
                "prompt_eval_count": got.tokens}

    @app.post("/api/embeddings")
    async def embeddings(request: Request) -> Any:
        try:
            body = await read_body(request, lambda raw: parse_model(raw, EmbeddingsBody))
            model = service.embedder_for(body.model)
            got = await service.embed(model, body.prompt, normalize=False, truncate=True)
        except ApiError as exc:
            return error_response(note_error(request.scope, exc))
        return {"embedding": [float(x) for x in got.rows[0]]}
