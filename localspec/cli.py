"""The ``localspec`` command line.

Thin by design: it parses options, calls the Python API, prints. It is the
only place where library errors become messages: a ``LocalspecError`` is
printed as one sentence (``error: ...``) with exit status 1, never a traceback.
"""

from __future__ import annotations

import functools
import json
import sys
from typing import TYPE_CHECKING, Any, Callable, Optional

import click

from . import __version__
from .errors import LocalspecError

if TYPE_CHECKING:
    from .api import Result

METHOD_CHOICES = ["auto", "plain", "draft", "lookup"]


def _friendly_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn library errors into one-line messages and Ctrl-C into a clean exit."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except LocalspecError as exc:
            raise click.ClickException(str(exc)) from None
        except KeyboardInterrupt:
            click.echo("\ninterrupted", err=True)
            sys.exit(130)

    return wrapper


def model_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by every command that loads models."""
    for opt in reversed([
        click.option("--target", "-t", "target", type=click.Path(dir_okay=False), required=True,
                     help="Target model (.gguf): its output is what you get."),
        click.option("--draft", "-d", "draft", type=click.Path(dir_okay=False), default=None,
                     help="Draft model (.gguf) of the same family, for --method draft."),
        click.option("--ctx", "n_ctx", type=click.IntRange(min=0), default=4096, show_default=True,
                     help="Context length in tokens (0: the model's own)."),
        click.option("--threads", "n_threads", type=click.IntRange(min=1), default=None,
                     help="CPU threads (default: all available cores)."),
        click.option("--gpu-layers", "n_gpu_layers", type=int, default=None,
                     help="Layers to offload to the GPU; -1 all (default on GPU builds), 0 none."),
        click.option("--verbose", is_flag=True, help="Show llama.cpp's log."),
    ]):
        fn = opt(fn)
    return fn


def sampling_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Options that shape one generation."""
    for opt in reversed([
        click.option("--max-tokens", "-n", type=int, default=256, show_default=True,
                     help="Most tokens to generate."),
        click.option("--temperature", "--temp", type=float, default=0.0, show_default=True,
                     help="0 for greedy decoding; above 0 samples."),
        click.option("--top-p", type=float, default=1.0, show_default=True, help="Nucleus sampling mass (1: off)."),
        click.option("--top-k", type=int, default=0, show_default=True, help="Keep the k likeliest tokens (0: off)."),
        click.option("--min-p", type=float, default=0.0, show_default=True,
                     help="Drop tokens below min-p times the top probability (0: off)."),
        click.option("--seed", type=int, default=None, help="Sampling seed (default: random)."),
        click.option("--method", "-m", type=click.Choice(METHOD_CHOICES), default="auto", show_default=True,
                     help="How to draft: auto picks prompt lookup, the draft model or plain decoding "
                          "(and K) each round from this machine's measured costs."),
        click.option("--k", "-k", type=int, default=None,
                     help="Tokens drafted per round (default: 4 for draft, 8 for lookup; for auto the most, 8)."),
        click.option("--recalibrate", is_flag=True, help="Measure this machine's costs again for auto."),
    ]):
        fn = opt(fn)
    return fn


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="localspec")
def cli() -> None:
    """Fast local generation with speculative decoding over llama.cpp.

    The output is exactly what the target model would produce alone; a draft
    model or prompt lookup only changes how fast it comes.
    """


@cli.command()
@model_options
@sampling_options
@click.option("--prompt", "-p", default=None, help="Raw prompt text, sent as is.")
@click.option("--message", default=None, help="One user message, formatted with the model's chat template.")
@click.option("--system", default=None, help="System message to go with --message.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: text, tokens, finish_reason, stats.")
@_friendly_errors
def generate(
    target: str, draft: Optional[str], n_ctx: int, n_threads: Optional[int], n_gpu_layers: Optional[int],
    verbose: bool, max_tokens: int, temperature: float, top_p: float, top_k: int, min_p: float,
    seed: Optional[int], method: Optional[str], k: Optional[int], recalibrate: bool, prompt: Optional[str],
    message: Optional[str], system: Optional[str], as_json: bool,
) -> None:
    """Generate a continuation of --prompt, or a reply to --message."""
    from .api import load

    if (prompt is None) == (message is None):
        raise click.UsageError("Give exactly one of --prompt (raw text) or --message (a chat turn).")
    if system is not None and message is None:
        raise click.UsageError("--system goes with --message, not with a raw --prompt.")
    options = dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                   min_p=min_p, seed=seed, method=method, k=k)
    with load(target, draft, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers, verbose=verbose) as pair:
        if recalibrate:
            pair.calibrate(refresh=True)
        if message is not None:
            messages = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": message}]
            stream = pair.stream_chat(messages, **options)
        else:
            stream = pair.stream(prompt or "", **options)
        if as_json:
            for _ in stream:
                pass
            click.echo(json.dumps(stream.result.to_dict(), ensure_ascii=False))
            return
        for ev in stream:
            click.echo(ev.text, nl=False)
        r = stream.result
        click.echo()
        click.echo(summary_line(r), err=True)


def summary_line(r: Result) -> str:
    """One line after a reply: tokens, speed, method and K, acceptance."""
    s = r.stats
    how = s.method
    if s.auto:
        used = ", ".join(f"{m} {n}" for m, n in s.auto["rounds"].items() if n)
        how = f"auto ({used} rounds)"
    elif s.k:
        how += f" k={s.k}"
    acc = f", accepted {s.accepted}/{s.drafted} ({100 * s.acceptance_rate:.0f}%)" if s.drafted else ""
    return (f"[{s.generated_tokens} tokens, {s.decode_tokens_per_second:.1f} tok/s, {how}{acc}, "
            f"finish: {r.finish_reason}]")


@cli.command()
@model_options
@click.option("--recalibrate", is_flag=True, help="Measure again even if a calibration is cached.")
@click.option("--json", "as_json", is_flag=True, help="Print the profile as JSON.")
@_friendly_errors
def calibrate(target: str, draft: Optional[str], n_ctx: int, n_threads: Optional[int],
              n_gpu_layers: Optional[int], verbose: bool, recalibrate: bool, as_json: bool) -> None:
    """Measure what verification and drafting cost on this machine (used by auto)."""
    from .api import load
    from .auto import predicted_table

    with load(target, draft, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers, verbose=verbose) as pair:
        profile = pair.calibrate(refresh=recalibrate)
        if as_json:
            click.echo(json.dumps({"source": profile.source, "verify_seconds": profile.verify,
                                   "draft_step_seconds": profile.draft_step, "lookup_seconds": profile.lookup,
                                   "relative": profile.relative()}))
            return
        click.echo(predicted_table(profile, pair.draft is not None))


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="localspec")


@cli.command()
@model_options
@click.option("--suite", type=click.Path(dir_okay=False, exists=True), default=None,
              help="JSONL prompt suite ({\"category\", \"prompt\" | \"messages\"} per line); default: built-in.")
@click.option("--category", "categories", multiple=True, help="Only these categories (repeatable).")
@click.option("--quick", is_flag=True, help="One prompt per kind of text, few K: a few minutes on a small CPU.")
@click.option("--reps", type=click.IntRange(min=1), default=None, help="Repetitions per method (default 3, quick 2).")
@click.option("--max-tokens", "-n", type=click.IntRange(min=2), default=None,
              help="Tokens per generation (default 128, quick 64).")
@click.option("--k-lookup", "k_lookup", type=str, default=None, help="Lookup draft lengths, e.g. 2,4,8.")
@click.option("--k-draft", "k_draft", type=str, default=None, help="Draft-model draft lengths, e.g. 1,2,4,8.")
@click.option("--no-auto", is_flag=True, help="Leave auto mode out.")
@click.option("--sampled", is_flag=True, help="Also run at a sampling temperature (seeded by repetition).")
@click.option("--sampled-temperature", type=float, default=0.8, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write everything measured, with machine info, to this JSON file.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Write a PNG of speedup against K per category (needs matplotlib).")
@_friendly_errors
def bench(target: str, draft: Optional[str], n_ctx: int, n_threads: Optional[int], n_gpu_layers: Optional[int],
          verbose: bool, suite: Optional[str], categories: tuple[str, ...], quick: bool, reps: Optional[int],
          max_tokens: Optional[int], k_lookup: Optional[str], k_draft: Optional[str], no_auto: bool,
          sampled: bool, sampled_temperature: float, json_path: Optional[str], plot_path: Optional[str]) -> None:
    """Compare plain decoding, lookup, draft and auto on a prompt suite, side by side.

    Exits with status 1 if any greedy run differs from plain decoding other than at a numeric tie.
    """
    from pathlib import Path

    from .api import load
    from .bench import default_methods, load_suite, render_table, run_bench, write_json, write_plot

    prompts = load_suite(Path(suite) if suite else None, categories, quick)
    with load(target, draft, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers, verbose=verbose) as pair:
        methods = default_methods(pair.draft is not None, quick, _k_list(k_lookup, "--k-lookup"),
                                  _k_list(k_draft, "--k-draft"), auto=not no_auto)
        reps = reps or (2 if quick else 3)
        max_tokens = max_tokens or (64 if quick else 128)
        temperatures = (0.0, sampled_temperature) if sampled else (0.0,)
        total = len(prompts) * len(methods) * reps * len(temperatures)
        click.echo(f"bench: {len(prompts)} prompts x {len(methods)} methods x {reps} reps"
                   f"{' x 2 temperatures' if sampled else ''}, {max_tokens} tokens each", err=True)
        pair.calibrate()
        with click.progressbar(length=total, label="running", file=sys.stderr) as bar:
            report = run_bench(pair, prompts, methods, reps=reps, max_tokens=max_tokens,
                               temperatures=temperatures, progress=lambda _: bar.update(1),
                               checksums=json_path is not None)
        click.echo(render_table(report))
        if json_path:
            write_json(report, Path(json_path))
            click.echo(f"wrote {json_path}", err=True)
        if plot_path:
            write_plot(report, Path(plot_path))
            click.echo(f"wrote {plot_path}", err=True)
    if report.mismatches:
        sys.exit(1)


def _k_list(value: Optional[str], option: str) -> Optional[list[int]]:
    if value is None:
        return None
    try:
        ks = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated whole numbers, got {value!r}", param_hint=option) from None
    if not ks or any(k < 1 or k > 8 for k in ks):
        raise click.BadParameter("each K must be from 1 to 8", param_hint=option)
    return ks
