"""One way for tests to run the ``localspec`` command: in process (click's runner) or in a pseudo-terminal."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from click.testing import CliRunner, Result

from localspec.cli import cli


def run_cli(args: Sequence[str], input: Optional[str] = None, catch_exceptions: bool = True,
            env: Optional[dict[str, str]] = None) -> Result:
    """``localspec ARGS`` in this process; stdout and stderr apart (``r.stdout``, ``r.stderr``, ``r.output``)."""
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=catch_exceptions, env=env)


def spawn_localspec(args: Sequence[str], home: Path, *, timeout: float = 60, rows: int = 40, cols: int = 100) -> Any:
    """``localspec ARGS`` in a pseudo-terminal (pexpect), with its own home, as a person at a terminal runs it."""
    import pexpect

    env = dict(os.environ, LOCALSPEC_HOME=str(home), TERM="xterm", COLUMNS=str(cols), LINES=str(rows),
               PROMPT_TOOLKIT_NO_CPR="1")  # pexpect's terminal does not answer cursor position requests
    return pexpect.spawn(sys.executable, ["-m", "localspec", *args], env=env, encoding="utf-8", timeout=timeout,
                         dimensions=(rows, cols))
