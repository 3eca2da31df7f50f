"""``localspec serve``: the pair behind an HTTP server speaking OpenAI's chat completions, completions and
Responses, Anthropic's Messages and Ollama's API."""

from __future__ import annotations

import contextlib
import functools
from typing import Optional

import click

from ..options import GenerationOptions
from .shared import ModelArgs, friendly_errors, generation_options, model_options, say


@click.command()
@model_options
@generation_options(helps={"max_tokens": "Most tokens a request may generate, and the default for requests that "
                                          "leave it out (default: no cap, a request may fill the context)."})
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; anything but loopback needs --api-key.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="Port (0: any free one).")
@click.option("--api-key", envvar="LOCALSPEC_API_KEY", default=None,
              help="Require 'Authorization: Bearer KEY' on every request but /health (or set LOCALSPEC_API_KEY).")
@click.option("--parallel", type=click.IntRange(0, 64), default=0, show_default=True,
              help="Requests decoded together, each speculating on its own, their tokens in one batch per step; "
                   "0: automatic (4). They share --ctx: size it for the prompts and replies that run at once "
                   "(a request that does not fit beside the others waits, it never fails); on a CPU with a context "
                   "below 16384, add --flash-attn on so that each request skips the others' cells.")
@click.option("--max-queue", type=click.IntRange(0, 1000), default=8, show_default=True,
              help="Requests that may wait while the others generate; more get 503.")
@click.option("--allow-origin", "origins", multiple=True, metavar="ORIGIN",
              help="A web page origin (e.g. http://localhost:3000) allowed to call the API from a browser; "
                   "repeatable, '*' for any page. Without it, requests that carry an Origin get 403.")
@click.option("--max-body", type=click.IntRange(1024), default=None,
              help="The largest request body in bytes (default: 4 MiB, or 64 MiB where the model reads images, "
                   "since a screenshot in base64 can outgrow 4 MiB); larger ones get 413.")
@click.option("--allow-fetch", is_flag=True,
              help="Fetch images that requests give as http(s) URLs (up to 20 MiB each, from public addresses "
                   "only); without it such an image gets 400, and images come inline as base64.")
@click.option("--fetch-private", is_flag=True,
              help="With --allow-fetch: also from loopback and private addresses (an image server on this "
                   "machine or network; allow it only for clients you trust).")
@click.option("--keep-billing-header", is_flag=True,
              help="Keep Claude Code's x-anthropic-billing-header block in the system prompt (by default it is "
                   "dropped: its per-request hash would keep the prompt cache from reusing any of the prompt).")
@click.option("--metrics", is_flag=True,
              help="Serve GET /metrics: requests, tokens, prompt tokens the cache saved, acceptance by drafter and "
                   "the queue, in Prometheus' text format (behind --api-key like every route).")
@click.option("--embedding-model", default=None, metavar="NAME_OR_PATH",
              help="An embedding model (a catalog name such as nomic-embed-text-v1.5, a .gguf, or ollama:NAME) to "
                   "load beside the pair: POST /v1/embeddings, /api/embed and /api/embeddings answer with it.")
@click.option("--rerank-model", default=None, metavar="NAME_OR_PATH",
              help="A reranker (a .gguf with rank pooling, such as bge-reranker-v2-m3) to load beside the pair: "
                   "POST /v1/rerank answers with it.")
@click.option("--quiet", "-q", is_flag=True,
              help="No line per request (by default each request leaves one on stderr: its route, status, "
                   "prompt tokens read and restored, tokens generated and accepted, times, and how it ended; "
                   "--verbose adds the start of each prompt).")
@friendly_errors
def serve(models: ModelArgs, options: GenerationOptions, host: str, port: int, api_key: Optional[str],
          parallel: int, max_queue: int, origins: tuple[str, ...], max_body: Optional[int], allow_fetch: bool,
          fetch_private: bool,
          keep_billing_header: bool, metrics: bool, embedding_model: Optional[str], rerank_model: Optional[str],
          quiet: bool) -> None:
    """Serve the pair over HTTP: OpenAI chat completions, completions and Responses, Anthropic Messages, Ollama.

    The generation options given here are the defaults for requests that
    leave them out; --max-tokens also caps what a request may ask for (without
    it, a request may fill the context). --no-history keeps every request out
    of the history store, whatever the request says. Without --ctx the context
    is the largest the model was trained for that fits the memory (agents send
    tens of thousands of tokens), said at start.
    """
    from ..server.access import check_access

    access = check_access(host, api_key, origins)
    try:
        from ..embeddings import load_embedding
        from ..images import fetch_url
        from ..server.app import create_app
        from ..server.embedding import EmbeddingService
        from ..server.runner import run
        from ..server.worker import Server
    except ImportError as exc:
        raise click.ClickException(f"localspec serve needs the server extra ({exc.name} is missing): run "
                                   "`bash scripts/install.sh server,structured` in the localspec checkout, or "
                                   "`pip install fastapi uvicorn pydantic prometheus-client`.") from None
    source = click.get_current_context().get_parameter_source("max_tokens")
    max_tokens = options.max_tokens if source is not click.core.ParameterSource.DEFAULT else None
    with contextlib.ExitStack() as stack:
        embedder, reranker = (None if spec is None else stack.enter_context(load_embedding(
            spec, n_threads=models.n_threads_batch or models.n_threads, n_gpu_layers=models.n_gpu_layers,
            verbose=models.verbose)) for spec in (embedding_model, rerank_model))  # first: fit sees their memory
        for flag, loaded, reranks in (("--embedding-model", embedder, False), ("--rerank-model", reranker, True)):
            if loaded is not None and loaded.is_reranker != reranks:
                what, other = ("a reranker", "--rerank-model") if loaded.is_reranker else \
                    ("an embedding model", "--embedding-model")
                raise click.UsageError(f"{loaded.name} is {what}; give it with {other}, not {flag}.")
        beside = EmbeddingService(embedder, reranker)
        stack.callback(beside.close)
        pair = stack.enter_context(models.open(fit=True, parallel=parallel or None))
        name = models.pair_name or pair.target.path.stem
        if fetch_private and not allow_fetch:
            raise click.UsageError("--fetch-private widens --allow-fetch; give both.")
        if allow_fetch:  # read on each request's thread, before it is queued
            pair.fetch = functools.partial(fetch_url, private=True) if fetch_private else fetch_url
        server = Server.for_pair(pair, name, options, max_queue=max_queue, max_tokens=max_tokens,
                                 keep_billing_header=keep_billing_header)
        app = create_app(server, hosts=access.hosts, origins=access.origins, api_key=access.api_key,
                         max_body=max_body, metrics=metrics,
                         log=None if quiet else say, verbose_log=models.verbose, embeddings=beside)
        for kind, loaded in (("embedding model", embedder), ("reranker", reranker)):
            if loaded is not None:
                say(f"localspec serve: {kind} {loaded.name!r} ({loaded.pooling} pooling, up to {loaded.n_ctx} "
                    "tokens an input) beside the pair")
        say(f"localspec serve: model {name!r} on http://{host}:{port}/v1 "
            f"({'API key required' if api_key else 'no API key'}; history "
            f"{'recorded' if server.limits.history else 'off'}; "
            f"{pair.cache.describe() if pair.cache is not None else 'no prompt cache'}; "
            f"{server.parallel} request{'s' if server.parallel > 1 else ''} at once"
            f"{'; images' + (', fetched from URLs too' if allow_fetch else '') if server.limits.vision else ''}); "
            "Ctrl-C stops")
        run(server, app, host, port)

