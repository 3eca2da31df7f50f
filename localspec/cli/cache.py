"""``localspec cache``: what the prompt cache keeps on disk; ``cache clear`` deletes it."""

from __future__ import annotations

import json
import time

import click

from .shared import friendly_errors


@click.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print the entries as JSON.")
@click.pass_context
@friendly_errors
def cache(ctx: click.Context, as_json: bool) -> None:
    """Show the prompt cache's saved states on disk: which model, how many prompt tokens, how large.

    Every command that runs a model keeps the state after each prompt (in RAM, and on disk under
    the budgets of --cache-ram and --cache-disk), so a prompt processed once, by this process or an
    earlier one, is not processed again. LOCALSPEC_PROMPT_CACHE=off turns it off.
    """
    if ctx.invoked_subcommand is not None:
        return
    from ..loading import prompt_cache_folder
    from ..prompt_cache.files import disk_entries

    folder = prompt_cache_folder()
    entries = disk_entries(folder)
    if as_json:
        click.echo(json.dumps([{"file": str(e.path), "model": e.model, "tokens": e.tokens, "bytes": e.bytes,
                                "modified": e.modified} for e in entries], indent=1))
        return
    if not entries:
        click.echo(f"the prompt cache holds nothing on disk ({folder})")
        return
    total = sum(e.bytes for e in entries)
    click.echo(f"{len(entries)} saved prompt states, {total / 2**20:.1f} MiB, in {folder}")
    for e in entries:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.modified))
        click.echo(f"  {e.model}: {e.tokens} tokens, {e.bytes / 2**20:.1f} MiB, used {when}")


@cache.command("clear")
@click.option("--yes", "-y", is_flag=True, help="Do not ask.")
@friendly_errors
def cache_clear(yes: bool) -> None:
    """Delete every saved prompt state on disk (damaged files too)."""
    from ..loading import prompt_cache_folder
    from ..prompt_cache.files import remove_all

    folder = prompt_cache_folder()
    if not yes:
        click.confirm(f"Delete the prompt cache in {folder}?", abort=True)
    removed = remove_all(folder)
    click.echo(f"prompt cache cleared ({removed} file{'s' if removed != 1 else ''} removed)")
