"""The rerank route: ``POST /v1/rerank`` and ``POST /rerank`` in the shape llama-server, Jina and Cohere use,
on the reranker the server loaded beside its pair.

A body gives a ``query`` and ``documents`` (strings, or objects with a ``text``), optionally ``top_n`` and
``return_documents``; the answer lists ``results`` by ``relevance_score``, the highest first, each with its
document's ``index`` in the request. A query and document longer than the reranker reads are cut. Errors are
OpenAI's error object, as llama-server's.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict

from ..embedding import EmbeddingService
from ..generation import parse_model, read_body
from ..http import ApiError
from ..request_log import note_error


class Document(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    text: str


class RerankBody(BaseModel):
    """The fields a rerank request has. Other fields are ignored: Jina's and Cohere's clients send their own
    (``max_tokens_per_doc``, ``rank_fields``), which change nothing here."""

    model_config = ConfigDict(extra="ignore", strict=True)

    query: str
    documents: list[Union[str, Document]]
    model: Optional[str] = None
    top_n: Optional[int] = None
    return_documents: Optional[bool] = None


def register(app: FastAPI, service: EmbeddingService) -> None:
    """Add the rerank routes to ``app``, answered by ``service``'s reranker."""

    async def rerank(request: Request) -> Any:
        try:
            body = await read_body(request, lambda raw: parse_model(raw, RerankBody))
            if body.top_n is not None and body.top_n < 1:
                raise ApiError(400, f"'top_n' must be at least 1, got {body.top_n}.", param="top_n")
            model = service.reranker_for(body.model)
            texts = [d if isinstance(d, str) else d.text for d in body.documents]
            got = await service.rank(model, body.query, texts)
        except ApiError as exc:
            return note_error(request.scope, exc).response()
        order = sorted(range(len(texts)), key=lambda i: -float(got.rows[i]))[: body.top_n]
        results = [{"index": i, "relevance_score": float(got.rows[i]),
                    **({"document": {"text": texts[i]}} if body.return_documents else {})} for i in order]
        return {"object": "list", "model": model.name, "results": results,
                "usage": {"prompt_tokens": got.tokens, "total_tokens": got.tokens}}

    app.post("/v1/rerank")(rerank)
    app.post("/rerank")(rerank)
