"""``localspec history``: what each model's history store holds; ``history clear`` deletes them."""

from __future__ import annotations

import json
from typing import Any

import click

from .shared import friendly_errors


@click.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print the stores as JSON.")
@click.pass_context
@friendly_errors
def history(ctx: click.Context, as_json: bool) -> None:
    """Show what each model's history store holds, and how often its guesses were right.

    Generations are recorded per target model (prompt and reply tokens) and
    later drafts copy what followed the same text before. Turn it off per
    call with --no-history, or everywhere with LOCALSPEC_HISTORY=off.
    """
    if ctx.invoked_subcommand is not None:
        return
    from ..drafting.history import history_dir, list_stores, set_aside_copies

    stores, aside = list_stores(), set_aside_copies()
    if as_json:
        rows: list[dict[str, Any]] = [
            {"file": str(path), "model": model, "records": c.records, "tokens": c.tokens, "bytes": c.bytes,
             "drafted": c.drafted, "accepted": c.accepted, "hit_rate": c.hit_rate, "set_aside": False}
            for path, model, c in stores]
        rows += [{"file": str(path), "bytes": path.stat().st_size, "set_aside": True} for path in aside]
        click.echo(json.dumps(rows, indent=1))
        return
    if not stores and not aside:
        click.echo(f"no history yet ({history_dir()})")
        return
    for path, model, c in stores:
        hits = f"{c.accepted}/{c.drafted} drafted tokens accepted ({100 * c.hit_rate:.0f}%)" if c.drafted else \
            "no history drafts yet"
        click.echo(f"{model}: {c.records} generations, {c.tokens} tokens, {c.bytes / 1e6:.2f} MB; {hits}")
        click.echo(f"  {path}")
    for path in aside:
        click.echo(f"set aside as damaged (`localspec history clear` deletes it): {path}, "
                   f"{path.stat().st_size / 1e6:.2f} MB")


@history.command("clear")
@click.option("--yes", "-y", is_flag=True, help="Do not ask.")
@friendly_errors
def history_clear(yes: bool) -> None:
    """Delete every model's history store, and the damaged copies set aside."""
    from ..drafting.history import clear_stores, history_dir

    if not yes:
        click.confirm(f"Delete all recorded generations in {history_dir()}?", abort=True)
    removed = clear_stores()
    click.echo(f"history cleared ({removed} file{'s' if removed != 1 else ''} removed)")
