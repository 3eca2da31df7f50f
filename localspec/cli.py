"""The ``localspec`` command line.

Thin by design: it parses options, calls the library, prints. A command that
fails on a ``LocalspecError`` prints it as one sentence (``Error: ...``) with
exit status 1, never a traceback (``errors_as_messages``); the chat loop
shows such errors and carries on. Generation options are derived from
``GenerationOptions``, and llama.cpp is imported only once a model is needed,
so ``localspec --help`` starts fast.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import re
import shlex
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Union

import click

from . import __version__
from .errors import LocalspecError
from .methods import AUTO, DRAFT, HISTORY, K_LIMIT, LOOKUP, REGISTRY
from .options import GenerationOptions

if TYPE_CHECKING:
    from .api import Pair
    from .costs import CostProfile

DEFAULT_PAIR = "qwen2.5-coder-1.5b"


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


def _friendly_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with errors_as_messages():
            return fn(*args, **kwargs)

    return wrapper


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

    def open(self, method: Optional[str] = None) -> Pair:
        """Load the registered pair by name, or the target (and draft) given as files or as the scan's names.

        A target given without a draft gets the best draft found on this machine
        (``localspec models --scan``), said on stderr, unless ``method`` needs none.
        """
        from .api import load
        from .naming import FIND_DRAFT, names_a_model

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
        draft = self.draft
        if draft is None and not pair and method in (None, AUTO.name, DRAFT.name):
            draft = FIND_DRAFT
        return load(model, draft, n_ctx=self.n_ctx, n_threads=self.n_threads, n_threads_batch=self.n_threads_batch,
                    n_gpu_layers=self.n_gpu_layers, verbose=self.verbose, flash_attn=FLASH_ATTN[self.flash_attn],
                    huge_pages=self.huge_pages, notify=lambda line: click.echo(line, err=True))


def _model_path(ref: str) -> str:
    """A file path for a path or one of the scan's names (``ollama:NAME:TAG``, ``hf:ORG/REPO/FILE``...)."""
    from .naming import model_path

    return str(model_path(ref))


_MODEL_KEYS = ("pair_name", "target", "draft", "n_ctx", "n_threads", "n_threads_batch", "n_gpu_layers", "flash_attn",
               "huge_pages", "verbose")
FLASH_ATTN = {"auto": None, "on": True, "off": False}


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
                     help="Context length in tokens (0: the model's own; default: the pair's, else 4096)."),
        click.option("--threads", "n_threads", type=click.IntRange(min=1), default=None,
                     help="CPU threads for single-token steps (default: the fastest, measured once by "
                          "`localspec calibrate`)."),
        click.option("--threads-batch", "n_threads_batch", type=click.IntRange(min=1), default=None,
                     help="CPU threads for batches: verification and prompts (default: the fastest, measured "
                          "with the steps; with --threads, the same count)."),
        click.option("--gpu-layers", "n_gpu_layers", type=int, default=None,
                     help="Layers to offload to the GPU; -1 all (default on GPU builds), 0 none."),
        click.option("--flash-attn", type=click.Choice(list(FLASH_ATTN)), default="auto", show_default=True,
                     help="Flash attention; auto: off on the CPU (see the README), llama.cpp's choice on a GPU."),
        click.option("--huge-pages/--no-huge-pages", default=True, show_default=True,
                     help="Ask Linux for transparent huge pages for llama.cpp's CPU buffers (see the README)."),
        click.option("--verbose", is_flag=True, help="Show llama.cpp's log."),
    ]):
        wrapper = opt(wrapper)
    return wrapper


def _click_type(name: str, annotation: Any) -> Any:
    if name == "method":
        return click.Choice(REGISTRY.names())
    args = [a for a in typing.get_args(annotation) if a is not type(None)]  # Optional[int] -> int
    return args[0] if args else annotation


def generation_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Every ``GenerationOptions`` field with flags, as CLI options; passed on as ``options``.

    Options not given on the command line keep ``GenerationOptions``' defaults
    (and ``k`` stays unset, so a pair's suggested K applies). Bad values fail
    before any model is loaded, with the library's one-sentence message.
    """
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
                               help=f.metadata["help"] + default)(wrapper)
    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="localspec")
def cli() -> None:
    """Fast local generation with speculative decoding over llama.cpp.

    The output is exactly what the target model would produce alone; a draft
    model or prompt lookup only changes how fast it comes.
    """


# -- generate, chat ---------------------------------------------------------------------------------


@cli.command()
@model_options
@generation_options
@click.option("--prompt", "-p", default=None, help="Raw prompt text, sent as is.")
@click.option("--message", default=None, help="One user message, formatted with the model's chat template.")
@click.option("--system", default=None, help="System message to go with --message.")
@click.option("--recalibrate", is_flag=True, help="Measure this machine's costs again for auto.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: text, tokens, finish_reason, stats.")
@click.option("--json-schema", "json_schema", type=click.Path(dir_okay=False, exists=True), default=None,
              help="The reply is JSON valid against this schema file (needs the 'structured' extra).")
@click.option("--json-object", is_flag=True, help="The reply is a JSON object (JSON mode).")
@click.option("--regex", default=None, help="The reply matches this regular expression whole.")
@click.option("--grammar", "grammar_file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="The reply follows this grammar file: GBNF as llama.cpp writes it (.gbnf), else Lark.")
@_friendly_errors
def generate(models: ModelArgs, options: GenerationOptions, prompt: Optional[str], message: Optional[str],
             system: Optional[str], recalibrate: bool, as_json: bool, json_schema: Optional[str], json_object: bool,
             regex: Optional[str], grammar_file: Optional[str]) -> None:
    """Generate a continuation of --prompt, or a reply to --message."""
    if (prompt is None) == (message is None):
        raise click.UsageError("Give exactly one of --prompt (raw text) or --message (a chat turn).")
    if system is not None and message is None:
        raise click.UsageError("--system goes with --message, not with a raw --prompt.")
    constraint = _constraint(json_schema, json_object, regex, grammar_file)
    if constraint is not None:
        options = options.replace(grammar=constraint)
    with models.open(options.method) as pair:
        if recalibrate:
            pair.calibrate(refresh=True)
        if message is not None:
            messages = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": message}]
            stream = pair.stream_chat(messages, options)
        else:
            stream = pair.stream(prompt or "", options)
        if as_json:
            for _ in stream:
                pass
            click.echo(json.dumps(stream.result.to_dict(), ensure_ascii=False))
            return
        for ev in stream:
            click.echo(ev.text, nl=False)
        click.echo()
        click.echo(stream.result.summary_line(), err=True)


def _constraint(json_schema: Optional[str], json_object: bool, regex: Optional[str],
                grammar_file: Optional[str]) -> Any:
    """The one constraint the flags ask for (None: free text)."""
    from .constraint import Constraint

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
        text = Path(grammar_file).read_text(encoding="utf-8")
        return Constraint.gbnf(text) if grammar_file.endswith(".gbnf") else Constraint.lark(text)
    return None


@cli.command()
@model_options
@generation_options
@click.option("--system", default=None, help="System prompt.")
@click.option("--show-drafts", is_flag=True, help="Colour tokens by where they came from (lookup, draft, target).")
@click.option("--yes", "-y", is_flag=True, help="Download the pair without asking if it is missing.")
@_friendly_errors
def chat(models: ModelArgs, options: GenerationOptions, system: Optional[str], show_drafts: bool, yes: bool) -> None:
    """Talk to a model pair in the terminal, with streamed speculative output.

    PAIR is a name from `localspec models`, or a model (a .gguf file, or a
    name from `localspec models --scan`) with the best draft on this machine;
    without one (and without --target) the first downloaded pair is used, or
    the default pair is offered for download.
    """
    from .chat import ChatSession, run_chat
    from .naming import names_a_model

    if not models.pair_name and not models.target:
        models.pair_name = _choose_pair(yes)
    elif models.pair_name and not names_a_model(models.pair_name):
        _ensure_pulled(models.pair_name, yes)
    with models.open(options.method) as pair:
        run_chat(ChatSession(pair, system, options), show_drafts)


def _choose_pair(yes: bool) -> str:
    """The first downloaded pair, or the default pair after offering to download it."""
    from .hub import resolve
    from .registry import load_registry

    for name, spec in load_registry().items():
        try:
            resolve(spec)
            return name
        except LocalspecError:
            continue
    _ensure_pulled(DEFAULT_PAIR, yes)
    return DEFAULT_PAIR


def _ensure_pulled(name: str, yes: bool) -> None:
    from .hub import pull, resolve
    from .registry import get_pair

    spec = get_pair(name)
    try:
        resolve(spec)
        return
    except LocalspecError:
        pass
    if not yes:
        if not sys.stdin.isatty():
            raise click.ClickException(f"Pair {name!r} is not downloaded; run `localspec pull {name}` "
                                       "(or pass --yes to download it now).")
        if not click.confirm(f"Pair {name!r} ({spec.description}) is not downloaded. Download it now?",
                             default=True):
            raise click.Abort()
    pull(spec, say=lambda m: click.echo(m, err=True))


@cli.command()
@model_options
@generation_options
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; anything but loopback needs --api-key.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="Port (0: any free one).")
@click.option("--api-key", envvar="LOCALSPEC_API_KEY", default=None,
              help="Require 'Authorization: Bearer KEY' on every request but /health (or set LOCALSPEC_API_KEY).")
@click.option("--max-queue", type=click.IntRange(0, 1000), default=8, show_default=True,
              help="Requests that may wait while one generates; more get 503.")
@click.option("--allow-origin", "origins", multiple=True, metavar="ORIGIN",
              help="A web page origin (e.g. http://localhost:3000) allowed to call the API from a browser; "
                   "repeatable, '*' for any page. Without it, requests that carry an Origin get 403.")
@click.option("--max-body", type=click.IntRange(1024), default=None,
              help="The largest request body in bytes (default: 4 MiB); larger ones get 413.")
@_friendly_errors
def serve(models: ModelArgs, options: GenerationOptions, host: str, port: int, api_key: Optional[str],
          max_queue: int, origins: tuple[str, ...], max_body: Optional[int]) -> None:
    """Serve the pair over an OpenAI-compatible HTTP API (chat and completions, streamed or not).

    The generation options given here are the defaults for requests that
    leave them out; --max-tokens also caps what a request may ask for (without
    it, a request may fill the context). --no-history keeps every request out
    of the history store, whatever the request says.
    """
    import ipaddress

    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback and not api_key:
        raise click.ClickException(f"Binding {host} would let anyone who can reach this machine use the models; "
                                   "give --api-key KEY, or bind 127.0.0.1.")
    if api_key and not (api_key.isascii() and api_key.isprintable() and api_key == api_key.strip()):
        raise click.ClickException("The API key must be printable ASCII without spaces at either end: HTTP "
                                   "headers cannot carry anything else, so no client could send it.")
    for origin in origins:
        if origin != "*" and not re.fullmatch(r"https?://[a-z0-9.\-\[\]:]+", origin):
            raise click.ClickException(f"--allow-origin {origin!r} is not an origin as browsers send it: scheme "
                                       "and host in lower case, an optional port, no path or trailing slash "
                                       "(e.g. http://localhost:3000), or '*'.")
    try:
        from .server import MAX_BODY, Server, create_app, run
        from .server_http import LOOPBACK_NAMES
    except ImportError as exc:
        raise click.ClickException(f"localspec serve needs the server extra ({exc.name} is missing): "
                                   "pip install 'localspec[server]'.") from None
    given_max_tokens = click.get_current_context().get_parameter_source("max_tokens") is not (
        click.core.ParameterSource.DEFAULT)
    with models.open() as pair:
        if not options.history:
            pair.set_history(False)  # the operator's off is absolute: no request can turn it back on
        if not given_max_tokens:
            options = options.replace(max_tokens=pair.target.n_ctx)  # a request may fill the context
        name = models.pair_name or pair.target.path.stem
        server = Server(pair, name, options, max_queue=max_queue, history=pair.history is not None,
                        max_tokens=options.max_tokens if given_max_tokens else None)
        if REGISTRY.get(options.method).adaptive:
            # Now rather than in the first request, and on the worker thread that will generate:
            # llama.cpp's OpenMP threads belong to the thread that calls it, and a second team left
            # over from another thread slowed every later batch by a fifth here.
            server.worker.submit(pair.calibrate).result()
        hosts = (*LOOPBACK_NAMES, f"[{host}]" if ":" in host else host) if loopback else ()
        app = create_app(server, hosts=hosts, origins=origins, api_key=api_key,
                         max_body=MAX_BODY if max_body is None else max_body)
        click.echo(f"localspec serve: model {name!r} on http://{host}:{port}/v1 "
                   f"({'API key required' if api_key else 'no API key'}; history "
                   f"{'recorded' if server.limits.history else 'off'}); Ctrl-C stops", err=True)
        run(server, app, host, port)


# -- model pairs ------------------------------------------------------------------------------------


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
@click.option("--scan", is_flag=True,
              help="List the GGUFs already on this machine (Ollama, LM Studio, the Hugging Face and llama.cpp "
                   "caches, --folder) and the target/draft pairs among them; nothing is copied or moved.")
@click.option("--folder", "folders", multiple=True, type=click.Path(file_okay=False),
              help="With --scan: also search this folder (repeatable).")
@click.option("--add", "add_pairs", is_flag=True, help="With --scan: register each target's best pair.")
@_friendly_errors
def models(as_json: bool, scan: bool, folders: tuple[str, ...], add_pairs: bool) -> None:
    """List the model pairs: size, whether downloaded, and where; with --scan, what is on this machine."""
    if scan:
        _scan(folders, add_pairs, as_json)
        return
    if folders or add_pairs:
        raise click.UsageError("--folder and --add go with --scan.")
    from .hub import locate
    from .registry import load_registry, user_file

    rows: list[dict[str, Any]] = []
    for name, spec in load_registry().items():
        paths = [locate(spec.target), locate(spec.draft)]
        size = sum(p.stat().st_size for p in paths if p is not None)
        rows.append({"name": name, "description": spec.description, "downloaded": all(paths),
                     "target": str(paths[0]) if paths[0] else spec.target.describe(),
                     "draft": str(paths[1]) if paths[1] else spec.draft.describe(),
                     "bytes_on_disk": size, "k": spec.k, "ctx": spec.ctx})
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    for row in rows:
        state = f"downloaded, {row['bytes_on_disk'] / 1e9:.2f} GB" if row["downloaded"] else "not downloaded"
        click.echo(f"{row['name']:<22} {state}")
        click.echo(f"  {row['description']}")
        click.echo(f"  target: {row['target']}\n  draft:  {row['draft']}")
    click.echo(f"\nyour pairs: {user_file()}  (localspec add NAME --target ... --draft ...)")


def _scan(folders: tuple[str, ...], add_pairs: bool, as_json: bool) -> None:
    """``models --scan``: the models found, the pairs among them (with the ``add`` line for each), what was skipped."""
    from .registry import add_local_pair, load_registry
    from .stores import pair_models, pair_name, scan

    found = scan(folders=folders)
    pairs = pair_models(found.models)
    best = {id(p.target): p for p in reversed(pairs)}  # each target's first (best) pair
    registry = load_registry()
    known = {(spec.target.path, spec.draft.path): name for name, spec in registry.items() if spec.target.is_local}
    names: dict[int, str] = {}
    for key, p in best.items():  # a pair already registered keeps its name; a new one gets a free name
        names[key] = known.get((str(p.target.path.resolve()), str(p.draft.path.resolve()))) or pair_name(
            p, [*registry, *names.values()])
    if as_json:
        click.echo(json.dumps({
            "models": [{"name": m.name, "path": str(m.path), "store": m.store, "bytes": m.size,
                        "architecture": m.architecture, "parameters": m.parameters, "quantization": m.quantization,
                        "vocab_fingerprint": m.fingerprint, "mtp_layers": m.mtp_layers, "aliases": m.aliases}
                       for m in found.models],
            "pairs": [{"target": p.target.name, "draft": p.draft.name, "reason": p.reason} for p in pairs],
            "skipped": [{"where": k.where, "why": k.why} for k in found.skipped]}, indent=1))
    else:
        click.echo(f"{len(found.models)} models on this machine:")
        for m in found.models:
            click.echo(f"  {m.name:<44} {m.label():>6} {m.quantization or '?':<7} {m.architecture or '?':<10} "
                       f"{m.size / 1e9:5.2f} GB  vocabulary {m.fingerprint or '-'}"
                       + ("  MTP head" if m.mtp_layers else ""))
        click.echo(f"\ntarget/draft pairs, best draft first ({len(pairs)}):" if pairs else "\nno target/draft pairs")
        for p in pairs:
            click.echo(f"  {p.target.name} <- {p.draft.name}: {p.reason}")
            if best.get(id(p.target)) is p:
                click.echo(f"    localspec add {names[id(p.target)]} -t {shlex.quote(str(p.target.path))} "
                           f"-d {shlex.quote(str(p.draft.path))}")
        for skipped in found.skipped:
            click.echo(str(skipped), err=True)
    if add_pairs:
        for key, p in best.items():
            if names[key] in registry:
                click.echo(f"{names[key]} is registered already", err=as_json)
                continue
            path = add_local_pair(names[key], p.target.path, p.draft.path, f"{p.target.name}, drafted by "
                                  f"{p.draft.name}")
            click.echo(f"added {names[key]} to {path}", err=as_json)


@cli.command()
@click.argument("name")
@click.option("--target", "-t", type=click.Path(dir_okay=False, exists=True), required=True)
@click.option("--draft", "-d", type=click.Path(dir_okay=False, exists=True), required=True)
@click.option("--description", default="", help="A short description for `localspec models`.")
@click.option("--k", type=click.IntRange(1, K_LIMIT), default=4, show_default=True,
              help="Suggested draft length for the draft model.")
@click.option("--ctx", type=click.IntRange(min=256), default=4096, show_default=True, help="Suggested context.")
@_friendly_errors
def add(name: str, target: str, draft: str, description: str, k: int, ctx: int) -> None:
    """Register GGUF files you already have as pair NAME (nothing is copied)."""
    from .backend import read_vocab
    from .compat import check_vocab
    from .registry import add_local_pair

    check_vocab(read_vocab(target), read_vocab(draft))
    path = add_local_pair(name, Path(target), Path(draft), description, k, ctx)
    click.echo(f"added {name} to {path}; try `localspec chat {name}`")


@cli.command()
@click.argument("name", required=False)
@click.option("--target", "-t", default=None, metavar="hf:ORG/REPO/FILE.gguf",
              help="A Hub GGUF to pull as a new pair NAME (its header is checked before any download).")
@click.option("--draft", "-d", default=None, metavar="hf:ORG/REPO/FILE.gguf",
              help="Its draft (default: the best one found in the catalog and on the Hub, checked by header).")
@click.option("--no-search", is_flag=True, help="Look for a draft in the catalog only, not on the Hub.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars.")
@_friendly_errors
def pull(name: Optional[str], target: Optional[str], draft: Optional[str], no_search: bool, quiet: bool) -> None:
    """Download pair NAME, or a Hub target with a draft that fits it, from the Hugging Face Hub.

    Files are checked by sha256 (recorded on first download when the catalog
    lists none) and resumed after an interruption.
    """
    from .hub import download
    from .hub import pull as hub_pull
    from .registry import get_pair

    say = functools.partial(click.echo, err=True)
    if target is None:
        if name is None or draft is not None:
            raise click.UsageError("Name a pair (see `localspec models`), or give --target hf:ORG/REPO/FILE.gguf.")
        spec = get_pair(name)
        _check_before_download(spec, say)
        files = hub_pull(spec, say=say, progress=not quiet)
        click.echo(f"{name}: target {files.target}")
        click.echo(f"{' ' * len(name)}  draft  {files.draft}")
        return
    from .registry import load_registry

    registry = load_registry()
    if name in registry:
        raise click.UsageError(f"There is a pair named {name!r} already (`localspec models`); choose another NAME.")
    catalog = [p.draft for p in registry.values() if not p.draft.is_local]
    t, d = _pick_hub_pair(target, draft, catalog, not no_search, say)
    pair_name = name or _pair_name(t.ref.file or "target")
    if pair_name in registry:
        raise click.UsageError(f"There is a pair named {pair_name!r} already; give the new pair a NAME.")
    for role, ref in (("target", t.ref), ("draft", d.ref)):
        say(f"{role}: hf:{ref.describe()}")
        download(ref, say, progress=not quiet)
    from .registry import add_pair

    path = add_pair(pair_name, t.ref, d.ref, f"{t.ref.file}, drafted by {d.ref.file}")
    click.echo(f"added {pair_name} to {path}; try `localspec chat {pair_name}`")


def _check_before_download(spec: Any, say: Callable[[str], None]) -> None:
    """Before a pair's missing Hub files are downloaded, compare the two vocabularies from their headers.

    Offline, or with both files on disk, there is nothing to check here (loading checks them).
    """
    from .errors import VocabMismatchError
    from .gguf_header import read_local, same_vocabulary
    from .hub import locate, truthy
    from .remote import remote_header
    from .stores import human_bytes

    on_disk = [locate(spec.target), locate(spec.draft)]
    if all(on_disk) or truthy("HF_HUB_OFFLINE"):
        return
    headers, read = [], 0
    for ref, path in zip((spec.target, spec.draft), on_disk, strict=True):
        if path is not None or ref.is_local:
            headers.append(read_local(path or ref.path))
        else:
            remote = remote_header(ref)
            headers.append(remote.header)
            read += remote.bytes_read
    verdict = same_vocabulary(headers[0], headers[1])
    if not verdict.ok:
        raise VocabMismatchError(f"{verdict.message} (pair {spec.name!r}; nothing was downloaded)")
    say(f"checked the vocabularies from the headers first ({human_bytes(read)} read): {verdict.message}")


def _pick_hub_pair(target: str, draft: Optional[str], catalog: list[Any], search: bool,
                   say: Callable[[str], None]) -> tuple[Any, Any]:
    """The Hub target and its draft (given, or found among ``catalog`` and on the Hub), both checked by their
    headers before any download."""
    from .errors import HubError, VocabMismatchError
    from .gguf_header import same_vocabulary
    from .remote import find_drafts, parse_hf, remote_header
    from .stores import human_bytes

    t = remote_header(parse_hf(target))
    say(f"target {t.describe()}: {t.header.architecture}, {t.header.size_label or '?'} "
        f"(read {human_bytes(t.bytes_read)} of {human_bytes(t.size)})")
    if draft is not None:
        d = remote_header(parse_hf(draft))
        verdict = same_vocabulary(t.header, d.header)
        if not verdict.ok:
            raise VocabMismatchError(verdict.message)
        say(f"draft {d.describe()}: {verdict.message} (read {human_bytes(d.bytes_read)} of {human_bytes(d.size)})")
        return t, d
    matches, spent = find_drafts(t, catalog, say=say, search=search)
    for m in matches:
        say(f"  candidate {m.remote.describe()}: {m.reason}")
    if not matches:
        raise HubError(f"No draft for {t.describe()} was found in the catalog{' or on the Hub' if search else ''}; "
                       "give one of the same family with --draft hf:ORG/REPO/FILE.gguf.")
    say(f"draft: {matches[0].remote.describe()} (checked by header, {human_bytes(spent)} read in all)")
    return t, matches[0].remote


def _pair_name(file: str) -> str:
    """A pair name from a GGUF file name: lower case, without the quantization tag."""
    stem = re.sub(r"[-_.](i?q\d\w*|f16|bf16|f32)$", "", Path(file).stem, flags=re.IGNORECASE)
    return stem.lower()


@cli.command()
@click.argument("pair_name", metavar="[PAIR]", required=False)
@click.option("--target", "-t", default=None, help="A .gguf file, or a Hub file hf:ORG/REPO/FILE.gguf.")
@click.option("--draft", "-d", default=None, help="The same for the draft.")
@_friendly_errors
def check(pair_name: Optional[str], target: Optional[str], draft: Optional[str]) -> None:
    """Check that a draft shares the target's vocabulary (reads the vocabularies only; of a Hub file, its header)."""
    from .compat import VOCAB_TYPES, compare

    if pair_name:
        from .hub import resolve
        from .registry import get_pair

        files = resolve(get_pair(pair_name))
        target, draft = str(files.target), str(files.draft)
    if not target or not draft:
        raise click.UsageError("Name a pair or give both --target and --draft.")
    (t, t_note), (d, d_note) = _vocab_of(target), _vocab_of(draft)
    for role, v, note in (("target", t, t_note), ("draft", d, d_note)):
        click.echo(f"{role}: {v.path.name}: {VOCAB_TYPES.get(v.type, '?')}, {v.n_tokens} tokens, "
                   f"BOS {v.bos}, EOS {v.eos}{note}")
    if not target.startswith("hf:"):
        from .gguf_header import read_local

        heads = read_local(_model_path(target)).mtp_layers
        if heads:
            click.echo(f"target has an MTP head ({heads} next-n layer{'s' if heads > 1 else ''}): "
                       "--method mtp drafts with it, no draft file needed")
    result = compare(t, d)
    if not result.ok:
        raise click.ClickException(result.message)
    click.echo(("warning: " if result.padded else "ok: ") + result.message)


def _vocab_of(ref: str) -> tuple[Any, str]:
    """A model's vocabulary: a Hub file's from its header (saying how much was read), a local file's from llama.cpp."""
    from .backend import read_vocab

    if ref.startswith("hf:"):
        from .hub import locate
        from .remote import parse_hf, remote_header
        from .stores import human_bytes

        cached = locate(parse_hf(ref))
        if cached is not None:
            return read_vocab(cached), " (in the local Hugging Face cache)"
        remote = remote_header(parse_hf(ref))
        return remote.header.vocab(), f" (header read: {human_bytes(remote.bytes_read)} of {human_bytes(remote.size)})"
    return read_vocab(_model_path(ref)), ""


@cli.command()
@click.argument("pair_name", metavar="[PAIR]", required=False)
@click.option("--target", "-t", type=click.Path(dir_okay=False), default=None, help="Target model (.gguf).")
@click.option("--draft", "-d", type=click.Path(dir_okay=False), default=None, help="Draft model (.gguf).")
@click.option("--to", "engine", type=click.Choice(["vllm", "llama-server"]), required=True,
              help="The serving engine to run the pair on.")
@click.option("--method", type=click.Choice(["auto", DRAFT.name, LOOKUP.name, HISTORY.name]), default="auto",
              show_default=True,
              help="Drafting method; auto: the best drafting row of --from-bench, else the draft model if there "
                   "is one, else lookup.")
@click.option("--from-bench", "bench_file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="A `localspec bench --json` file of this pair: export the method and K that did best in it.")
@click.option("--k", type=click.IntRange(1, K_LIMIT), default=None, help="Tokens per draft (default: the pair's).")
@click.option("--ctx", type=click.IntRange(min=256), default=None, help="Context length (default: the pair's).")
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="Port (default: the engine's own).")
@click.option("--target-repo", default=None, metavar="ORG/NAME",
              help="The Hugging Face repository the target GGUF was made from (for vLLM), if its header lacks it.")
@click.option("--draft-repo", default=None, metavar="ORG/NAME", help="The same for the draft.")
@_friendly_errors
def export(pair_name: Optional[str], target: Optional[str], draft: Optional[str], engine: str, method: str,
           bench_file: Optional[str], k: Optional[int], ctx: Optional[int], port: Optional[int],
           target_repo: Optional[str], draft_repo: Optional[str]) -> None:
    """Print the command that serves this pair on vLLM or llama-server, for more than one user."""
    from . import export as ex
    from .naming import resolve_models
    from .options import LOOKUP_NGRAM

    if pair_name and target:
        raise click.UsageError("Give a pair name or --target/--draft, not both.")
    given = target or pair_name
    if not given:
        raise click.UsageError("Name a pair (see `localspec models`) or give --target (and --draft).")
    files = resolve_models(given, draft)
    pair_k, pair_ctx = files.draft_k, 4096 if files.n_ctx is None else files.n_ctx
    t = ex.served(files.target, target_repo, files.repos[0])
    d = ex.served(files.draft, draft_repo, files.repos[1]) if files.draft else None
    if method == "auto" and bench_file:
        method, bench_k, speedup = ex.load_bench(Path(bench_file))
        k = k or bench_k
        click.echo(f"# from {bench_file}: {method} with K={bench_k} did best ({speedup:.2f}x median over its "
                   "prompts on this machine)")
    elif method == "auto":
        method = DRAFT.name if d else LOOKUP.name
    if method == DRAFT.name and d is None:
        raise click.UsageError("The draft method needs --draft (or a pair); choose --method lookup or history.")
    click.echo(ex.plan(engine, t, d, method, k or pair_k or 4, LOOKUP_NGRAM, ctx or pair_ctx, port).render())


# -- history ---------------------------------------------------------------------------------------


@cli.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print the stores as JSON.")
@click.pass_context
@_friendly_errors
def history(ctx: click.Context, as_json: bool) -> None:
    """Show what each model's history store holds, and how often its guesses were right.

    Generations are recorded per target model (prompt and reply tokens) and
    later drafts copy what followed the same text before. Turn it off per
    call with --no-history, or everywhere with LOCALSPEC_HISTORY=off.
    """
    if ctx.invoked_subcommand is not None:
        return
    from .history import history_dir, list_stores, set_aside_copies

    stores, aside = list_stores(), set_aside_copies()
    if as_json:
        rows: list[dict[str, Any]] = [
            {"file": str(path), "model": model, "records": c.records, "tokens": c.tokens, "bytes": c.bytes,
             "drafted": c.drafted, "accepted": c.accepted, "hit_rate": c.hit_rate, "set_aside": False}
            for path, model, c in stores]
        rows += [{"file": str(path), "bytes": path.stat().st_size, "set_aside": True} for path in aside]
        click.echo(json.dumps(rows, indent=1))
        return
    if not stores and not aside:
        click.echo(f"no history yet ({history_dir()})")
        return
    for path, model, c in stores:
        hits = f"{c.accepted}/{c.drafted} drafted tokens accepted ({100 * c.hit_rate:.0f}%)" if c.drafted else \
            "no history drafts yet"
        click.echo(f"{model}: {c.records} generations, {c.tokens} tokens, {c.bytes / 1e6:.2f} MB; {hits}")
        click.echo(f"  {path}")
    for path in aside:
        click.echo(f"set aside as damaged (`localspec history clear` deletes it): {path}, "
                   f"{path.stat().st_size / 1e6:.2f} MB")


@history.command("clear")
@click.option("--yes", "-y", is_flag=True, help="Do not ask.")
@_friendly_errors
def history_clear(yes: bool) -> None:
    """Delete every model's history store, and the damaged copies set aside."""
    from .history import clear_stores, history_dir

    if not yes:
        click.confirm(f"Delete all recorded generations in {history_dir()}?", abort=True)
    removed = clear_stores()
    click.echo(f"history cleared ({removed} file{'s' if removed != 1 else ''} removed)")


# -- measuring --------------------------------------------------------------------------------------


def _profile_table(profile: CostProfile, has_draft: bool, alphas: tuple[float, ...] = (0.3, 0.5, 0.7, 0.9),
                   has_head: bool = False) -> str:
    """A readable summary of a profile: relative costs and what auto would choose at each acceptance."""
    from .costs import best_k
    rel = profile.relative()
    verify = rel["verify"]
    assert isinstance(verify, list)
    lines = [
        f"cost profile ({profile.source}): one target step {1000 * profile.verify[0]:.1f} ms",
        "  verify n tokens / one step: " + "  ".join(f"{n + 1}:{v:.2f}" for n, v in enumerate(verify)),
    ]
    if has_draft:
        lines.append(f"  draft step / target step: {rel['draft_step']:.2f}")
    if has_head:
        lines.append(f"  MTP head step / target step: {rel.get('mtp_step', 0.0):.2f}")
    if profile.rollback:
        lines.append(f"  checkpoint per drafted round / target step: {rel['rollback']:.2f}")
    lines.append("  predicted speedup over plain (best K) at per-token acceptance alpha:")
    methods = [m.name for m in REGISTRY
               if m.candidate and (has_draft or not m.needs_draft) and (has_head or not m.needs_head)]
    lines.append("    alpha  " + "  ".join(f"{m:>14}" for m in methods))
    for a in alphas:
        cells = []
        for m in methods:
            k, s = best_k(profile, m, a, profile.kmax)
            cells.append(f"{s:5.2f}x (K={k})" if k else "  plain (K=0)")
        lines.append(f"    {a:5.2f}  " + "  ".join(f"{c:>14}" for c in cells))
    return "\n".join(lines)


@cli.command()
@model_options
@click.option("--recalibrate", is_flag=True, help="Measure again even if a calibration is cached.")
@click.option("--json", "as_json", is_flag=True, help="Print the profile as JSON.")
@_friendly_errors
def calibrate(models: ModelArgs, recalibrate: bool, as_json: bool) -> None:
    """Measure what verification and drafting cost on this machine (used by auto)."""
    with models.open() as pair:
        profile = pair.calibrate(refresh=recalibrate)
        sweep = pair.choose_threads()  # cached by now: what the choice was made from
        batches = pair.thread_choice.batch_seconds if pair.thread_choice else {}
        t = pair.target
        if as_json:
            click.echo(json.dumps({"source": profile.source, "verify_seconds": profile.verify,
                                   "draft_step_seconds": profile.draft_step, "lookup_seconds": profile.lookup,
                                   "mtp_step_seconds": profile.mtp_step, "rollback_seconds": profile.rollback,
                                   "memory": t.memory.describe(),
                                   "relative": profile.relative(), "threads": t.n_threads,
                                   "threads_batch": t.n_threads_batch, "thread_sweep_step_seconds": sweep,
                                   "thread_sweep_batch_seconds": batches}))
            return
        if sweep:
            click.echo("threads for steps: " + "  ".join(f"{n}: {1000 * s:.1f} ms" for n, s in sweep.items())
                       + f"  -> using {t.n_threads} (--threads overrides)")
            click.echo(f"threads for batches of {len(profile.verify)}: "
                       + "  ".join(f"{n}: {1000 * s:.1f} ms" for n, s in batches.items())
                       + f"  -> using {t.n_threads_batch} (--threads-batch overrides)")
        else:
            click.echo(f"threads: {t.n_threads} for steps, {t.n_threads_batch} for batches (set with --threads)")
        head = pair.usable_head()
        click.echo(f"memory: {t.memory.describe()}" + (f"; the draft's: {pair.draft.memory.describe()}"
                                                          if pair.draft is not None else "")
                   + (f"; {head.describe()}" if head is not None else ""))
        click.echo(_profile_table(profile, pair.draft is not None, has_head=head is not None))


@cli.command()
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
@click.option("--sampled", is_flag=True, help="Also run sampled (seeded by repetition), against the peers too.")
@click.option("--sampled-temperature", type=float, default=0.7, show_default=True)
@click.option("--sampled-top-p", type=float, default=0.9, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write everything measured, with machine info, to this JSON file.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Write a PNG of speedup against K per category (needs matplotlib).")
@_friendly_errors
def bench(models: ModelArgs, suite: Optional[str], categories: tuple[str, ...], quick: bool, reps: Optional[int],
          width: Optional[float], budget_minutes: Optional[float], max_tokens: Optional[int], k_lookup: Optional[str],
          k_draft: Optional[str], k_lcp_lookup: Optional[str],
          no_auto: bool, no_peers: bool,
          history_check: bool, related: bool, sampled: bool, sampled_temperature: float, sampled_top_p: float,
          json_path: Optional[str], plot_path: Optional[str]) -> None:
    """Compare plain decoding, lookup, draft and auto, and llama-cpp-python's own decoding, side by side.

    Speedups are shown against llama-cpp-python's plain decoding (what you would
    otherwise run) and against localspec's plain path. Exits with status 1 if any
    greedy run differs from plain decoding other than at a numeric tie.
    """
    from .bench import Precision, default_methods, load_suite, render_table, run_bench, write_json, write_plot
    from .bench.peers import PEER_LOOKUP

    if budget_minutes is not None and width is None:
        raise click.UsageError("--budget sets the time for --width's extra repetitions; give --width too.")
    if no_peers and k_lcp_lookup is not None:
        raise click.UsageError("--k-lcp-lookup sets llama-cpp-python's lookup rows, which --no-peers leaves out; "
                               "give one or the other.")
    if related:
        _bench_related(models, suite, reps, max_tokens, json_path)
        return
    prompts = load_suite(Path(suite) if suite else None, categories, quick)
    with models.open() as pair:
        ks = {LOOKUP.name: _k_list(k_lookup, "--k-lookup"), DRAFT.name: _k_list(k_draft, "--k-draft"),
              PEER_LOOKUP: _k_list(k_lcp_lookup, "--k-lcp-lookup")}
        methods = default_methods(pair.draft is not None, quick, {m: k for m, k in ks.items() if k is not None},
                                  auto=not no_auto, peers=not no_peers, history_check=history_check,
                                  has_head=bool(pair.target.n_nextn))
        GenerationOptions(temperature=sampled_temperature, top_p=sampled_top_p)  # bad values fail before any work
        reps = reps or (2 if quick else 3)
        max_tokens = max_tokens or (64 if quick else 128)
        temperatures = (0.0, sampled_temperature) if sampled else (0.0,)
        precision = Precision(width, 60 * (budget_minutes or 60.0)) if width is not None else None
        most = max(reps, precision.max_reps) if precision else reps
        total = len(prompts) * len(methods) * most * len(temperatures)
        click.echo(f"bench: {len(prompts)} prompts x {len(methods)} methods x "
                   + (f"{reps} reps or more, until every interval is narrower than {width:.0%} or "
                      f"{budget_minutes:g} minutes are spent" if precision else f"{reps} reps")
                   + f"{' x 2 temperatures' if sampled else ''}, {max_tokens} tokens each", err=True)
        pair.calibrate()
        with click.progressbar(length=total, label="running", file=sys.stderr) as bar:
            def prompt_done(name: str, n: int, widest: float) -> None:
                if precision is not None:  # the bar's length assumed every prompt might need max_reps
                    click.echo(f"\n{name}: {n} repetitions, widest 95% interval {widest:.1%}", err=True)

            report = run_bench(pair, prompts, methods, reps=reps, max_tokens=max_tokens,
                               temperatures=temperatures, top_p=sampled_top_p, progress=lambda _: bar.update(1),
                               checksums=json_path is not None, precision=precision, on_prompt=prompt_done)
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
    from .bench import load_related, render_related, run_related

    prompts = load_related(Path(suite) if suite else None)
    with models.open() as pair:
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


def _k_list(value: Optional[str], option: str) -> Optional[list[int]]:
    if value is None:
        return None
    if value.strip().lower() == "none":  # no rows of this method
        return []
    try:
        ks = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated whole numbers, got {value!r}", param_hint=option) from None
    if not ks or any(k < 1 or k > K_LIMIT for k in ks):
        raise click.BadParameter(f"each K must be from 1 to {K_LIMIT}", param_hint=option)
    return ks


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="localspec")
