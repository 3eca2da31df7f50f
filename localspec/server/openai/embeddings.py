"""OpenAI's embeddings route: ``POST /v1/embeddings``, on the embedding model the server loaded beside its pair.

``input`` is a string, a list of strings, a list of token ids or a list of such lists; ``encoding_format``
``float`` (numbers) or ``base64`` (the vector's little-endian float32 bytes, which the ``openai`` package asks
for by default); ``dimensions`` keeps the first numbers of each vector, normalised again. Vectors have length
1. Errors are OpenAI's error object.
"""

from __future__ import annotations

import base64
from typing import Any, Literal, Optional, Union

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict

from ..embedding import EmbeddingService
from ..generation import parse_model, read_body
from ..http import ApiError
from ..request_log import note_error


class EmbeddingsBody(BaseModel):
    """The fields OpenAI's embeddings request has. Other fields are ignored: clients of other servers send
    their own (``input_type``, ``task``, ``normalized``), which change nothing here."""

    model_config = ConfigDict(extra="ignore", strict=True)

    input: Union[str, list[str], list[int], list[list[int]]]
    model: Optional[str] = None
    encoding_format: Optional[Literal["float", "base64"]] = None
    dimensions: Optional[int] = None
    user: Optional[str] = None


def register(app: FastAPI, service: EmbeddingService) -> None:
    """Add ``POST /v1/embeddings`` to ``app``, answered by ``service``'s embedding model."""

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Any:
        try:
            body = await read_body(request, lambda raw: parse_model(raw, EmbeddingsBody))
            model = service.embedder_for(body.model)
            got = await service.embed(model, body.input, dimensions=body.dimensions)
        except ApiError as exc:
            return note_error(request.scope, exc).response()
        data = [{"object": "embedding", "index": i, "embedding": _encoded(row, body.encoding_format or "float")}
                for i, row in enumerate(got.rows)]
        return {"object": "list", "data": data, "model": model.name,
                "usage": {"prompt_tokens": got.tokens, "total_tokens": got.tokens}}


def _encoded(row: Any, encoding: str) -> Union[list[float], str]:
    """A vector as numbers, or as base64 of its little-endian float32 bytes."""
    if encoding == "base64":
        return base64.b64encode(row.astype("<f4").tobytes()).decode("ascii")
    return [float(x) for x in row]
