"""``localspec bench``: every method against llama-cpp-python's own decoding, in one interleaved run."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import click

from ..methods import DRAFT, K_LIMIT, LOOKUP
from ..options import GenerationOptions
from .shared import ModelArgs, friendly_errors, model_options, say


@click.command()
@model_options
@click.option("--suite", type=click.Path(dir_okay=False, exists=True), default=None,
              help="JSONL prompt suite ({\"category\", \"prompt\" | \"messages\"} per line); default: built-in.")
@click.option("--category", "categories", multiple=True, help="Only these categories (repeatable).")
@click.option("--quick", is_flag=True, help="One prompt per kind of text, few K: a few minutes on a small CPU.")
@click.option("--reps", type=click.IntRange(min=1), default=None,
              help="Repetitions per method (default 3, quick 2); with --width, the least.")
@click.option("--width", type=click.FloatRange(min=0.001, max=1.0), default=None,
              help="Keep adding repetitions to a prompt until every ratio's 95% interval is narrower than this "
                   "share of it (0.04: about +-2%), or --budget runs out.")
@click.option("--budget", "budget_minutes", type=click.FloatRange(min=0.1), default=None,
              help="With --width: minutes for the repetitions past the first ones, shared out over the prompts "
                   "(default 60; at most 40 repetitions a prompt).")
@click.option("--lockstep", is_flag=True,
              help="Run each repetition's rows side by side, a token of each in turn, so that load from other "
                   "programs slows them alike and the ratios come out tighter; every localspec row after the first "
                   "loads the models once more.")
@click.option("--max-tokens", "-n", type=click.IntRange(min=2), default=None,
              help="Tokens per generation (default 128, quick 64).")
@click.option("--k-lookup", "k_lookup", type=str, default=None,
              help="Lookup draft lengths, e.g. 2,4,8 (none: no rows).")
@click.option("--k-draft", "k_draft", type=str, default=None,
              help="Draft-model draft lengths, e.g. 1,2,4,8 (none: no rows).")
@click.option("--k-lcp-lookup", "k_lcp_lookup", type=str, default=None,
              help="Draft lengths of llama-cpp-python's own prompt lookup (default 2,10; none: no rows).")
@click.option("--no-auto", is_flag=True, help="Leave auto mode out.")
@click.option("--no-peers", is_flag=True,
              help="Leave out llama-cpp-python's own Llama (plain, and its prompt lookup with 2 and 10 tokens).")
@click.option("--history-check", is_flag=True, help="Add auto without history, to compare with auto's empty store.")
@click.option("--related", is_flag=True,
              help="Run the related-requests workload instead (or --suite FILE, in order): auto with an empty "
                   "history and with the earlier requests' history, against llama-cpp-python plain.")
@click.option("--agent", is_flag=True,
              help="Run the agent workload instead: two conversations taking turns, each request resending its "
                   "conversation, through `localspec serve` and llama-cpp-python's server (and llama-server where "
                   "found), started one after another, then asked in turn; time to first token and total time. "
                   "--cache-ram and --cache-disk apply to its localspec server (default here: no disk tier, so a run "
                   "starts cold).")
@click.option("--together", is_flag=True,
              help="Run requests sent together instead (a title request beside a long prompt, sub-agents, four "
                   "requests at once, and one alone for reference), through `localspec serve` (and decoding "
                   "plainly), llama-cpp-python's server and llama-server (and with the draft model) where found, "
                   "each started afresh; when each request is done.")
@click.option("--workload", "workloads", multiple=True,
              type=click.Choice(["title", "fanout", "new", "mixed", "copy", "alone"]),
              help="With --together: only these workloads (repeatable; default: all).")
@click.option("--llama-server", "llama_server", default=None, metavar="PATH",
              help="With --agent or --together: llama.cpp's llama-server to add as a row (default: the one on the "
                   "PATH, if any).")
@click.option("--scale", type=click.FloatRange(min=0.01, max=20.0), default=1.0, show_default=True,
              help="With --agent: the prompts' size (1: system prompts of about 1.4k and 0.6k tokens, files of "
                   "1.2k).")
@click.option("--image", "image", type=click.Path(dir_okay=False, exists=True), default=None, metavar="FILE",
              help="With --agent: the image workload instead, on this image (PNG or JPEG): described, then two "
                   "follow-up questions, through `localspec serve` and llama-server with the target's projector "
                   "(--mmproj, or the mmproj file beside the target).")
@click.option("--structured", is_flag=True,
              help="Run the structured suite instead: extraction into a JSON Schema, tool calls and fill-in-the-"
                   "middle, every row under the prompt's constraint (llama-cpp-python's under its own grammar).")
@click.option("--sampled", is_flag=True, help="Also run sampled (seeded by repetition), against the peers too.")
@click.option("--sampled-temperature", type=float, default=0.7, show_default=True)
@click.option("--sampled-top-p", type=float, default=0.9, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write everything measured, with machine info, to this JSON file.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Write a PNG of speedup against K per category (needs matplotlib).")
@friendly_errors
def bench(models: ModelArgs, suite: Optional[str], categories: tuple[str, ...], quick: bool, reps: Optional[int],
          width: Optional[float], budget_minutes: Optional[float], lockstep: bool, max_tokens: Optional[int],
          k_lookup: Optional[str], k_draft: Optional[str], k_lcp_lookup: Optional[str], no_auto: bool, no_peers: bool,
          history_check: bool, related: bool, agent: bool, together: bool, workloads: tuple[str, ...],
          llama_server: Optional[str], scale: float, image: Optional[str],
          structured: bool, sampled: bool, sampled_temperature: float,
          sampled_top_p: float,
          json_path: Optional[str], plot_path: Optional[str]) -> None:
    """Compare plain decoding, lookup, draft and auto, and llama-cpp-python's own decoding, side by side.

    Speedups are shown against llama-cpp-python's plain decoding (what you would
    otherwise run) and against localspec's plain path. Exits with status 1 if any
    greedy run differs from plain decoding other than at a numeric tie.
    """
    from ..bench import Precision, default_methods, load_suite, render_table, run_bench, write_json, write_plot
    from ..bench.peers import PEER_LOOKUP

    if budget_minutes is not None and width is None:
        raise click.UsageError("--budget sets the time for --width's extra repetitions; give --width too.")
    if no_peers and k_lcp_lookup is not None:
        raise click.UsageError("--k-lcp-lookup sets llama-cpp-python's lookup rows, which --no-peers leaves out; "
                               "give one or the other.")
    if lockstep and related:
        raise click.UsageError("--related runs its requests in order, one after another; --lockstep is for the "
                               "suites.")
    if sum((related, structured, agent, together)) > 1:
        raise click.UsageError("--related, --structured, --agent and --together are different workloads; give one.")
    if workloads and not together:
        raise click.UsageError("--workload picks among --together's workloads; add --together.")
    if together:
        given = [name for name, on in (("--suite", suite), ("--quick", quick), ("--lockstep", lockstep),
                                       ("--width", width is not None), ("--max-tokens", max_tokens),
                                       ("--k-lookup", k_lookup), ("--k-draft", k_draft),
                                       ("--k-lcp-lookup", k_lcp_lookup), ("--no-auto", no_auto),
                                       ("--history-check", history_check), ("--sampled", sampled),
                                       ("--plot", plot_path), ("--scale", scale != 1.0),
                                       ("--category", categories), ("--budget", budget_minutes is not None),
                                       ("--cache-ram", models.cache_ram is not None),
                                       ("--cache-disk", models.cache_disk is not None)) if on]
        if given:
            raise click.UsageError(f"--together runs each server as it serves, on its own requests; leave out "
                                   f"{', '.join(given)}.")
        _bench_together(models, reps or 3, workloads, llama_server, no_peers, json_path)
        return
    if not agent and (models.cache_ram is not None or models.cache_disk is not None):
        raise click.UsageError("--cache-ram and --cache-disk size the prompt cache of --agent's server; the other "
                               "workloads run without the prompt cache, so that every run processes its prompt.")
    if not agent and image is not None:
        raise click.UsageError("--image runs the image workload of --agent; add --agent.")
    if not agent and scale != 1.0:
        raise click.UsageError("--scale belongs to --agent's workload; add --agent.")
    if not agent and llama_server is not None:
        raise click.UsageError("--llama-server adds a row to --agent's or --together's workload; add one of them.")
    if agent:
        if suite or structured or lockstep or width is not None:
            raise click.UsageError("--agent runs its own two conversations, one request at a time; leave out --suite, "
                                   "--lockstep and --width.")
        ignored = [name for name, given in (("--quick", quick), ("--k-lookup", k_lookup), ("--k-draft", k_draft),
                                            ("--k-lcp-lookup", k_lcp_lookup), ("--no-auto", no_auto),
                                            ("--history-check", history_check), ("--sampled", sampled),
                                            ("--plot", plot_path)) if given]
        if ignored:
            raise click.UsageError(f"--agent runs each server as it serves, greedy and drafting as it chooses; "
                                   f"{', '.join(ignored)} belong to the suites.")
        _bench_agent(models, reps or 1, max_tokens or 32, scale, llama_server, no_peers, json_path, image)
        return
    if structured and suite:
        raise click.UsageError("--structured runs the built-in structured suite; a --suite file may hold the same "
                               "fields (response_format, tools, prefix and suffix): give one or the other.")
    if related:
        _bench_related(models, suite, reps, max_tokens, json_path)
        return
    prompts = load_suite(Path(suite) if suite else None, categories, quick,
                         builtin="structured.jsonl" if structured else "suite.jsonl")
    ks = {LOOKUP.name: _k_list(k_lookup, "--k-lookup"), DRAFT.name: _k_list(k_draft, "--k-draft"),
          PEER_LOOKUP: _k_list(k_lcp_lookup, "--k-lcp-lookup")}
    GenerationOptions(temperature=sampled_temperature, top_p=sampled_top_p)  # bad values fail before any work
    reps = reps or (2 if quick else 3)
    max_tokens = max_tokens or (64 if quick else 128)
    temperatures = (0.0, sampled_temperature) if sampled else (0.0,)
    precision = Precision(width, 60 * (budget_minutes or 60.0)) if width is not None else None
    with models.open(prompt_cache=False) as pair:  # every run prefills its whole prompt
        methods = default_methods(pair.draft is not None, quick, {m: k for m, k in ks.items() if k is not None},
                                  auto=not no_auto, peers=not no_peers, history_check=history_check,
                                  has_head=bool(pair.target.n_nextn))
        most = max(reps, precision.max_reps) if precision else reps
        total = len(prompts) * len(methods) * most * len(temperatures)
        click.echo(f"bench: {len(prompts)} prompts x {len(methods)} methods x "
                   + (f"{reps} reps or more, until every interval is narrower than {width:.0%} or "
                      f"{budget_minutes or 60.0:g} minutes of further repetitions are spent"
                      if precision else f"{reps} reps")
                   + f"{' x 2 temperatures' if sampled else ''}, {max_tokens} tokens each"
                   + (", in lockstep" if lockstep else ""), err=True)
        pair.calibrate()
        with click.progressbar(length=total, label="running", file=sys.stderr) as bar:
            def prompt_done(name: str, n: int, widest: float) -> None:
                if precision is not None:  # the bar's length assumed every prompt might need max_reps
                    click.echo(f"\n{name}: {n} repetitions, widest 95% interval {widest:.1%}", err=True)

            report = run_bench(pair, prompts, methods, reps=reps, max_tokens=max_tokens,
                               temperatures=temperatures, top_p=sampled_top_p, progress=lambda _: bar.update(1),
                               checksums=json_path is not None, precision=precision, on_prompt=prompt_done,
                               lockstep=lockstep)
        click.echo(render_table(report))
        if json_path:
            write_json(report, Path(json_path))
            click.echo(f"wrote {json_path}", err=True)
        if plot_path:
            write_plot(report, Path(plot_path))
            click.echo(f"wrote {plot_path}", err=True)
    if report.mismatches:
        sys.exit(1)


def _bench_related(models: ModelArgs, suite: Optional[str], reps: Optional[int], max_tokens: Optional[int],
                   json_path: Optional[str]) -> None:
    from ..bench import load_related, render_related, run_related

    prompts = load_related(Path(suite) if suite else None)
    with models.open(prompt_cache=False) as pair:  # every run prefills its whole prompt
        reps, max_tokens = reps or 3, max_tokens or 128
        click.echo(f"bench: {len(prompts)} related requests x 3 rows x {reps} reps, {max_tokens} tokens each", err=True)
        pair.calibrate()
        with click.progressbar(length=len(prompts) * 3 * reps, label="running", file=sys.stderr) as bar:
            report = run_related(pair, prompts, reps=reps, max_tokens=max_tokens, progress=lambda _: bar.update(1),
                                 checksums=json_path is not None)
        click.echo(render_related(report))
        if json_path:
            Path(json_path).write_text(json.dumps(report.to_dict(), indent=1))
            click.echo(f"wrote {json_path}", err=True)
    if report.mismatches:
        sys.exit(1)


def _servers(models: ModelArgs, llama_server: Optional[str], no_peers: bool, cache_row: bool,
             image: bool = False) -> tuple[list[Any], dict[str, Any], str]:
    """The servers to compare, all on the same files, threads, context and device (localspec's first;
    llama-cpp-python's at its defaults, and with its RAM cache where ``cache_row``), the machine, and a line
    describing them. With ``image``, both servers load the target's projector, and llama-cpp-python's server,
    which reads images only through a family's own chat handler, is left out."""
    from ..bench import agent as workload
    from ..bench.machine import host_info
    from ..loading import AUTO_PARALLEL, fit_context
    from ..runtime.process import default_threads, gpu_offload_supported

    files = models.files()
    target, draft = str(files.target), str(files.draft) if files.draft else None
    threads = models.n_threads or default_threads()
    threads_batch = models.n_threads_batch or threads
    # what serve would choose, for all (0: the model's own, which every server reads the same way)
    ctx = models.n_ctx if models.n_ctx is not None else fit_context(files.target, files.draft,
                                                                         parallel=AUTO_PARALLEL).n_ctx
    # every server on the same device: all layers on a GPU build, none on a CPU one, unless told
    gpu = models.n_gpu_layers if models.n_gpu_layers is not None else (-1 if gpu_offload_supported() else 0)
    mmproj = _projector_file(models, files.target) if image else None
    specs = [workload.localspec_spec(target, draft, threads, threads_batch, ctx, gpu, models.cache_ram,
                                     models.cache_disk or 0, mmproj)]
    if not no_peers:
        if image:
            pass
        elif workload.llama_cpp_server_installed():
            specs += workload.llama_cpp_python_specs(target, threads, threads_batch, ctx, gpu)[:None if cache_row
                                                                                                 else 1]
        else:
            say("bench: llama-cpp-python's server is not installed, so its rows are left out "
                "(pip install 'llama-cpp-python[server]' adds them).")
        program = workload.find_llama_server(llama_server)
        if program:
            specs.append(workload.llama_server_spec(program, target, threads, threads_batch, ctx, gpu, mmproj))
    machine = {**host_info(), "threads": threads, "threads_batch": threads_batch, "n_ctx": ctx,
               "target": target, "draft": draft}
    return specs, machine, f"{threads} threads ({threads_batch} for batches) each, context {ctx}"


def _bench_agent(models: ModelArgs, reps: int, max_tokens: int, scale: float, llama_server: Optional[str],
                 no_peers: bool, json_path: Optional[str], image: Optional[str] = None) -> None:
    from ..bench import agent as workload

    specs, machine, setup = _servers(models, llama_server, no_peers, cache_row=True, image=image is not None)
    say(f"bench: {'image' if image else 'agent'} workload x {len(specs)} servers x {reps} rep(s), {setup}, "
        f"{max_tokens} tokens a reply")
    report = workload.run_agent_bench(specs, max_tokens, scale, reps, machine, progress=say,
                                      image=Path(image).read_bytes() if image else None)
    click.echo(workload.render_agent(report))
    if json_path:
        workload.write_agent_json(report, Path(json_path))
        say(f"wrote {json_path}")


def _projector_file(models: ModelArgs, target: Path) -> str:
    """The projector the image workload's servers load: --mmproj, else the one beside the target."""
    from ..catalog.stores.layouts import find_projector

    given = models.projector()
    found = given if isinstance(given, Path) else find_projector(target) if given is None else None
    if found is None:
        raise click.UsageError(f"--image needs the target's vision projector; none lies beside {target.name}: "
                               "give it with --mmproj FILE.")
    return str(found)


def _bench_together(models: ModelArgs, reps: int, names: Sequence[str], llama_server: Optional[str],
                    no_peers: bool, json_path: Optional[str]) -> None:
    from ..bench import together
    from ..bench.agent import plain_variant, with_draft

    specs, machine, setup = _servers(models, llama_server, no_peers, cache_row=False)
    specs[0] = dataclasses.replace(specs[0], note="its defaults (requests at once: --parallel automatic, drafting "
                                                  "auto), prompt cache and history off")
    # beside each speculating server, the same server without it: what batching gives apart from drafting
    specs.insert(1, plain_variant(specs[0]))
    if machine["draft"] and specs[-1].name == "llama-server":
        specs.append(with_draft(specs[-1], machine["draft"]))
    names = list(names) or list(together.workloads())
    say(f"bench: {len(names)} workloads of requests together x {len(specs)} servers x {reps} rep(s), {setup}")
    report = together.run_together_bench(specs, names, reps, machine, progress=say)
    click.echo(together.render_together(report))
    if json_path:
        together.write_together_json(report, Path(json_path))
        say(f"wrote {json_path}")


def _k_list(value: Optional[str], option: str) -> Optional[list[int]]:
    """``--k-lookup 2,4``: the draft lengths; ``none``: no rows (an empty list); None when not given."""
    if value is None:
        return None
    if value.strip().lower() == "none":
        return []
    try:
        ks = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated whole numbers, got {value!r}", param_hint=option) from None
    if not ks or any(k < 1 or k > K_LIMIT for k in ks):
        raise click.BadParameter(f"each K must be from 1 to {K_LIMIT}", param_hint=option)
    return ks
