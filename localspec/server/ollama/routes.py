"""Ollama's routes on ``localspec serve``, for the apps that speak only its API.

``GET /`` ("Ollama is running"), ``GET /api/version``, ``GET /api/tags``, ``POST /api/show``,
``GET /api/ps``, ``POST /api/chat`` and ``POST /api/generate``, streamed as newline-delimited JSON unless
a request says ``"stream": false``. A request is translated into the server's one request type
(``ollama.requests``), admitted to the worker and answered by the relay in Ollama's shapes
(``ollama.replies``), behind the same guards as the other APIs. Errors are Ollama's ``{"error": "..."}``.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse

from ...reasoning.template import model_reasoning
from ...runtime.gguf_metadata import read_local
from ...structured.tool_use import can_call
from .. import relay
from ..generation import GenerationRequest, read_body
from ..generation import parse_model as parse
from ..http import ApiError
from ..request_log import note_error
from ..worker import Server
from .replies import OllamaReply, error_response, rfc3339
from .requests import ChatBody, GenerateBody, ShowBody, chat_request, generate_request, model_name, tagged

#: The Ollama version reported: apps check it (VS Code's Ollama provider wants at least 0.6.4).
VERSION = "0.12.0"
#: The paths answered in Ollama's shapes.
PREFIX = "/api/"


@dataclass(frozen=True)
class ModelCard:
    """What Ollama's listing routes say of the served model, read once from its file and template."""

    name: str
    size: int
    modified_at: str
    digest: str
    details: dict[str, Any]
    model_info: dict[str, Any]
    capabilities: list[str]
    template: str
    n_ctx: int

    @classmethod
    def of(cls, server: Server) -> ModelCard:
        """The card of ``server``'s target model (read before the server answers its first request)."""
        target = server.pair.target
        header = read_local(target.path)
        stat = target.path.stat()
        arch = header.architecture or "unknown"
        details = {"parent_model": "", "format": "gguf", "family": arch, "families": [arch],
                   "parameter_size": header.size_label or "", "quantization_level": header.quantization or ""}
        info = {k: v for k, v in header.metadata.items()
                if isinstance(v, (str, int, float, bool)) and not k.startswith("tokenizer.")}
        info.setdefault("general.parameter_count", header.parameters or 0)
        template = target.chat_template() or ""
        # Not the file's own hash (that would read gigabytes at start): a name for this file as it is now.
        identity = f"{target.path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()
        return cls(tagged(server.name), stat.st_size, rfc3339(stat.st_mtime),
                   hashlib.sha256(identity).hexdigest(), details, info, _capabilities(server), template,
                   target.n_ctx)

    def listed(self) -> dict[str, Any]:
        """The model as ``/api/tags`` lists it."""
        return {"name": self.name, "model": self.name, "modified_at": self.modified_at, "size": self.size,
                "digest": self.digest, "details": self.details}


def _capabilities(server: Server) -> list[str]:
    """``completion``; ``tools`` where the template writes calls as localspec reads them; ``insert`` for a
    fill-in-the-middle model; ``thinking`` for a reasoning model; ``vision`` where it reads images."""
    target = server.pair.target
    found = ["completion"]
    if can_call(target):
        found.append("tools")
    if target.fim_tokens() is not None:
        found.append("insert")
    if model_reasoning(target) is not None:
        found.append("thinking")
    if server.limits.vision:
        found.append("vision")
    return found


def register(app: FastAPI, server: Server, beside: tuple[str, ...] = ()) -> None:
    """Add Ollama's routes to ``app``, generating on ``server``'s worker (``beside``: the embedding models loaded
    beside the pair, listed too)."""
    card = ModelCard.of(server)

    @app.api_route("/", methods=["GET", "HEAD"])
    async def root() -> PlainTextResponse:
        return PlainTextResponse("Ollama is running")

    @app.get("/api/version")
    async def version() -> dict[str, Any]:
        return {"version": VERSION}

    @app.get("/api/tags")
    async def tags() -> dict[str, Any]:
        return {"models": [card.listed(), *(_embedding_listed(name, card) for name in beside)]}

    @app.get("/api/ps")
    async def ps() -> dict[str, Any]:
        return {"models": [{**card.listed(), "expires_at": "2318-01-01T00:00:00Z", "size_vram": 0,
                            "context_length": card.n_ctx}]}

    @app.post("/api/show")
    async def show(request: Request) -> Any:
        try:
            body = await read_body(request, lambda raw: parse(raw, ShowBody))
            model_name(body.model or body.name, server.limits)
        except ApiError as exc:
            return error_response(note_error(request.scope, exc))
        return {"license": str(card.model_info.get("general.license", "")), "modelfile": "",
                "parameters": f"num_ctx {card.n_ctx}", "template": card.template, "details": card.details,
                "model_info": card.model_info, "capabilities": card.capabilities, "modified_at": card.modified_at}

    @app.post("/api/chat")
    async def chat(request: Request) -> Any:
        return await _answer(server, request, chat=True)

    @app.post("/api/generate")
    async def generate(request: Request) -> Any:
        return await _answer(server, request, chat=False)


def _embedding_listed(name: str, card: ModelCard) -> dict[str, Any]:
    """An embedding model as ``/api/tags`` lists it (its file is not read: the apps look for its name)."""
    return {"name": tagged(name), "model": tagged(name), "modified_at": card.modified_at, "size": 0,
            "digest": "", "details": {"format": "gguf", "family": "embedding"}}


def _request(raw: Any, server: Server, chat: bool) -> Optional[GenerationRequest]:
    if chat:
        return chat_request(parse(raw, ChatBody), server.defaults, server.limits)
    return generate_request(parse(raw, GenerateBody), server.defaults, server.limits)


async def _answer(server: Server, request: Request, chat: bool) -> Any:
    """Check the body, and answer it: at once for a request with nothing to generate, else by the relay."""
    started = time.monotonic()
    try:
        req = await read_body(request, lambda raw: _request(raw, server, chat))
    except ApiError as exc:
        return error_response(note_error(request.scope, exc))
    if req is None:  # Ollama's way to load a model: nothing to generate
        return OllamaReply(server.name, chat, started).loaded()
    return await relay.answer(server, request, req, OllamaReply(server.name, chat, started), error_response)
