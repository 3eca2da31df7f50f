"""``localspec calibrate``: what verification and drafting cost on this machine, and what auto makes of it."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from ..methods import REGISTRY, Method
from .shared import ModelArgs, friendly_errors, model_options

if TYPE_CHECKING:
    from ..drafting.costs import CostProfile


@click.command()
@model_options
@click.option("--recalibrate", is_flag=True, help="Measure again even if a calibration is cached.")
@click.option("--json", "as_json", is_flag=True, help="Print the profile as JSON.")
@click.option("--parallel", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Sequences the target holds: the multi-sequence curve measures decodes of up to this many "
                   "(1: the single curve only).")
@friendly_errors
def calibrate(models: ModelArgs, recalibrate: bool, as_json: bool, parallel: int) -> None:
    """Measure what verification and drafting cost on this machine (used by auto)."""
    with models.open(parallel=parallel) as pair:
        profile = pair.calibrate(refresh=recalibrate)
        sweep = pair.choose_threads()  # cached by now: what the choice was made from
        batches = pair.thread_choice.batch_seconds if pair.thread_choice else {}
        t = pair.target
        if as_json:
            click.echo(json.dumps({"source": profile.source, "verify_seconds": profile.verify,
                                   "draft_step_seconds": profile.draft_step, "lookup_seconds": profile.lookup,
                                   "mtp_step_seconds": profile.mtp_step, "rollback_seconds": profile.rollback,
                                   "together_seconds": profile.together,
                                   "memory": t.memory.describe(),
                                   "relative": profile.relative(), "threads": t.n_threads,
                                   "threads_batch": t.n_threads_batch, "thread_sweep_step_seconds": sweep,
                                   "thread_sweep_batch_seconds": batches}))
            return
        if sweep:
            click.echo("threads for steps: " + "  ".join(f"{n}: {1000 * s:.1f} ms" for n, s in sweep.items())
                       + f"  -> using {t.n_threads} (--threads overrides)")
            click.echo(f"threads for batches of {len(profile.verify)}: "
                       + "  ".join(f"{n}: {1000 * s:.1f} ms" for n, s in batches.items())
                       + f"  -> using {t.n_threads_batch} (--threads-batch overrides)")
        else:
            click.echo(f"threads: {t.n_threads} for steps, {t.n_threads_batch} for batches (set with --threads)")
        head = pair.assembly.usable_head(pair.notify)
        click.echo(f"memory: {t.memory.describe()}" + (f"; the draft's: {pair.draft.memory.describe()}"
                                                          if pair.draft is not None else "")
                   + (f"; {head.describe()}" if head is not None else ""))
        methods = [m for m in REGISTRY if m.candidate and (pair.draft is not None or not m.needs_draft)
                   and (head is not None or not m.needs_head)]
        click.echo(profile_table(profile, methods, has_draft=pair.draft is not None, has_head=head is not None))


def profile_table(profile: CostProfile, methods: list[Method], *, has_draft: bool, has_head: bool,
                  alphas: tuple[float, ...] = (0.3, 0.5, 0.7, 0.9)) -> str:
    """A readable summary of a profile: relative costs and what auto would choose at each acceptance."""
    from ..drafting.costs import best_k

    rel = profile.relative()
    verify = rel["verify"]
    assert isinstance(verify, list)
    lines = [
        f"cost profile ({profile.source}): one target step {1000 * profile.verify[0]:.1f} ms",
        "  verify n tokens / one step: " + "  ".join(f"{n + 1}:{v:.2f}" for n, v in enumerate(verify)),
    ]
    together = rel.get("together")
    if isinstance(together, list) and together:
        lines.append("  one token from each of s sequences / one sequence's: "
                     + "  ".join(f"{s + 1}:{v:.2f}" for s, v in enumerate(together)))
    if has_draft:
        lines.append(f"  draft step / target step: {rel['draft_step']:.2f}")
    if has_head:
        lines.append(f"  MTP head step / target step: {rel.get('mtp_step', 0.0):.2f}")
    if profile.rollback:
        lines.append(f"  checkpoint per drafted round / target step: {rel['rollback']:.2f}")
    lines.append("  predicted speedup over plain (best K) at per-token acceptance alpha:")
    lines.append("    alpha  " + "  ".join(f"{m.name:>14}" for m in methods))
    for a in alphas:
        cells = []
        for m in methods:
            k, s = best_k(profile, m, a, profile.kmax)
            cells.append(f"{s:5.2f}x (K={k})" if k else "  plain (K=0)")
        lines.append(f"    {a:5.2f}  " + "  ".join(f"{c:>14}" for c in cells))
    return "\n".join(lines)
