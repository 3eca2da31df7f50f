"""What a llama-server build accepts, read from the program's own ``--help``.

llama.cpp renames its speculative-decoding flags from build to build
(``--draft-max`` became ``--spec-draft-n-max``, ``--spec-ngram-size-n`` became
one ``--spec-ngram-<type>-size-n`` per n-gram type). A removed flag stays in
``--help``, described as removed, and the server exits when it is given. So an
exported command is written for the build the user has: its ``--help`` lists
the options it takes and, after ``--spec-type``, the drafting types it knows.
Without a build to ask, the command is for the llama.cpp that localspec itself
runs (``PINNED_BUILD``), whose options ``pinned()`` lists; the test suite
checks that list against a llama-server built from that source.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Optional

from ..errors import ConfigError

#: The llama.cpp that llama-cpp-python 0.3.36 vendors, which localspec runs, as its ``--version`` names it.
PINNED_BUILD = "0.5.0-dev (commit ggml-org/llama.cpp@0c1e57098, the llama.cpp in llama-cpp-python 0.3.36)"

_PINNED_OPTIONS = frozenset({
    "-m", "--model", "-md", "--spec-draft-model", "-c", "--ctx-size", "--host", "--port", "-ngl", "-ngld",
    "--spec-type", "--spec-draft-n-max", "--spec-draft-n-min", "--spec-ngram-simple-size-n",
    "--spec-ngram-simple-size-m", "--spec-ngram-mod-n-match", "--spec-ngram-mod-n-min", "--spec-ngram-mod-n-max",
    "--cache-ram", "--ctx-checkpoints", "--jinja", "--api-key", "--api-key-file",
})
_PINNED_SPEC_TYPES = frozenset({
    "none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark", "ngram-simple",
    "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache",
})
_ENTRY = re.compile(r"^-{1,2}[A-Za-z]")
_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")
_GAP = re.compile(r"(?<![,\s])\s{2,}")  # between the flags and the description; not the padding after "-m,"
_REMOVED = "the argument has been removed"
_HELP_TIMEOUT_S = 30


@dataclass(frozen=True)
class ServerFlags:
    """The options one llama-server build takes.

    Attributes:
        options: every option name it accepts (removed ones left out).
        spec_types: the values its ``--spec-type`` takes; empty for a build without ``--spec-type``.
        build: which build this is, as its ``--version`` says or as localspec pins it.
        source: where the lists were read (shown to the user).
    """

    options: frozenset[str]
    spec_types: frozenset[str]
    build: str
    source: str

    def first(self, *names: str) -> Optional[str]:
        """The first of ``names`` that this build accepts, or None."""
        return next((name for name in names if name in self.options), None)


def pinned() -> ServerFlags:
    """The options of the llama-server built from the llama.cpp localspec pins (``PINNED_BUILD``)."""
    return ServerFlags(_PINNED_OPTIONS, _PINNED_SPEC_TYPES, PINNED_BUILD,
                       "localspec's list for it, as no llama-server is on the PATH (--llama-server PATH names one)")


def parse_help(text: str, build: str, source: str) -> ServerFlags:
    """The options a ``llama-server --help`` text lists.

    Each entry starts at the first column with its flags and value hint, then
    two or more spaces (or a new line) and its description. An entry whose
    description says the argument was removed is left out.

    Args:
        text: the ``--help`` output.
        build: the build's name, for messages.
        source: where the text came from, for messages.
    """
    options: set[str] = set()
    spec_types: frozenset[str] = frozenset()
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not _ENTRY.match(line):
            continue
        gap = _GAP.search(line)
        head, rest = (line[: gap.start()], line[gap.end():]) if gap else (line, "")
        description = (rest.strip() or (lines[i + 1].strip() if i + 1 < len(lines) else "")).lower()
        if description.startswith(_REMOVED):
            continue
        flags = _FLAG.findall(head)
        options.update(flags)
        if "--spec-type" in flags:
            hint = head.split("--spec-type", 1)[1].split()
            spec_types = frozenset(t for t in re.split(r"[\[\]|,]", hint[0] if hint else "") if t)
    return ServerFlags(frozenset(options), spec_types, build, source)


def read_build(program: str) -> ServerFlags:
    """Ask one llama-server binary for its options.

    Raises:
        ConfigError: it cannot be run, or its ``--help`` lists no options.
    """
    try:
        shown = subprocess.run([program, "--help"], capture_output=True, text=True, timeout=_HELP_TIMEOUT_S)
        version = subprocess.run([program, "--version"], capture_output=True, text=True, timeout=_HELP_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigError(f"Cannot run {program} --help ({exc}); give the path of a llama-server binary with "
                          "--llama-server, or leave it out for the flags of the llama.cpp localspec runs.") from None
    said = [line.strip() for line in (version.stdout + version.stderr).splitlines() if line.startswith("version:")]
    build = said[0].removeprefix("version:").strip() if said else "of unknown version"
    flags = parse_help(shown.stdout + shown.stderr, build, f"{program} --help")
    if "-m" not in flags.options and "--model" not in flags.options:
        raise ConfigError(f"{program} --help lists no -m/--model option, so it is not a llama-server; give the "
                          "path of llama.cpp's llama-server with --llama-server.")
    return flags


def find(program: Optional[str] = None) -> ServerFlags:
    """The options of the llama-server the user has: ``program`` if given, else the one on the PATH, else the pinned.

    Raises:
        ConfigError: ``program`` cannot be run or is not a llama-server.
    """
    if program:
        return read_build(program)
    on_path = shutil.which("llama-server")
    return read_build(on_path) if on_path else pinned()
