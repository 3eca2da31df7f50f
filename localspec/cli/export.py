"""``localspec export``: the command that serves a pair on vLLM or llama-server."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from ..methods import DRAFT, HISTORY, K_LIMIT, LOOKUP, MTP
from .shared import friendly_errors


@click.command()
@click.argument("pair_name", metavar="[PAIR]", required=False)
@click.option("--target", "-t", type=click.Path(dir_okay=False), default=None, help="Target model (.gguf).")
@click.option("--draft", "-d", type=click.Path(dir_okay=False), default=None, help="Draft model (.gguf).")
@click.option("--to", "engine", type=click.Choice(["vllm", "llama-server"]), required=True,
              help="The serving engine to run the pair on.")
@click.option("--method", type=click.Choice(["auto", DRAFT.name, LOOKUP.name, HISTORY.name, MTP.name]),
              default="auto", show_default=True,
              help="Drafting method; auto: the best drafting row of --from-bench, else the draft model if there "
                   "is one, else the target's MTP head (llama-server) if it has one, else lookup.")
@click.option("--from-bench", "bench_file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="A `localspec bench --json` file of this pair: export the method and K that did best in it.")
@click.option("--k", type=click.IntRange(1, K_LIMIT), default=None, help="Tokens per draft (default: the pair's).")
@click.option("--ctx", type=click.IntRange(min=256), default=None, help="Context length (default: the pair's).")
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="Port (default: the engine's own).")
@click.option("--host", default=None, help="Address to listen on (default: 127.0.0.1 for llama-server, as "
              "`localspec serve`; 0.0.0.0 for vLLM).")
@click.option("--llama-server", "llama_server", type=click.Path(dir_okay=False, exists=True), default=None,
              help="The llama-server binary to write the flags for (default: the one on the PATH, else the "
                   "llama.cpp localspec runs).")
@click.option("--api-key-file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="A file holding the API key llama-server will demand (as `localspec serve --api-key`).")
@click.option("--target-repo", default=None, metavar="ORG/NAME",
              help="The Hugging Face repository the target GGUF was made from (for vLLM), if its header lacks it.")
@click.option("--draft-repo", default=None, metavar="ORG/NAME", help="The same for the draft.")
@friendly_errors
def export(pair_name: Optional[str], target: Optional[str], draft: Optional[str], engine: str, method: str,
           bench_file: Optional[str], k: Optional[int], ctx: Optional[int], port: Optional[int],
           host: Optional[str], llama_server: Optional[str], api_key_file: Optional[str],
           target_repo: Optional[str], draft_repo: Optional[str]) -> None:
    """Print the command that serves this pair on vLLM or llama-server, for more than one user."""
    from ..catalog.naming import resolve_models
    from ..export import commands as ex
    from ..export.llama_server_flags import find
    from ..options import LOOKUP_NGRAM

    if pair_name and target:
        raise click.UsageError("Give a pair name or --target/--draft, not both.")
    given = target or pair_name
    if not given:
        raise click.UsageError("Name a pair (see `localspec models`) or give --target (and --draft).")
    files = resolve_models(given, draft)
    pair_k, pair_ctx = files.draft_k, 4096 if files.n_ctx is None else files.n_ctx
    t = ex.served(files.target, target_repo, files.repos[0])
    d = ex.served(files.draft, draft_repo, files.repos[1]) if files.draft else None
    on_llama = engine == "llama-server"
    if api_key_file and not on_llama:
        raise click.UsageError("--api-key-file is written for llama-server; vLLM takes its key from --api-key or "
                               "the VLLM_API_KEY environment variable.")
    if method == "auto" and bench_file:
        runs = (DRAFT.name, LOOKUP.name, HISTORY.name) + ((MTP.name,) if on_llama else ())
        method, bench_k, speedup = ex.load_bench(Path(bench_file), runs)
        k = k or bench_k
        click.echo(f"# from {bench_file}: {method} with K={bench_k} did best ({speedup:.2f}x median over its "
                   "prompts on this machine)")
    elif method == "auto":
        method = DRAFT.name if d else MTP.name if on_llama and t.mtp_head else LOOKUP.name
    if method == DRAFT.name and d is None:
        raise click.UsageError("The draft method needs --draft (or a pair); choose --method lookup or history.")
    flags = find(llama_server) if on_llama else None
    key = Path(api_key_file).resolve() if api_key_file else None
    click.echo(ex.plan(engine, t, d, method, k or pair_k or 4, LOOKUP_NGRAM, ctx or pair_ctx, port, host, flags,
                       key).render())
