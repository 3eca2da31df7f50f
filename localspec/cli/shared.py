"""What every command shares: errors as one sentence, the model options and the generation options.

A command that fails on a ``LocalspecError`` prints it as one sentence
(``Error: ...``) with exit status 1, never a traceback. Generation options are
derived from ``GenerationOptions``; llama.cpp is imported only once a model
is needed, so ``localspec --help`` starts fast.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Optional, Union

import click

from ..errors import LocalspecError
from ..methods import REGISTRY
from ..options import GenerationOptions

if TYPE_CHECKING:
    from ..api import Pair
    from ..catalog.naming import Resolved

#: ``--flash-attn`` values and what ``load`` is given for each.
FLASH_ATTN = {"auto": None, "on": True, "off": False}
#: How a context's flash attention setting reads (None: left to llama.cpp, on a GPU).
FLASH_ATTN_SHOWN = {True: "on", False: "off", None: "llama.cpp's choice"}


@contextlib.contextmanager
def errors_as_messages() -> Iterator[None]:
    """Turn library errors into one-line messages and Ctrl-C into a clean exit."""
    try:
        yield
    except LocalspecError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        click.echo("\ninterrupted", err=True)
        sys.exit(130)


def friendly_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a command inside ``errors_as_messages``."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with errors_as_messages():
            return fn(*args, **kwargs)

    return wrapper


def say(line: str) -> None:
    """A notice for a person, on stderr (stdout is the command's output)."""
    click.echo(line, err=True)


@dataclass
class ModelArgs:
    """Which models to load (a pair name or files) and how."""

    pair_name: Optional[str]
    target: Optional[str]
    draft: Optional[str]
    n_ctx: Optional[int]
    n_threads: Optional[int]
    n_threads_batch: Optional[int]
    n_gpu_layers: Optional[int]
    flash_attn: str
    huge_pages: bool
    verbose: bool
    cache_ram: Optional[int] = None
    cache_disk: Optional[int] = None
    mmproj: Optional[str] = None

    def open(self, method: Optional[str] = None, prompt_cache: Optional[bool] = None, fit: bool = False,
             parallel: Optional[int] = 1) -> Pair:
        """Load the registered pair by name, or the target (and draft) given as files or as the scan's names.

        A target given without a draft gets the best draft found on this machine
        (``localspec models --scan``), said on stderr, unless ``method`` needs none.
        ``prompt_cache`` False loads it without one; ``fit`` without --ctx chooses the context the memory
        holds (see ``load``); ``parallel`` is how many generations it can decode together (None: automatic).
        """
        from ..loading import load

        model, draft = self._model_and_draft(method)
        return load(model, draft, n_ctx=self.n_ctx, n_threads=self.n_threads, n_threads_batch=self.n_threads_batch,
                    n_gpu_layers=self.n_gpu_layers, verbose=self.verbose, flash_attn=FLASH_ATTN[self.flash_attn],
                    huge_pages=self.huge_pages, notify=say, prompt_cache=prompt_cache, cache_ram=_mib(self.cache_ram),
                    cache_disk=_mib(self.cache_disk), fit=fit, parallel=parallel, mmproj=self.projector())

    def projector(self) -> Union[Path, bool, None]:
        """What ``load`` is given for --mmproj: a file, False for "none", None to find one beside the target."""
        if self.mmproj is None:
            return None
        return False if self.mmproj.lower() == "none" else Path(self.mmproj).expanduser()

    def files(self, method: Optional[str] = None) -> Resolved:
        """The target and draft files ``open`` would load (a found draft said on stderr), without loading them."""
        from ..catalog.naming import resolve_models

        resolved = resolve_models(*self._model_and_draft(method))
        for notice in resolved.notices:
            say(notice)
        return resolved

    def _model_and_draft(self, method: Optional[str]) -> tuple[Union[str, Path], Optional[str]]:
        from ..catalog.naming import default_draft, names_a_model

        if self.pair_name and self.target:
            raise click.UsageError("Give a pair name or --target/--draft, not both.")
        given = self.pair_name or self.target
        if not given:
            raise click.UsageError("Name a pair (see `localspec models`) or give --target (and --draft).")
        pair = self.pair_name is not None and not names_a_model(self.pair_name)  # --target is always a model
        model: Union[str, Path] = given
        if not pair and not names_a_model(given):
            model = Path(given)  # a path (missing, or without a .gguf name): said so as a missing file
        if pair and self.draft not in (None, "none"):
            raise click.UsageError("A pair brings its own draft; give --draft with --target, or --draft none.")
        draft = self.draft if self.draft is not None or pair else default_draft(method)
        return model, draft


def _mib(n: Optional[int]) -> Optional[int]:
    return None if n is None else n * 2**20


_MODEL_KEYS = tuple(f.name for f in dataclasses.fields(ModelArgs))


def model_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A pair name or --target/--draft, and the loading options, passed on as ``models``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        models = ModelArgs(**{key: kwargs.pop(key) for key in _MODEL_KEYS})
        return fn(*args, models=models, **kwargs)

    for opt in reversed([
        click.argument("pair_name", metavar="[PAIR]", required=False),
        click.option("--target", "-t", default=None,
                     help="Target model (.gguf, or a name from `localspec models --scan` such as "
                          "ollama:NAME:TAG): its output is what you get. Or name a pair (or a model) instead."),
        click.option("--draft", "-d", default=None,
                     help="Draft model (.gguf, or a name from `localspec models --scan`) of the same family; "
                          "default with --target: the best one on this machine; none: no draft model."),
        click.option("--ctx", "n_ctx", type=click.IntRange(min=0), default=None,
                     help="Context length in tokens (0: the model's own; default: the pair's, else 4096; serve: "
                          "the most the model was trained for that fits the memory)."),
        click.option("--threads", "n_threads", type=click.IntRange(min=1), default=None,
                     help="CPU threads for single-token steps (default: the fastest, measured once by "
                          "`localspec calibrate`)."),
        click.option("--threads-batch", "n_threads_batch", type=click.IntRange(min=1), default=None,
                     help="CPU threads for batches: verification and prompts (default: the fastest, measured "
                          "with the steps; with --threads, the same count)."),
        click.option("--gpu-layers", "n_gpu_layers", type=int, default=None,
                     help="Layers to offload to the GPU; -1 all (default on GPU builds), 0 none."),
        click.option("--flash-attn", type=click.Choice(list(FLASH_ATTN)), default="auto", show_default=True,
                     help="Flash attention; auto: on the CPU, on for contexts of 16384 tokens or more (long "
                          "prompts go faster) and off below (see docs/benchmarking.md); llama.cpp's choice on a "
                          "GPU."),
        click.option("--huge-pages/--no-huge-pages", default=True, show_default=True,
                     help="Ask Linux for transparent huge pages for llama.cpp's CPU buffers "
                          "(see docs/benchmarking.md)."),
        click.option("--verbose", is_flag=True, help="Show llama.cpp's log."),
        click.option("--cache-ram", type=click.IntRange(min=0), default=None, metavar="MIB",
                     help="MiB of RAM for the prompt cache, which keeps each prompt's model states so no prompt "
                          "is processed twice (default: a quarter of the free memory, at most 8 GiB; 0: none)."),
        click.option("--cache-disk", type=click.IntRange(min=0), default=None, metavar="MIB",
                     help="MiB of disk for the prompt cache, kept across runs (default: a tenth of the free space, "
                          "at most 16 GiB; 0: none). `localspec cache` shows it."),
        click.option("--mmproj", default=None, metavar="PATH",
                     help="The target's vision projector (an mmproj .gguf from the model's repository), so prompts "
                          "may hold images; default: the mmproj file beside the target, if any; none: no images."),
    ]):
        wrapper = opt(wrapper)
    return wrapper


def _click_type(name: str, annotation: Any) -> Any:
    if name == "method":
        return click.Choice(REGISTRY.names())
    args = [a for a in typing.get_args(annotation) if a is not type(None)]  # Optional[int] -> int
    return args[0] if args else annotation


def generation_options(fn: Optional[Callable[..., Any]] = None, *,
                       helps: Optional[Mapping[str, str]] = None) -> Any:
    """Every ``GenerationOptions`` field with flags, as CLI options; passed on as ``options``.

    Options not given on the command line keep ``GenerationOptions``' defaults
    (and ``k`` stays unset, so a pair's suggested K applies). Bad values fail
    before any model is loaded, with the library's one-sentence message.
    ``helps`` replaces a field's help text, default included, for a command
    that treats it differently (``serve`` caps nothing without ``-n``).
    """
    if fn is None:
        return functools.partial(generation_options, helps=helps)
    hints = typing.get_type_hints(GenerationOptions)
    specs = [f for f in dataclasses.fields(GenerationOptions) if f.metadata.get("flags")]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        given = {f.name: kwargs.pop(f.name) for f in specs}
        with errors_as_messages():
            options = GenerationOptions().replace(**{k: v for k, v in given.items() if v not in (None, ())})
        return fn(*args, options=options, **kwargs)

    for f in reversed(specs):
        repeatable = typing.get_origin(hints[f.name]) is tuple and f.name != "ngram"
        shown = {True: "on", False: "off"}.get(f.default, f.default) if isinstance(f.default, bool) else f.default
        default = "" if f.default in (None, ()) else f" [default: {shown}]"
        kind = str if repeatable else _click_type(f.name, hints[f.name])
        wrapper = click.option(*f.metadata["flags"], f.name, type=kind, default=None, multiple=repeatable,
                               help=(helps or {}).get(f.name, f.metadata["help"] + default))(wrapper)
    return wrapper
