"""``localspec generate --input FILE.jsonl``: many requests from a file, decoded together, each result a line.

Each input line is one JSON object: ``prompt`` (raw text), ``messages`` (a chat conversation) or ``message``
(one user turn, with an optional ``system``), an optional ``id``, and any generation options for that line
alone (``max_tokens``, ``temperature``, ``seed``, ``stop``...). Each output line is the line's ``id`` (or its
line number), then what ``generate --json`` prints, or ``error``: the sentence that says what is wrong with
the line (not JSON, an unknown field, a bad option) or why its generation failed. Every good line is answered
whatever the others hold. Lines whose id has a result in the output file are skipped, so a run stopped part
way goes on where it stopped; a line that failed is tried again (its error line stays, its result follows).
Without ids, a line is known by its number: give ids to a file that may change between runs.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Optional

import click

from ..errors import LocalspecError
from ..options import OPTION_NAMES, GenerationOptions

#: What a line names besides generation options.
FIELDS = ("id", "prompt", "messages", "message", "system")


@dataclass
class Job:
    """One input line: where it was, its id, its prompt and its own option changes; or, for a bad line, the
    sentence that says what is wrong with it (``error``)."""

    line: int
    id: Any
    prompt: Any
    changes: dict[str, Any]
    error: Optional[str] = None


class BadLine(ValueError):
    """What is wrong with one input line, in a sentence that names it."""


def read_jobs(path: str) -> list[Job]:
    """The jobs of a JSON-lines file (``-``: standard input), a bad line among them as a job with its ``error``.

    Raises:
        click.UsageError: the file cannot be read.
    """
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise click.UsageError(f"--input {path} could not be read ({exc}).") from None
    jobs, ids = [], set()
    for n, raw in enumerate(text.split("\n"), start=1):  # not splitlines: JSON text may hold U+2028 raw
        if not raw.strip():
            continue
        try:
            job = _job(path, n, raw)
            if job.id in ids:
                raise BadLine(f"{path}, line {n}: the id {job.id!r} is on an earlier line too; give each line its "
                              "own id.")
        except BadLine as exc:
            job = Job(n, _id_of(raw, n), None, {}, str(exc))
        ids.add(job.id)
        jobs.append(job)
    return jobs


def _id_of(raw: str, n: int) -> Any:
    """The id a bad line's error is written under: its own, where it has a usable one, else its number."""
    try:
        obj = json.loads(raw)
    except ValueError:
        return n
    ident = obj.get("id") if isinstance(obj, dict) else None
    return ident if isinstance(ident, (str, int)) and not isinstance(ident, bool) else n


def _job(path: str, n: int, raw: str) -> Job:
    where = f"{path}, line {n}"
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise BadLine(f"{where} is not JSON ({exc}); each line is one JSON object.") from None
    if not isinstance(obj, dict):
        raise BadLine(f"{where} is not a JSON object; give {{\"prompt\": ...}} or {{\"messages\": [...]}}.")
    given = [k for k in ("prompt", "messages", "message") if k in obj]
    if len(given) != 1:
        raise BadLine(f"{where} needs exactly one of \"prompt\" (raw text), \"messages\" (a conversation) or "
                      f"\"message\" (one user turn); it has {', '.join(given) or 'none'}.")
    unknown = sorted(set(obj) - set(FIELDS) - set(OPTION_NAMES))
    if unknown:
        raise BadLine(f"{where} has {unknown[0]!r}, which is neither a field ({', '.join(FIELDS)}) nor a "
                      "generation option.")
    if "system" in obj and "message" not in obj:
        raise BadLine(f"{where}: \"system\" goes with \"message\" (in \"messages\", give a system turn).")
    prompt: Any = obj.get("prompt")
    if "messages" in obj:
        prompt = obj["messages"]
        if not isinstance(prompt, list) or not prompt or not all(isinstance(m, dict) for m in prompt):
            raise BadLine(f"{where}: \"messages\" must be a non-empty list of {{\"role\", \"content\"}} objects.")
    elif "message" in obj:
        if not isinstance(obj["message"], str):
            raise BadLine(f"{where}: \"message\" must be text, the user's turn.")
        prompt = ([{"role": "system", "content": obj["system"]}] if obj.get("system") else []) + [
            {"role": "user", "content": obj["message"]}]
    elif not isinstance(prompt, str) or not prompt:
        raise BadLine(f"{where}: \"prompt\" must be non-empty text.")
    ident = obj.get("id", n)
    if isinstance(ident, bool) or not isinstance(ident, (str, int)):
        raise BadLine(f"{where}: \"id\" must be text or a whole number, not {json.dumps(ident)}.")
    changes = {k: v for k, v in obj.items() if k in OPTION_NAMES}
    return Job(n, ident, prompt, changes)


def answered(path: Optional[str]) -> set[Any]:
    """The ids an earlier run wrote to the output file with a result (a line with an error is tried again)."""
    if path is None or path == "-" or not Path(path).is_file():
        return set()
    done = set()
    for raw in Path(path).read_text(encoding="utf-8", errors="replace").split("\n"):
        try:
            obj = json.loads(raw)
        except ValueError:
            continue  # a line cut short when the last run stopped: tried again
        if isinstance(obj, dict) and isinstance(obj.get("id"), (str, int)) and "error" not in obj:
            done.add(obj["id"])
    return done


def options_for(jobs: list[Job], base: GenerationOptions, path: str = "--input") -> list[GenerationOptions]:
    """Each job's options: ``base`` with its line's changes; a line with a bad value gets its ``error`` (and
    ``base``, unused)."""
    out = []
    for job in jobs:
        try:
            out.append(base.replace(**job.changes) if job.changes else base)
        except LocalspecError as exc:
            job.error = f"{path}, line {job.line}: {exc}"
            out.append(base)
    return out


def write_line(out: IO[str], job: Job, result: Any) -> None:
    """The job's output line, flushed at once (a run stopped later keeps it); ``result`` is its result, its
    exception, or the sentence that refused its line."""
    if isinstance(result, (BaseException, str)):
        obj: dict[str, Any] = {"id": job.id, "error": str(result)}
    else:
        obj = {"id": job.id, **result.to_dict()}
    out.write(json.dumps(obj, ensure_ascii=False) + "\n")
    out.flush()


def run(pair: Any, jobs: list[Job], output: Optional[str], base: GenerationOptions, path: str = "--input") -> int:
    """Answer the jobs not yet in ``output`` (None or ``-``: standard output), decoded together, each written as
    it finishes, a bad line's error first; a progress bar on standard error. Returns how many failed."""
    done = answered(output)
    todo = [j for j in jobs if j.id not in done]
    if done:
        click.echo(f"localspec: {len(jobs) - len(todo)} of {len(jobs)} lines are in {output} already; "
                   f"{len(todo)} to go", err=True)
    opts = options_for(todo, base, path)
    if output is None or output == "-":
        return _run(pair, todo, opts, sys.stdout)
    written = Path(output)
    if written.is_file() and written.stat().st_size and not written.read_bytes().endswith(b"\n"):
        with written.open("a", encoding="utf-8") as out:  # a line cut short by the last run ends here
            out.write("\n")
    with written.open("a", encoding="utf-8") as out:
        return _run(pair, todo, opts, out)


def _run(pair: Any, jobs: list[Job], opts: list[GenerationOptions], out: IO[str]) -> int:
    failed = 0
    for job in jobs:
        if job.error is not None:
            write_line(out, job, job.error)
            failed += 1
    good = [i for i, job in enumerate(jobs) if job.error is None]
    jobs, opts = [jobs[i] for i in good], [opts[i] for i in good]
    results = pair.generate_each([j.prompt for j in jobs], opts)
    try:
        with click.progressbar(length=len(jobs), label="generating", file=sys.stderr, show_pos=True,
                               show_eta=True) as bar:
            for i, result in results:
                write_line(out, jobs[i], result)
                failed += isinstance(result, BaseException)
                bar.update(1)
    finally:  # Ctrl-C: the generations under way are cancelled, and what was written stays
        results.close()
    return failed
