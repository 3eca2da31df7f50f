"""``localspec export``: the command that serves a pair on vLLM or llama-server."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from ..methods import DRAFT, HISTORY, K_LIMIT, LOOKUP
from .shared import friendly_errors


@click.command()
@click.argument("pair_name", metavar="[PAIR]", required=False)
@click.option("--target", "-t", type=click.Path(dir_okay=False), default=None, help="Target model (.gguf).")
@click.option("--draft", "-d", type=click.Path(dir_okay=False), default=None, help="Draft model (.gguf).")
@click.option("--to", "engine", type=click.Choice(["vllm", "llama-server"]), required=True,
              help="The serving engine to run the pair on.")
@click.option("--method", type=click.Choice(["auto", DRAFT.name, LOOKUP.name, HISTORY.name]), default="auto",
              show_default=True,
              help="Drafting method; auto: the best drafting row of --from-bench, else the draft model if there "
                   "is one, else lookup.")
@click.option("--from-bench", "bench_file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="A `localspec bench --json` file of this pair: export the method and K that did best in it.")
@click.option("--k", type=click.IntRange(1, K_LIMIT), default=None, help="Tokens per draft (default: the pair's).")
@click.option("--ctx", type=click.IntRange(min=256), default=None, help="Context length (default: the pair's).")
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="Port (default: the engine's own).")
@click.option("--target-repo", default=None, metavar="ORG/NAME",
              help="The Hugging Face repository the target GGUF was made from (for vLLM), if its header lacks it.")
@click.option("--draft-repo", default=None, metavar="ORG/NAME", help="The same for the draft.")
@friendly_errors
def export(pair_name: Optional[str], target: Optional[str], draft: Optional[str], engine: str, method: str,
           bench_file: Optional[str], k: Optional[int], ctx: Optional[int], port: Optional[int],
           target_repo: Optional[str], draft_repo: Optional[str]) -> None:
    """Print the command that serves this pair on vLLM or llama-server, for more than one user."""
    from .. import export as ex
    from ..naming import resolve_models
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
    if method == "auto" and bench_file:
        method, bench_k, speedup = ex.load_bench(Path(bench_file))
        k = k or bench_k
        click.echo(f"# from {bench_file}: {method} with K={bench_k} did best ({speedup:.2f}x median over its "
                   "prompts on this machine)")
    elif method == "auto":
        method = DRAFT.name if d else LOOKUP.name
    if method == DRAFT.name and d is None:
        raise click.UsageError("The draft method needs --draft (or a pair); choose --method lookup or history.")
    click.echo(ex.plan(engine, t, d, method, k or pair_k or 4, LOOKUP_NGRAM, ctx or pair_ctx, port).render())
