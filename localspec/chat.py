"""``localspec chat``: a terminal conversation with streamed speculative output.

``ChatSession`` holds the conversation and the settings and knows the slash
commands; ``run_chat`` is the terminal loop around it (line input, colours,
Ctrl-C and Ctrl-D). Each turn renders the whole conversation with the
model's chat template; the models' caches keep the longest shared prefix,
so only the new turn is processed.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, TextIO

import click

from .acceptance import SamplingParams
from .api import METHODS, Pair, Result
from .engine import SOURCE_BONUS, SOURCE_CORRECTION, SOURCE_DRAFT, TokenEvent
from .errors import ConfigError, LocalspecError

#: Colour of a token by where it came from (with --show-drafts on a terminal).
COLOURS = {"lookup": "cyan", "draft": "green", SOURCE_CORRECTION: "yellow", SOURCE_BONUS: "magenta"}

HELP = """\
commands:
  /help                 this list
  /reset                forget the conversation (keeps the system prompt)
  /stats                totals for this session
  /method NAME          auto, plain, draft or lookup
  /k N                  tokens drafted per round (for auto: the most)
  /temperature T        0 for greedy, above 0 to sample
  /save FILE            write the conversation as JSON
  /exit                 leave (Ctrl-D works too)
Ctrl-C stops a reply; the conversation keeps what was shown."""


@dataclass
class Totals:
    """Session totals for /stats."""

    turns: int = 0
    tokens: int = 0
    decode_seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    rounds: dict[str, int] = field(default_factory=dict)


class ChatSession:
    """A conversation with a pair, its settings, and the slash commands.

    Args:
        pair: the loaded models.
        system: optional system prompt.
        options: generation options (method, k, temperature, top_p, seed, max_tokens...).
    """

    def __init__(self, pair: Pair, system: Optional[str] = None, **options: Any):
        self.pair = pair
        self.system = system
        self.options = options
        self.messages: list[dict[str, str]] = []
        self.totals = Totals()
        self.reset()

    def reset(self) -> None:
        """Forget the conversation, keeping the system prompt."""
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def command(self, line: str) -> tuple[str, bool]:
        """Run a slash command. Returns (text to show, whether to exit).

        Raises:
            ConfigError: an unknown command or a bad value (the session is unchanged).
        """
        name, _, arg = line.strip().partition(" ")
        arg = arg.strip()
        if name in ("/exit", "/quit"):
            return "", True
        if name == "/help":
            return HELP, False
        if name == "/reset":
            self.reset()
            return "conversation cleared", False
        if name == "/stats":
            return self.stats_text(), False
        if name == "/method":
            if arg not in METHODS:
                raise ConfigError(f"/method takes one of {', '.join(METHODS)}, got {arg!r}.")
            if arg == "draft" and self.pair.draft is None:
                raise ConfigError("/method draft needs a draft model; this session has none.")
            self.options["method"] = arg
            self.options.pop("k", None)  # back to that method's default K
            return f"method: {arg}", False
        if name == "/k":
            if not arg.isdigit() or not 0 <= int(arg) <= 16:
                raise ConfigError(f"/k takes a whole number from 0 to 16, got {arg!r}.")
            self.options["k"] = int(arg)
            return f"k: {arg}", False
        if name == "/temperature":
            try:
                t = float(arg)
            except ValueError:
                raise ConfigError(f"/temperature takes a number, got {arg!r}.") from None
            SamplingParams(temperature=t, top_p=self.options.get("top_p", 1.0))  # validates
            self.options["temperature"] = t
            return f"temperature: {t:g}", False
        if name == "/save":
            if not arg:
                raise ConfigError("/save needs a file name.")
            path = Path(arg).expanduser()
            try:
                path.write_text(json.dumps({"messages": self.messages, "settings": self.options}, indent=1,
                                           ensure_ascii=False))
            except OSError as exc:
                raise ConfigError(f"Cannot write {path}: {exc.strerror}.") from exc
            return f"saved {len(self.messages)} messages to {path}", False
        raise ConfigError(f"Unknown command {name}; /help lists them.")

    def reply(self, user_text: str, on_event: Callable[[TokenEvent], None]) -> tuple[Result, bool]:
        """Answer ``user_text``, calling ``on_event`` per token.

        Returns:
            (the result, whether Ctrl-C stopped it). Either way the reply shown
            so far joins the conversation, and both caches stay consistent.
        """
        self.messages.append({"role": "user", "content": user_text})
        stream = None
        interrupted = False
        try:
            stream = self.pair.stream_chat(self.messages, **self.options)
            for ev in stream:
                on_event(ev)
        except KeyboardInterrupt:
            interrupted = True  # leaving the loop closed the stream: caches are consistent
        except LocalspecError:
            self.messages.pop()  # e.g. the conversation no longer fits the context
            raise
        if stream is None:  # Ctrl-C before generation started: the turn never happened
            self.messages.pop()
            raise KeyboardInterrupt
        result = stream.result
        self.messages.append({"role": "assistant", "content": result.text})
        self._count(result)
        return result, interrupted

    def _count(self, r: Result) -> None:
        t, s = self.totals, r.stats
        t.turns += 1
        t.tokens += s.generated_tokens
        t.decode_seconds += s.decode_seconds
        t.drafted += s.drafted
        t.accepted += s.accepted
        rounds = s.auto["rounds"] if s.auto else {s.method: s.rounds}
        for m, n in rounds.items():
            t.rounds[m] = t.rounds.get(m, 0) + n

    def stats_text(self) -> str:
        t = self.totals
        tps = t.tokens / t.decode_seconds if t.decode_seconds else 0.0
        acc = f"{t.accepted}/{t.drafted} ({100 * t.accepted / t.drafted:.0f}%)" if t.drafted else "none drafted"
        rounds = ", ".join(f"{m} {n}" for m, n in t.rounds.items() if n) or "none"
        o = self.options
        return (f"turns {t.turns}, tokens {t.tokens}, {tps:.1f} tok/s decode\n"
                f"accepted drafts: {acc}; rounds: {rounds}\n"
                f"method {o.get('method') or 'auto'}, k {o.get('k') or 'default'}, "
                f"temperature {o.get('temperature', 0.0):g}, top-p {o.get('top_p', 1.0):g}, "
                f"max tokens {o.get('max_tokens', 256)}\n"
                f"context: {self.pair.target.n_past} of {self.pair.target.n_ctx} tokens")


def run_chat(session: ChatSession, show_drafts: bool, stdout: Optional[TextIO] = None) -> None:
    """The terminal loop: read a line, run a command or stream a reply, print a summary."""
    from .cli import summary_line

    stdout = stdout or sys.stdout
    colour = stdout.isatty() and not os.environ.get("NO_COLOR")
    interactive = sys.stdin.isatty()
    if interactive:
        try:
            import readline  # noqa: F401 - line editing and history for input()
        except ImportError:
            pass

    def say(text: str, **style: Any) -> None:
        click.echo(click.style(text, **style) if colour and style else text, file=stdout, color=colour)

    say(f"localspec chat: {session.pair.target.path.name}"
        + (f" + draft {session.pair.draft.path.name}" if session.pair.draft else "") + ". /help for commands.",
        dim=True)
    if show_drafts and colour:
        say("colours: " + " ".join(click.style(name, fg=c) for name, c in (
            ("lookup", "cyan"), ("draft", "green"), ("correction", "yellow"), ("bonus", "magenta"))), dim=True)

    def on_event(ev: TokenEvent) -> None:
        fg = None
        if show_drafts and colour:
            fg = COLOURS.get(ev.drafter if ev.source == SOURCE_DRAFT else ev.source)
        click.echo(click.style(ev.text, fg=fg) if fg else ev.text, nl=False, file=stdout, color=colour)
        stdout.flush()

    while True:
        try:
            line = input(">>> " if interactive else "")
        except EOFError:
            say("")
            return
        except KeyboardInterrupt:
            say("\n(Ctrl-D or /exit to leave)", dim=True)
            continue
        if not line.strip():
            continue
        if line.startswith("/"):
            try:
                text, leave = session.command(line)
            except ConfigError as exc:
                say(f"error: {exc}", fg="red")
                continue
            if text:
                say(text)
            if leave:
                return
            continue
        try:
            result, interrupted = session.reply(line, on_event)
        except LocalspecError as exc:
            say(f"error: {exc}", fg="red")
            continue
        except KeyboardInterrupt:
            say("[interrupted before the reply began; the turn was dropped]", fg="red")
            continue
        say(" [interrupted]" if interrupted else "", fg="red")
        say(summary_line(result), dim=True)
