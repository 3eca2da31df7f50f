"""``localspec generate``: one continuation or one chat reply, printed as it comes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import click

from ..options import GenerationOptions
from ..structured.call_reader import call_reader
from ..structured.tool_use import ToolUse
from .shared import ModelArgs, friendly_errors, generation_options, model_options

if TYPE_CHECKING:
    from ..constraint import Constraint


@click.command()
@model_options
@generation_options
@click.option("--prompt", "-p", default=None, help="Raw prompt text, sent as is.")
@click.option("--message", default=None, help="One user message, formatted with the model's chat template.")
@click.option("--system", default=None, help="System message to go with --message.")
@click.option("--image", "images", multiple=True, type=click.Path(dir_okay=False, exists=True), metavar="FILE",
              help="An image for --message to hold, before its text (repeatable; a model with a vision projector, "
                   "see --mmproj).")
@click.option("--suffix", default=None,
              help="Fill in the middle: the text after the one to generate (--prompt is the text before it).")
@click.option("--recalibrate", is_flag=True, help="Measure this machine's costs again for auto.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: text, tokens, finish_reason, stats.")
@click.option("--json-schema", "json_schema", type=click.Path(dir_okay=False, exists=True), default=None,
              help="The reply is JSON valid against this schema file (needs the 'structured' extra).")
@click.option("--json-object", is_flag=True, help="The reply is a JSON object (JSON mode).")
@click.option("--regex", default=None, help="The reply matches this regular expression whole.")
@click.option("--grammar", "grammar_file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="The reply follows this grammar file: GBNF as llama.cpp writes it (.gbnf), else Lark.")
@click.option("--tools", "tools_file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Functions the model may call with --message: a JSON file of OpenAI's tools list "
                   "(needs the 'structured' extra). The calls print as JSON lines after the reply.")
@click.option("--tool-choice", default=None,
              help="With --tools: auto (the model decides; the default), none, required, or a function's name.")
@click.option("--input", "input_file", default=None, metavar="FILE.jsonl",
              help="Many requests, one JSON object a line ({\"prompt\": ...}, {\"messages\": [...]} or "
                   "{\"message\": ...}, with an optional \"id\" and options), decoded together ('-': stdin).")
@click.option("--output", "output_file", default=None, metavar="FILE.jsonl",
              help="With --input: where each result goes as a JSON line (default: stdout); lines it already "
                   "answers are skipped, so a stopped run goes on.")
@click.option("--parallel", type=click.IntRange(1, 64), default=None,
              help="With --input: requests decoded at once [default: automatic].")
@friendly_errors
def generate(models: ModelArgs, options: GenerationOptions, prompt: Optional[str], message: Optional[str],
             system: Optional[str], images: tuple[str, ...], suffix: Optional[str], recalibrate: bool, as_json: bool,
             json_schema: Optional[str], json_object: bool, regex: Optional[str], grammar_file: Optional[str],
             tools_file: Optional[str], tool_choice: Optional[str], input_file: Optional[str],
             output_file: Optional[str], parallel: Optional[int]) -> None:
    """Generate a continuation of --prompt, a reply to --message, or the middle between --prompt and --suffix;
    or answer every line of --input FILE.jsonl."""
    constraint = _constraint(json_schema, json_object, regex, grammar_file)
    if constraint is not None:
        options = options.replace(grammar=constraint)
    if input_file is not None or output_file is not None or parallel is not None:
        single = [flag for flag, given in (("--prompt", prompt), ("--message", message), ("--system", system),
                                           ("--image", images or None), ("--suffix", suffix), ("--tools", tools_file),
                                           ("--tool-choice", tool_choice), ("--json", as_json or None))
                  if given is not None]
        _from_file(models, options, input_file, output_file, parallel, recalibrate, single)
        return
    if (prompt is None) == (message is None):
        raise click.UsageError("Give exactly one of --prompt (raw text) or --message (a chat turn), or --input "
                               "FILE.jsonl.")
    if system is not None and message is None:
        raise click.UsageError("--system goes with --message, not with a raw --prompt.")
    if images and message is None:
        raise click.UsageError("--image goes with --message (a chat turn), which the model's template wraps with "
                               "the image.")
    if suffix is not None and prompt is None:
        raise click.UsageError("--suffix goes with --prompt (the text before the one to fill in).")
    if options.logprobs is not None and not as_json:
        raise click.UsageError("--logprobs shows in the --json output; add --json.")
    if (tools_file is not None or tool_choice is not None) and message is None:
        raise click.UsageError("--tools and --tool-choice go with --message (a chat turn).")
    if tool_choice is not None and tools_file is None:
        raise click.UsageError("--tool-choice goes with --tools FILE.")
    tools = _tools(tools_file, tool_choice)
    with models.open(options.method) as pair:
        if recalibrate:
            pair.calibrate(refresh=True)
        if message is not None:
            content: Any = [*({"type": "image", "image": f} for f in images), {"type": "text", "text": message}] \
                if images else message
            messages = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": content}]
            stream = pair.stream_chat(messages, options, tools=tools)
        elif suffix is not None:
            stream = pair.stream_infill(prompt or "", suffix, options)
        else:
            stream = pair.stream(prompt or "", options)
        if as_json:
            for _ in stream:
                pass
            click.echo(json.dumps(stream.result.to_dict(), ensure_ascii=False))
            return
        reader = call_reader(tools)
        shown = 0
        for ev in stream:  # with tools, the reply's content as it comes (its calls are printed whole below)
            if ev.reasoning:  # a reasoning model's thinking goes to stderr, dimmed: stdout is the answer
                click.echo(click.style(ev.reasoning, dim=True), nl=False, err=True)
            click.echo("".join(e.text for e in reader.feed(ev.text) if e.kind == "content") if reader else ev.text,
                       nl=False)
            shown += len(ev.text)
        result = stream.result
        rest = result.text[shown:]  # held back to the end: an incomplete last character
        if reader is not None:
            click.echo("".join(e.text for e in reader.feed(rest) + reader.close() if e.kind == "content"), nl=False)
        else:
            click.echo(rest, nl=False)
        click.echo()
        if result.reasoning:
            click.echo(err=True)
        for call in result.tool_calls or []:
            click.echo(json.dumps(call.to_openai(), ensure_ascii=False))
        click.echo(result.summary_line(), err=True)


def _from_file(models: ModelArgs, options: GenerationOptions, input_file: Optional[str], output_file: Optional[str],
               parallel: Optional[int], recalibrate: bool, single: list[str]) -> None:
    """``--input FILE.jsonl``: every line answered, into ``--output``."""
    from .jsonl import read_jobs, run

    if input_file is None:
        raise click.UsageError("--output and --parallel go with --input FILE.jsonl.")
    if single:
        raise click.UsageError(f"--input takes the requests from its file; leave out {', '.join(single)} (each "
                               "output line is what --json prints; a line gives its own system turn as "
                               "\"system\" or in \"messages\").")
    jobs = read_jobs(input_file)  # a file that cannot be read is said before the models load
    with models.open(options.method, parallel=parallel) as pair:
        if recalibrate:
            pair.calibrate(refresh=True)
        failed = run(pair, jobs, output_file, options, input_file)
    if failed:
        again = (f"{output_file} and is tried again by the next run" if output_file not in (None, "-")
                 else "the output")
        raise click.ClickException(f"{failed} line{'s' if failed > 1 else ''} failed; each has its reason in "
                                   f"{again}.")


def _tools(tools_file: Optional[str], tool_choice: Optional[str]) -> Optional[ToolUse]:
    """The tools in ``--tools FILE`` (None without it)."""
    if tools_file is None:
        return None
    try:
        listed = json.loads(Path(tools_file).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise click.UsageError(f"--tools {tools_file} is not a JSON file ({exc}).") from None
    if not isinstance(listed, list) or not listed:
        raise click.UsageError(f"--tools {tools_file} must hold a JSON list of tools, as OpenAI's 'tools' field: "
                               '[{"type": "function", "function": {"name": ..., "parameters": {...}}}].')
    return ToolUse.from_openai(listed, tool_choice)


def _constraint(json_schema: Optional[str], json_object: bool, regex: Optional[str],
                grammar_file: Optional[str]) -> Optional[Constraint]:
    """The one constraint the flags ask for (None: free text)."""
    from ..constraint import Constraint

    given = [x for x in (json_schema, json_object or None, regex, grammar_file) if x is not None]
    if len(given) > 1:
        raise click.UsageError("Give at most one of --json-schema, --json-object, --regex and --grammar.")
    if json_schema is not None:
        return Constraint.json_schema(Path(json_schema).read_text(encoding="utf-8"))
    if json_object:
        return Constraint.json_object()
    if regex is not None:
        return Constraint.regex(regex)
    if grammar_file is not None:
        return Constraint.grammar_file(grammar_file)
    return None
