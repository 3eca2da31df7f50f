"""``localspec serve``'s HTTP application: one loaded pair behind OpenAI's, Anthropic's and Ollama's APIs.

Routes: OpenAI's ``POST /v1/chat/completions`` and ``POST /v1/completions`` (``openai.routes``),
``POST /v1/embeddings`` (``openai.embeddings``), Ollama's ``/api/embed`` (``ollama.embed``) and ``POST
/v1/rerank`` (``rerank.routes``), on the embedding model and reranker loaded beside the pair, and
``POST /v1/responses`` (``responses.routes``), Anthropic's ``POST /v1/messages`` and ``POST
/v1/messages/count_tokens`` (``anthropic.routes``), Ollama's ``/api/*`` and ``GET /`` (``ollama.routes``),
and here ``GET /health``, ``GET /v1/models`` (and ``/v1/models/{name}``, in OpenAI's or Anthropic's shape)
and, when asked for, ``GET /metrics``. Every request runs through ``Pair.stream`` with speculative decoding
(auto mode by default), so the output is the target model's own; every API's replies carry llama-server's
``timings`` and localspec's own ``localspec`` stats.

Every generation runs on the server's one worker (``worker``), relayed to its client by one relay
(``relay``), each API supplying only how it writes a generation and answers an error. Requests are checked
at two depths: the HTTP boundary (Host, Origin, API key, content type, body size) in ``http``, the JSON
body in each API's ``requests``. An error is answered in the shape of the API its path belongs to
(``error_shape``), whether a route, the guard or the router (an unknown path, a wrong method) refused it.

Needs the ``server`` extra (FastAPI, uvicorn); the rest of localspec does not.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware

from . import metrics as server_metrics
from .access import LOOPBACK_NAMES
from .anthropic import requests as anthropic_requests
from .anthropic import routes as anthropic_routes
from .anthropic.replies import model_object
from .embedding import EmbeddingService
from .http import ApiError, Guard, Render, Scope
from .ollama import embed as ollama_embed
from .ollama import replies as ollama_replies
from .ollama import routes as ollama_routes
from .openai import embeddings as openai_embeddings
from .openai import routes as openai_routes
from .request_log import RequestLog, note_error
from .rerank import routes as rerank_routes
from .responses import requests as responses_requests
from .responses import routes as responses_routes
from .worker import Server

#: The largest request body by default, in bytes (a full 32k-token context of text is about 130 kB).
MAX_BODY = 4 * 1024 * 1024
#: The largest request body by default where the model reads images (a few screenshots, base64, and the rest).
MAX_BODY_IMAGES = 64 * 1024 * 1024
#: The path both OpenAI's and Anthropic's clients read (the models, and one model by name).
MODELS_PATH = "/v1/models"
#: The path of OpenAI's Responses API.
RESPONSES_PATH = "/v1/responses"


def error_shape(scope: Scope) -> Render:
    """How an error is answered on a request's path: Ollama's ``{"error": ...}`` on ``/api/*``, Anthropic's
    error object on the Messages paths (and on the models' paths to a request naming ``anthropic-version``),
    OpenAI's error object (naming the Responses fields on ``/v1/responses``) anywhere else."""
    render = _render_for(scope)
    return lambda error: render(note_error(scope, error))  # the request's log line says it too


def _render_for(scope: Scope) -> Render:
    path = scope["path"]
    if path.startswith(ollama_routes.PREFIX):
        return ollama_replies.error_response
    models = path == MODELS_PATH or path.startswith(MODELS_PATH + "/")
    if path.startswith(anthropic_requests.PREFIX) or (models and anthropic_requests.from_anthropic(
            Headers(scope=scope))):
        return anthropic_requests.error_response
    if path == RESPONSES_PATH:
        return responses_requests.error_response
    return ApiError.response


def _openai_model(name: str, created: int) -> dict[str, Any]:
    """A model as OpenAI's API describes one."""
    return {"id": name, "object": "model", "created": created, "owned_by": "localspec"}


def create_app(server: Server, *, hosts: Sequence[str] = LOOPBACK_NAMES, origins: Sequence[str] = (),
               api_key: Optional[str] = None, max_body: Optional[int] = None, metrics: bool = False,
               log: Optional[Callable[[str], None]] = None, verbose_log: bool = False,
               embeddings: Optional[EmbeddingService] = None) -> FastAPI:
    """The FastAPI application serving ``server``'s pair.

    Args:
        server: the pair and its worker.
        hosts: the Host names accepted (loopback names for a loopback bind; empty: any).
        origins: the web page origins allowed to call the API (``"*"``: any), with CORS headers for them.
        api_key: if set, every request but ``/health`` needs it (``Authorization: Bearer KEY`` or ``x-api-key``).
        max_body: the largest request body in bytes (default: ``MAX_BODY``, ``MAX_BODY_IMAGES`` where the model
            reads images).
        metrics: serve ``GET /metrics`` (Prometheus' text format; behind the API key like the rest).
        log: where a line about each request goes (``request_log``); None for no lines.
        verbose_log: the lines show the start of each prompt.
        embeddings: the embedding model and reranker loaded beside the pair (their routes answer 400 without).
    """
    app = FastAPI(title="localspec", docs_url=None, redoc_url=None, openapi_url=None)
    beside = embeddings or EmbeddingService()
    _errors(app)
    _own_routes(app, server, beside)
    openai_routes.register(app, server)
    openai_embeddings.register(app, beside)
    ollama_embed.register(app, beside)
    rerank_routes.register(app, beside)
    responses_routes.register(app, server)
    anthropic_routes.register(app, server)
    ollama_routes.register(app, server, beside.names)  # Ollama's API, for the apps that speak only it
    if origins:  # CORS headers (and preflight answers) for the allowed pages only
        # Any request header: the SDKs' own (x-api-key, anthropic-version, x-stainless-*) change between releases,
        # and only pages the operator named get this far.
        app.add_middleware(CORSMiddleware, allow_origins=list(origins), allow_methods=["GET", "POST"],
                           allow_headers=["*"])
    if max_body is None:
        max_body = MAX_BODY_IMAGES if server.limits.vision else MAX_BODY
    app.add_middleware(Guard, hosts=hosts, origins=origins, api_key=api_key, max_body=max_body, shape=error_shape)
    if metrics:
        _metrics(app, server)
    if log is not None:  # outermost, so the guards' refusals have their lines too
        app.add_middleware(RequestLog, say=log, verbose=verbose_log)
    return app


def _errors(app: FastAPI) -> None:
    """Answer what no route answers (an unknown path, a wrong method, a failure) in its path's API's shape."""

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
        return error_shape(request.scope)(ApiError(exc.status_code, f"{request.method} {request.scope['path']}: "
                                                   f"{exc.detail}.", type=kind))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        found = [str(e.get("msg", "")) for e in exc.errors()]
        return error_shape(request.scope)(ApiError(422, f"{request.method} {request.scope['path']}: "
                                                   f"{found[0] if found else 'invalid request'}."))

    @app.exception_handler(Exception)
    async def failed(request: Request, exc: Exception) -> Response:  # a bug: the server keeps serving
        return error_shape(request.scope)(ApiError(500, f"The request failed: {exc!r}.", type="server_error"))


def _own_routes(app: FastAPI, server: Server, beside: EmbeddingService) -> None:
    """``/health``, and the models in OpenAI's or Anthropic's shape (the embedding models' too)."""

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> dict[str, Any]:
        running, queued = server.occupancy()
        return {"status": "stopping" if server.stopping else "ok", "model": server.name,
                "running": running, "queued": queued, "generations": dict(server.counts)}

    @app.get(MODELS_PATH)
    async def models(request: Request) -> dict[str, Any]:
        names = (*server.limits.models, *beside.names)
        if anthropic_requests.from_anthropic(request.headers):  # Anthropic's SDK lists models in its own shape
            return {"data": [model_object(n, server.created) for n in names], "has_more": False,
                    "first_id": names[0] if names else None, "last_id": names[-1] if names else None}
        return {"object": "list", "data": [_openai_model(n, server.created) for n in names]}

    @app.get(MODELS_PATH + "/{name:path}")
    async def model(name: str, request: Request) -> Any:
        if not name:  # /v1/models/ is the list
            return await models(request)
        if not server.limits.serves(name) and name not in beside.names:
            return error_shape(request.scope)(ApiError(
                404, f"The model {name!r} does not exist; this server has "
                     f"{', '.join((*server.limits.models, *beside.names))}.",
                param="model", code="model_not_found"))
        if anthropic_requests.from_anthropic(request.headers):
            return model_object(name, server.created)
        return _openai_model(name, server.created)


def _metrics(app: FastAPI, server: Server) -> None:
    """``GET /metrics``, and the count of every request answered (the guards' refusals too)."""
    registry = server_metrics.registry(server.totals, lambda: dict(server.counts), server.occupancy,
                                       lambda: (server.room_waits, server.set_aside))

    @app.get("/metrics")
    async def scrape() -> Response:
        return Response(server_metrics.render(registry), media_type=server_metrics.CONTENT_TYPE)

    routes = frozenset(getattr(route, "path", "") for route in app.routes)
    # Outermost, so the guards' refusals are counted too.
    app.add_middleware(server_metrics.CountRequests, totals=server.totals, routes=routes)
