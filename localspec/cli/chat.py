"""``localspec chat``: talk to a pair in the terminal; the first run offers to download the default pair."""

from __future__ import annotations

import sys
from typing import Optional

import click

from ..options import GenerationOptions
from .shared import ModelArgs, friendly_errors, generation_options, model_options, say


@click.command()
@model_options
@generation_options
@click.option("--system", default=None, help="System prompt.")
@click.option("--show-drafts", is_flag=True, help="Colour tokens by where they came from (lookup, draft, target).")
@click.option("--yes", "-y", is_flag=True, help="Download the pair without asking if it is missing.")
@friendly_errors
def chat(models: ModelArgs, options: GenerationOptions, system: Optional[str], show_drafts: bool, yes: bool) -> None:
    """Talk to a model pair in the terminal, with streamed speculative output.

    PAIR is a name from `localspec models`, or a model (a .gguf file, or a
    name from `localspec models --scan`) with the best draft on this machine;
    without one (and without --target) the first downloaded pair is used, or
    the default pair is offered for download.
    """
    if options.logprobs is not None:
        raise click.UsageError("localspec chat does not show log-probabilities; use generate --json --logprobs N, "
                               "or the server's logprobs.")
    from ..catalog.hub import first_downloaded
    from ..catalog.naming import names_a_model
    from ..catalog.registry import DEFAULT_PAIR, load_registry
    from .chat_session import ChatSession, run_chat

    if not models.pair_name and not models.target:
        models.pair_name = first_downloaded(load_registry()) or DEFAULT_PAIR
    if models.pair_name and not names_a_model(models.pair_name):
        _ensure_pulled(models.pair_name, yes)
    with models.open(options.method) as pair:
        run_chat(ChatSession(pair, system, options), show_drafts)


def _ensure_pulled(name: str, yes: bool) -> None:
    """Download pair ``name`` if it is not on disk, after asking (unless ``yes``)."""
    from ..catalog.hub import is_downloaded, pull
    from ..catalog.registry import get_pair

    spec = get_pair(name)
    if is_downloaded(spec):
        return
    if not yes:
        if not sys.stdin.isatty():
            raise click.ClickException(f"Pair {name!r} is not downloaded; run `localspec pull {name}` "
                                       "(or pass --yes to download it now).")
        if not click.confirm(f"Pair {name!r} ({spec.description}) is not downloaded. Download it now?",
                             default=True):
            raise click.Abort()
    pull(spec, say=say)
