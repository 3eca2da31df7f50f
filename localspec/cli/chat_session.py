"""``localspec chat``: a terminal conversation with streamed speculative output.

``ChatSession`` holds the conversation and the settings and knows the slash
commands; ``run_chat`` is the terminal loop around it (input, colours,
Ctrl-C and Ctrl-D). Each turn renders the whole conversation with the
model's chat template; the models' caches keep the longest shared prefix,
so only the new turn is processed.

On a terminal, input goes through prompt_toolkit: a pasted block of several
lines is one message (bracketed paste), and input history is kept from one
run to the next. Anywhere, a block typed between two lines of three double
quotes is one message, as in Ollama.
"""

from __future__ import annotations

import base64
import json
import mimetypes
import os
import shlex
import shutil
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, TextIO

import click

from ..api import Pair
from ..errors import ConfigError, LocalspecError
from ..events import SOURCE_BONUS, SOURCE_CORRECTION, SOURCE_DRAFT, TokenEvent
from ..images import MAX_IMAGE_BYTES, ImageError
from ..methods import K_LIMIT, REGISTRY
from ..options import GenerationOptions
from ..paths import home
from ..results import Result, Stream

#: Colour of a token the target chose itself where a draft was rejected, or after a fully kept one.
SOURCE_COLOURS = {SOURCE_CORRECTION: "yellow", SOURCE_BONUS: "magenta"}


def colours() -> dict[str, str]:
    """Colour of a token by where it came from (with --show-drafts on a terminal): its drafter's, or its source's."""
    return {**{m.name: m.colour for m in REGISTRY if m.colour}, **SOURCE_COLOURS}

#: Slash commands that set one generation option: the option, how to parse the value, what it must be.
SETTERS: dict[str, tuple[str, Callable[[str], Any], str]] = {
    "/k": ("k", int, f"a whole number from 0 to {K_LIMIT}"),
    "/temperature": ("temperature", float, "a number"),
    "/top-p": ("top_p", float, "a number in (0, 1]"),
    "/max-tokens": ("max_tokens", int, "a whole number"),
}

HELP = """\
commands:
  /help                 this list
  /reset                forget the conversation (keeps the system prompt)
  /stats                totals for this chat
  /method NAME          how to draft: {methods}
  /k N                  tokens drafted per round (one pass that checks them), 0 to {k_limit} (for auto: the most)
  /temperature T        0 for greedy, above 0 to sample
  /top-p P              nucleus sampling mass (1: off)
  /max-tokens N         the longest reply
  /think [on|off|auto]  let a reasoning model think first, or not (alone: toggle; auto: as its template has it)
  /think-budget N|off   the most tokens it thinks for before it must answer
  /save FILE            write the conversation as JSON
  /image FILE           attach an image to your next message (a model with a vision projector;
                        an image file's path dropped into a message attaches it too)
  /exit                 leave (Ctrl-D works too)
Several lines as one message: paste them (on a terminal), or type \"\"\" on a
line of its own, then the lines, then \"\"\" again.
Ctrl-C stops a reply; the conversation keeps what was shown."""


def help_text() -> str:
    """The /help text, with the drafting methods registered now."""
    methods = "; ".join(f"{m.name} ({m.label})" for m in REGISTRY)
    return HELP.format(methods=methods, k_limit=K_LIMIT)


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
        options: generation options (default: the pair's defaults).
    """

    def __init__(self, pair: Pair, system: Optional[str] = None, options: Optional[GenerationOptions] = None):
        self.pair = pair
        self.system = system
        self.options = options if options is not None else pair.defaults
        self.messages: list[dict[str, Any]] = []
        #: Images attached to the next message (``/image``, or paths dropped into it): each file's path and bytes,
        #: read once, so that a screenshot deleted later still goes with every turn.
        self.attached: list[tuple[Path, bytes]] = []
        self.totals = Totals()
        self.reset()

    def reset(self) -> None:
        """Forget the conversation, keeping the system prompt."""
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.attached = []

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
            return help_text(), False
        if name == "/reset":
            self.reset()
            return "conversation cleared", False
        if name == "/stats":
            return self.stats_text(), False
        if name == "/method":
            method = REGISTRY.find(arg)
            if method is not None and method.needs_draft and self.pair.draft is None:
                raise ConfigError(f"/method {arg} needs a draft model; this session has none.")
            if method is not None and method.needs_head and not self.pair.target.n_nextn:
                raise ConfigError(f"/method {arg} needs a target with an MTP head; this one has none.")
            self.options = self.options.replace(method=arg, k=None)  # back to that method's default K
            return f"method: {arg}", False
        if name in SETTERS:
            option, parse, what = SETTERS[name]
            try:
                value = parse(arg)
            except ValueError:
                raise ConfigError(f"{name} takes {what}, got {arg!r}.") from None
            self.options = self.options.replace(**{option: value})  # validated there, once
            return f"{name[1:]}: {value:g}", False
        if name == "/think":
            return self._think(arg), False
        if name == "/think-budget":
            try:
                budget = None if arg == "off" else int(arg)
            except ValueError:
                raise ConfigError(f"/think-budget takes a whole number of tokens or off, got {arg!r}.") from None
            self.options = self.options.replace(think_budget=budget)
            return f"think budget: {arg}", False
        if name == "/image":
            return self._attach(Path(arg.strip("'\"")).expanduser() if arg else None), False
        if name == "/save":
            if not arg:
                raise ConfigError("/save needs a file name.")
            path = Path(arg).expanduser()
            try:
                path.write_text(json.dumps({"messages": [_saved(m) for m in self.messages],
                                            "settings": self.options.to_dict()}, indent=1, ensure_ascii=False))
            except OSError as exc:
                raise ConfigError(f"Cannot write {path}: {exc.strerror}.") from exc
            return f"saved {len(self.messages)} messages to {path}", False
        raise ConfigError(f"Unknown command {name}; /help lists them.")

    def _attach(self, path: Optional[Path]) -> str:
        """Attach an image file to the next message."""
        if path is None:
            raise ConfigError("/image needs an image file's path.")
        if self.pair.target.projector is None:
            raise ConfigError(f"{self.pair.target.path.name} was loaded without a vision projector, so it cannot "
                              "read images; start chat with --mmproj FILE.")
        try:
            if path.stat().st_size > MAX_IMAGE_BYTES:
                raise ConfigError(f"{path} is larger than the {MAX_IMAGE_BYTES >> 20} MiB an image may be.")
            self.attached.append((path, path.read_bytes()))
        except OSError as exc:
            raise ConfigError(f"Cannot read the image {path}: {exc.strerror or exc}.") from None
        return f"image {len(self.attached)} attached: {path.name} (it goes with your next message)"

    def dropped(self, text: str) -> str:
        """``text`` without the image files' paths a terminal pasted into it (a file dropped on the window),
        each attached instead; unchanged for a model without a projector."""
        if self.pair.target.projector is None:
            return text
        for word in _words(text):
            path = Path(word).expanduser()  # a dropped file's path is whole: a relative one is a file's name in prose
            if path.is_absolute() and path.suffix.lower() in IMAGE_SUFFIXES and path.is_file():
                self._attach(path)
                # the path as the terminal wrote it: quoted, its spaces escaped, or bare
                forms = (f"'{word}'", f'"{word}"', word.replace(" ", "\\ "), word)
                written = next((w for w in forms if w in text), "")
                text = text.replace(written, "", 1)
        return text.strip() if self.attached else text

    def _think(self, arg: str) -> str:
        """Set thinking on, off, or back to the template's default; without ``arg``, toggle it."""
        words = {"on": True, "off": False, "auto": None}
        if arg and arg not in words:
            raise ConfigError(f"/think takes on, off or auto, got {arg!r}.")
        think = words[arg] if arg else self.options.think is False
        self.options = self.options.replace(think=think)
        return "thinking: " + {True: "on", False: "off", None: "auto"}[think]

    def reply(self, user_text: str, on_event: Callable[[TokenEvent], None]) -> tuple[Result, bool]:
        """Answer ``user_text``, calling ``on_event`` per token.

        Returns:
            (the result, whether Ctrl-C stopped it). Either way the reply shown
            so far joins the conversation, and both caches stay consistent.
        """
        user_text = self.dropped(user_text)
        content: Any = user_text
        attached, self.attached = self.attached, []
        if attached:
            content = [{"type": "image", "image": data, "name": str(path)} for path, data in attached]
            content += [{"type": "text", "text": user_text}] if user_text else []
        self.messages.append({"role": "user", "content": content})
        interrupted = False
        stream: Optional[Stream] = None
        try:
            stream = self.pair.stream_chat(self.messages, self.options)
            for ev in stream:  # the prompt is processed inside the first step
                on_event(ev)
        except KeyboardInterrupt:
            interrupted = True  # leaving the loop closed the stream: caches are consistent
        except LocalspecError as exc:
            self.messages.pop()  # e.g. the conversation no longer fits the context, an unreadable image
            if not isinstance(exc, ImageError):
                self.attached = attached  # attached still, for the next try (an unreadable image is dropped)
            raise
        if interrupted and (stream is None or not stream.result.tokens):
            # Ctrl-C before the first token (while the prompt was processed): the turn never happened.
            self.messages.pop()
            self.attached = attached
            raise KeyboardInterrupt
        assert stream is not None  # only Ctrl-C can leave it unset
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
        for m, n in s.rounds_by_method.items():
            t.rounds[m] = t.rounds.get(m, 0) + n

    def stats_text(self) -> str:
        t = self.totals
        tps = t.tokens / t.decode_seconds if t.decode_seconds else 0.0
        acc = f"{t.accepted}/{t.drafted} ({100 * t.accepted / t.drafted:.0f}%)" if t.drafted else "none drafted"
        rounds = ", ".join(f"{m} {n}" for m, n in t.rounds.items() if n) or "none"
        o = self.options
        return (f"turns {t.turns}, tokens {t.tokens}, {tps:.1f} tok/s decode\n"
                f"accepted drafts: {acc}; rounds: {rounds}\n"
                f"method {o.method}, k {'default' if o.k is None else o.k}, "
                f"temperature {o.temperature:g}, top-p {o.top_p:g}, max tokens {o.max_tokens}\n"
                f"context: {self.pair.target.n_past} of {self.pair.target.n_ctx} tokens")


#: The file suffixes of images a message may hold by their path.
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".gif", ".bmp"})


def _saved(message: dict[str, Any]) -> dict[str, Any]:
    """A message as /save writes it: an image as a data: URL (JSON holds no bytes), beside its file's path."""
    if not isinstance(message.get("content"), list):
        return message
    parts = [{"type": "image", "image": f"data:{mimetypes.guess_type(p['name'])[0] or 'image/png'};base64,"
                                       + base64.b64encode(p["image"]).decode(), "name": p["name"]}
             if p.get("type") == "image" else p for p in message["content"]]
    return {**message, "content": parts}


def _words(text: str) -> list[str]:
    """``text`` split as a shell would (a dropped path may be quoted or escape its spaces), or on spaces."""
    try:
        return shlex.split(text)
    except ValueError:  # an unmatched quote: an apostrophe in prose
        return text.split()


class Reader:
    """Reads one message at a time: a line, a pasted block, or a \"\"\"-quoted block.

    Args:
        interactive: read from a terminal through prompt_toolkit (line
            editing, bracketed paste, history kept in ``history_file``);
            otherwise plain lines from ``stdin``.
    """

    QUOTES = '"""'

    def __init__(self, interactive: bool, history_file: Optional[Path] = None, stdin: Optional[TextIO] = None):
        self._stdin = stdin or sys.stdin
        self._session: Any = None
        if interactive:
            from prompt_toolkit import PromptSession
            from prompt_toolkit.history import FileHistory, InMemoryHistory

            history: Any = InMemoryHistory()
            if history_file is not None:
                try:
                    history_file.parent.mkdir(parents=True, exist_ok=True)
                    history_file.touch(mode=0o600)  # what the user typed: theirs alone to read
                    history_file.chmod(0o600)  # also a file an older version left readable to others
                    history = FileHistory(str(history_file))
                except OSError:
                    pass  # no history across runs, but chat still works
            self._session = PromptSession(history=history)

    def _line(self, prompt: str) -> str:
        if self._session is not None:
            return str(self._session.prompt(prompt))
        line = self._stdin.readline()
        if not line:
            raise EOFError
        return line.rstrip("\n")

    def read(self) -> str:
        """The next message (Ctrl-D or end of input: EOFError; Ctrl-C at the prompt: KeyboardInterrupt)."""
        first = self._line(">>> ")
        if not first.strip().startswith(self.QUOTES):
            return first
        text = first.strip()[len(self.QUOTES):]
        if text.endswith(self.QUOTES):  # \"\"\"one line\"\"\"
            return text[: -len(self.QUOTES)]
        lines = [text] if text else []
        while True:
            line = self._line("... ")
            if line.rstrip().endswith(self.QUOTES):
                last = line.rstrip()[: -len(self.QUOTES)]
                if last:
                    lines.append(last)
                return "\n".join(lines)
            lines.append(line)


def _fit(line: str, stdout: TextIO) -> str:
    """Wrap a status line at the terminal's width (80 columns off a terminal), continuations indented."""
    width = shutil.get_terminal_size((80, 24)).columns if stdout.isatty() else 80
    return textwrap.fill(line, width=max(width, 40), subsequent_indent="  ", break_long_words=False,
                         break_on_hyphens=False)


class ThinkingBlock:
    """A reply's reasoning on screen: dimmed as it streams, folded to one line once the answer begins.

    On a colour terminal the block's rows are erased when it closes and a one-line summary takes their
    place; elsewhere (a pipe, NO_COLOR) the whole reasoning stays, followed by a blank line.
    """

    def __init__(self, stdout: TextIO, colour: bool):
        self.stdout, self.colour = stdout, colour
        self.text = ""  # the reasoning shown so far
        self.open = False

    def add(self, piece: str) -> None:
        if not self.open:
            self._echo(self._dim(HEADER))
            self.open = True
        self.text += piece
        self._echo(self._dim(piece))

    def close(self) -> None:
        """End the block (idempotent): fold it on a colour terminal, else leave it and a blank line."""
        if not self.open:
            return
        self.open = False
        if not self.colour:
            self._echo("\n\n")
            return
        width = max(shutil.get_terminal_size((80, 24)).columns, 20)
        rows = _rows(HEADER + self.text, width)
        # back to the block's first row (the cursor is on its last), then erase to the end of the screen
        self._echo("\r" + (f"\x1b[{rows - 1}A" if rows > 1 else "") + "\x1b[J")
        self._echo(self._dim(_fold(self.text, len(self.text.split()), width)) + "\n")

    def _dim(self, text: str) -> str:
        return click.style(text, dim=True) if self.colour else text

    def _echo(self, text: str) -> None:
        click.echo(text, nl=False, file=self.stdout, color=self.colour)


HEADER = "thinking: "


def _rows(text: str, width: int) -> int:
    """The terminal rows ``text`` takes when printed from column 0 at ``width`` columns (one cell a character)."""
    return sum(max(1, -(-len(line) // width)) for line in text.split("\n"))


def _fold(reasoning: str, words: int, width: int) -> str:
    """One line that stands for a folded reasoning block: its opening words and its length."""
    head, tail = "thought: " + " ".join(reasoning.split()), f" ({words} words)"
    room = width - 1  # the last column would wrap on some terminals
    if len(head) + len(tail) <= room:
        return head + tail
    keep = room - len(tail) - 3
    if keep <= len("thought: "):  # too narrow for the count: the opening words alone
        return head if len(head) <= room else head[: room - 3] + "..."
    return head[:keep].rstrip() + "..." + tail


def run_chat(session: ChatSession, show_drafts: bool, stdout: Optional[TextIO] = None,
             reader: Optional[Reader] = None) -> None:
    """The terminal loop: read a message, run a command or stream a reply, print a summary."""
    stdout = stdout or sys.stdout
    colour = stdout.isatty() and not os.environ.get("NO_COLOR")
    if reader is None:
        reader = Reader(sys.stdin.isatty() and stdout.isatty(), home() / "chat_history")

    def say(text: str, **style: Any) -> None:
        click.echo(click.style(text, **style) if colour and style else text, file=stdout, color=colour)

    say(f"localspec chat: {session.pair.target.path.name}"
        + (f" + draft {session.pair.draft.path.name}" if session.pair.draft else "") + ". /help for commands.",
        dim=True)
    palette = colours()
    if show_drafts and colour:
        say("colours: " + " ".join(click.style(name, fg=c) for name, c in palette.items()), dim=True)

    block = ThinkingBlock(stdout, colour)  # a reasoning model's thinking, before the answer

    def on_event(ev: TokenEvent) -> None:
        if ev.reasoning:
            block.add(ev.reasoning)
        if ev.text:
            block.close()
        fg = None
        if show_drafts and colour:
            fg = palette.get(ev.drafter if ev.source == SOURCE_DRAFT else ev.source)
        click.echo(click.style(ev.text, fg=fg) if fg else ev.text, nl=False, file=stdout, color=colour)
        stdout.flush()

    while True:
        try:
            text = reader.read()
        except EOFError:
            say("")
            return
        except KeyboardInterrupt:
            say("(Ctrl-D or /exit to leave)", dim=True)
            continue
        if not text.strip():
            continue
        if text.startswith("/"):
            try:
                reply, leave = session.command(text)
            except ConfigError as exc:
                say(f"error: {exc}", fg="red")
                continue
            if reply:
                say(reply)
            if leave:
                return
            continue
        block = ThinkingBlock(stdout, colour)
        try:
            result, interrupted = session.reply(text, on_event)
        except LocalspecError as exc:
            say(f"error: {exc}", fg="red")
            continue
        except KeyboardInterrupt:
            say("[interrupted before the reply began; the turn was dropped]", fg="red")
            continue
        say(" [interrupted]" if interrupted else "", fg="red")
        say(_fit(result.summary_line(), stdout), dim=True)
