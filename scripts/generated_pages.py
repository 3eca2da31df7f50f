"""The command line every generated docs page shares: print the pages, ``--write`` them, or ``--check`` them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Optional


def main(description: str, pages: dict[Path, Callable[[], str]], check: Callable[[], list[str]],
         argv: Optional[list[str]] = None) -> int:
    """Print ``pages`` (a path and what makes its text), write them, or say (exit 1) which ``check`` finds stale."""
    names = " and ".join(f"docs/{p.name}" for p in pages)
    parser = argparse.ArgumentParser(description=description)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"rewrite {names}")
    mode.add_argument("--check", action="store_true", help=f"exit 1 if {names} is not up to date")
    args = parser.parse_args(argv)
    if args.check:
        problems = check()
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    for path, make in pages.items():
        if args.write:
            path.write_text(make(), encoding="utf-8")
        else:
            sys.stdout.write(make())
    return 0
