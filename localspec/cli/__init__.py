"""The ``localspec`` command line: one module per command group, each a thin layer over the library.

Layer: an entry point, with ``server`` and ``bench``: it may import every layer below, and nothing in
localspec imports it. ``shared`` holds what the commands share (errors as one sentence, the model and
generation options); ``chat_session`` is the terminal conversation behind ``chat``. Commands import the
library inside their bodies, so ``localspec --help`` starts without loading llama.cpp.
"""

from __future__ import annotations

import click

from .. import __version__
from .bench import bench
from .cache import cache
from .calibrate import calibrate
from .chat import chat
from .embed import embed
from .export import export
from .generate import generate
from .history import history
from .models import add, check, models, pull
from .serve import serve


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="localspec")
def cli() -> None:
    """Fast local generation with speculative decoding over llama.cpp.

    Greedy output is the tokens plain decoding of the target gives (up to numeric
    ties, more of them on a GPU) and sampling keeps its distribution; a draft
    model or prompt lookup only changes how fast it comes.
    """


for _command in (generate, chat, serve, embed, models, add, pull, check, export, history, cache, calibrate, bench):
    cli.add_command(_command)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="localspec")
