"""Finding and registering models: ``models`` (and ``--scan``), ``add``, ``pull`` and ``check``."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any, Optional

import click

from ..errors import LocalspecError
from ..methods import K_LIMIT
from .shared import friendly_errors, say


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
@click.option("--scan", is_flag=True,
              help="List the GGUFs already on this machine (Ollama, LM Studio, the Hugging Face and llama.cpp "
                   "caches, --folder) and the target/draft pairs among them; nothing is copied or moved.")
@click.option("--folder", "folders", multiple=True, type=click.Path(file_okay=False),
              help="With --scan: also search this folder (repeatable).")
@click.option("--add", "add_pairs", is_flag=True, help="With --scan: register each target's best pair.")
@friendly_errors
def models(as_json: bool, scan: bool, folders: tuple[str, ...], add_pairs: bool) -> None:
    """List the model pairs, embedding models and rerankers: size, whether downloaded, and where; with --scan,
    what is on this machine."""
    if scan:
        _scan(folders, add_pairs, as_json)
        return
    if folders or add_pairs:
        raise click.UsageError("--folder and --add go with --scan.")
    from ..catalog.hub import locate
    from ..catalog.registry import load_embedding_registry, load_registry, user_file

    rows: list[dict[str, Any]] = []
    for name, spec in load_registry().items():
        paths = [locate(spec.target), locate(spec.draft)]
        size = sum(p.stat().st_size for p in paths if p is not None)
        rows.append({"name": name, "kind": "pair", "description": spec.description, "downloaded": all(paths),
                     "target": str(paths[0]) if paths[0] else spec.target.describe(),
                     "draft": str(paths[1]) if paths[1] else spec.draft.describe(),
                     "bytes_on_disk": size, "k": spec.k, "ctx": spec.ctx})
    beside: list[dict[str, Any]] = []
    for name, embedding in load_embedding_registry().items():
        path = locate(embedding.model)
        beside.append({"name": name, "kind": embedding.kind, "description": embedding.description,
                       "downloaded": path is not None, "model": str(path) if path else embedding.model.describe(),
                       "bytes_on_disk": path.stat().st_size if path else 0})
    if as_json:
        click.echo(json.dumps(rows + beside, indent=1))
        return
    for row in rows:
        state = f"downloaded, {row['bytes_on_disk'] / 1e9:.2f} GB" if row["downloaded"] else "not downloaded"
        click.echo(f"{row['name']:<22} {state}")
        click.echo(f"  {row['description']}")
        click.echo(f"  target: {row['target']}\n  draft:  {row['draft']}")
    for row in beside:
        state = f"downloaded, {row['bytes_on_disk'] / 1e9:.2f} GB" if row["downloaded"] else "not downloaded"
        click.echo(f"{row['name']:<22} {row['kind']} model, {state}" if row["kind"] == "embedding"
                   else f"{row['name']:<22} reranker, {state}")
        click.echo(f"  {row['description']}\n  model:  {row['model']}")
    click.echo(f"\nyour pairs: {user_file()}  (localspec add NAME --target ... --draft ...)")


def _scan(folders: tuple[str, ...], add_pairs: bool, as_json: bool) -> None:
    """``models --scan``: the models found, the pairs among them (with the ``add`` line for each), what was skipped."""
    from ..catalog.pairing import pair_models, suggest_pairs
    from ..catalog.registry import add_local_pair, load_registry
    from ..catalog.stores import scan
    from ..catalog.stores.layouts import find_projector

    found = scan(folders=folders)
    pairs = pair_models(found.models)
    registry = load_registry()
    known = {(spec.target.path, spec.draft.path): name for name, spec in registry.items() if spec.target.is_local}
    best = suggest_pairs(pairs, known, taken=registry)
    projectors = {m.name: find_projector(m.path) for m in found.models}
    if as_json:
        click.echo(json.dumps({
            "models": [{"name": m.name, "path": str(m.path), "store": m.store, "bytes": m.size,
                        "architecture": m.architecture, "parameters": m.parameters, "quantization": m.quantization,
                        "vocab_fingerprint": m.fingerprint, "mtp_layers": m.mtp_layers, "role": m.role,
                        "mmproj": str(projectors[m.name]) if projectors[m.name] else None, "aliases": m.aliases}
                       for m in found.models],
            "pairs": [{"target": p.target.name, "draft": p.draft.name, "reason": p.reason} for p in pairs],
            "skipped": [{"where": k.where, "why": k.why} for k in found.skipped]}, indent=1))
    else:
        click.echo(f"{len(found.models)} models on this machine:")
        for m in found.models:
            click.echo(f"  {m.name:<44} {m.label():>6} {m.quantization or '?':<7} {m.architecture or '?':<10} "
                       f"{m.size / 1e9:5.2f} GB  vocabulary {m.fingerprint or '-'}"
                       + ("  MTP head" if m.mtp_layers else "")
                       + (f"  sees images ({seen.name})" if (seen := projectors[m.name]) else "")
                       + (f"  {m.role} model (serve --{'rerank' if m.role == 'reranker' else 'embedding'}-model)"
                          if m.role else ""))
        click.echo(f"\ntarget/draft pairs, best draft first ({len(pairs)}):" if pairs else "\nno target/draft pairs")
        names = {id(s.pair): s.name for s in best}
        for p in pairs:
            click.echo(f"  {p.target.name} <- {p.draft.name}: {p.reason}")
            if id(p) in names:
                click.echo(f"    localspec add {names[id(p)]} -t {shlex.quote(str(p.target.path))} "
                           f"-d {shlex.quote(str(p.draft.path))}")
        for skipped in found.skipped:
            click.echo(str(skipped), err=True)
    if add_pairs:
        for s in best:
            if s.registered:
                click.echo(f"{s.name} is registered already", err=as_json)
                continue
            path = add_local_pair(s.name, s.pair.target.path, s.pair.draft.path,
                                  f"{s.pair.target.name}, drafted by {s.pair.draft.name}")
            click.echo(f"added {s.name} to {path}", err=as_json)


@click.command()
@click.argument("name")
@click.option("--target", "-t", type=click.Path(dir_okay=False, exists=True), required=True)
@click.option("--draft", "-d", type=click.Path(dir_okay=False, exists=True), required=True)
@click.option("--description", default="", help="A short description for `localspec models`.")
@click.option("--k", type=click.IntRange(1, K_LIMIT), default=4, show_default=True,
              help="Suggested draft length for the draft model.")
@click.option("--ctx", type=click.IntRange(min=256), default=4096, show_default=True, help="Suggested context.")
@click.option("--mmproj", type=click.Path(dir_okay=False, exists=True), default=None,
              help="The target's vision projector (its mmproj .gguf), loaded with the pair so prompts may hold "
                   "images.")
@friendly_errors
def add(name: str, target: str, draft: str, description: str, k: int, ctx: int, mmproj: Optional[str]) -> None:
    """Register GGUF files you already have as pair NAME (nothing is copied)."""
    from ..catalog.registry import add_local_pair
    from ..runtime.process import read_vocab
    from ..runtime.vocab_match import check_vocab

    check_vocab(read_vocab(target), read_vocab(draft))
    path = add_local_pair(name, Path(target), Path(draft), description, k, ctx,
                          Path(mmproj) if mmproj is not None else None)
    click.echo(f"added {name} to {path}; try `localspec chat {name}`")


@click.command()
@click.argument("name", required=False)
@click.option("--target", "-t", default=None, metavar="hf:ORG/REPO/FILE.gguf",
              help="A Hub GGUF to pull as a new pair NAME (its header is checked before any download).")
@click.option("--draft", "-d", default=None, metavar="hf:ORG/REPO/FILE.gguf",
              help="Its draft (default: the best one found in the catalog and on the Hub, checked by header).")
@click.option("--no-search", is_flag=True, help="Look for a draft in the catalog only, not on the Hub.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars.")
@friendly_errors
def pull(name: Optional[str], target: Optional[str], draft: Optional[str], no_search: bool, quiet: bool) -> None:
    """Download pair NAME (or the embedding model NAME), or a Hub target with a draft that fits it, from the Hub.

    Files are checked by sha256 (recorded on first download when the catalog
    lists none) and resumed after an interruption.
    """
    from ..catalog.hub import download
    from ..catalog.hub import pull as hub_pull
    from ..catalog.pairing import pair_name
    from ..catalog.registry import add_pair, get_pair, load_embedding_registry, load_registry
    from ..catalog.remote import check_before_download, hub_pair, projector_of

    if target is None:
        if name is None or draft is not None:
            raise click.UsageError("Name a pair (see `localspec models`), or give --target hf:ORG/REPO/FILE.gguf.")
        embedding = load_embedding_registry().get(name)
        if embedding is not None and name not in load_registry():  # an embedding model or reranker
            say(f"{embedding.kind}: {embedding.model.describe()}")
            click.echo(f"{name}: {download(embedding.model, say, progress=not quiet)}")
            return
        spec = get_pair(name)
        check_before_download(spec, say)
        files = hub_pull(spec, say=say, progress=not quiet)
        click.echo(f"{name}: target {files.target}")
        click.echo(f"{' ' * len(name)}  draft  {files.draft}")
        return
    registry = load_registry()
    if name in registry:
        raise click.UsageError(f"There is a pair named {name!r} already (`localspec models`); choose another NAME.")
    catalog = [p.draft for p in registry.values() if not p.draft.is_local]
    t, d = hub_pair(target, draft, catalog, not no_search, say)
    new_name = name or pair_name(t.ref.file or "target")
    if new_name in registry:
        raise click.UsageError(f"There is a pair named {new_name!r} already; give the new pair a NAME.")
    for role, ref in (("target", t.ref), ("draft", d.ref)):
        say(f"{role}: hf:{ref.describe()}")
        download(ref, say, progress=not quiet)
    projector = projector_of(t.ref, say)
    if projector is not None:  # beside the target in the cache, where loading it finds it
        say(f"vision projector: hf:{projector.describe()}")
        try:
            download(projector, say, progress=not quiet)
        except LocalspecError as exc:  # the pair reads text without it; `pull NAME` tries again
            say(f"the vision projector was not downloaded ({exc}); the pair reads text only until "
                f"`localspec pull {name or pair_name(t.ref.file or 'target')}` fetches it.")
    path = add_pair(new_name, t.ref, d.ref, f"{t.ref.file}, drafted by {d.ref.file}", mmproj=projector)
    click.echo(f"added {new_name} to {path}; try `localspec chat {new_name}`")


@click.command()
@click.argument("pair_name", metavar="[PAIR]", required=False)
@click.option("--target", "-t", default=None, help="A .gguf file, or a Hub file hf:ORG/REPO/FILE.gguf.")
@click.option("--draft", "-d", default=None, help="The same for the draft.")
@friendly_errors
def check(pair_name: Optional[str], target: Optional[str], draft: Optional[str]) -> None:
    """Check that a draft shares the target's vocabulary (reads the vocabularies only; of a Hub file, its header)."""
    from ..catalog.remote import vocab_of
    from ..runtime.vocab_match import VOCAB_TYPES, compare

    if pair_name:
        from ..catalog.hub import resolve
        from ..catalog.registry import get_pair

        files = resolve(get_pair(pair_name))
        target, draft = str(files.target), str(files.draft)
    if not target or not draft:
        raise click.UsageError("Name a pair or give both --target and --draft.")
    (t, t_note), (d, d_note) = vocab_of(target), vocab_of(draft)
    for role, v, note in (("target", t, t_note), ("draft", d, d_note)):
        click.echo(f"{role}: {v.path.name}: {VOCAB_TYPES.get(v.type, '?')}, {v.n_tokens} tokens, "
                   f"BOS {v.bos}, EOS {v.eos}{note}")
    if not target.startswith("hf:"):
        from ..catalog.naming import model_path
        from ..runtime.gguf_metadata import read_local

        heads = read_local(model_path(target)).mtp_layers
        if heads:
            click.echo(f"target has an MTP head ({heads} next-n layer{'s' if heads > 1 else ''}): "
                       "--method mtp drafts with it, no draft file needed")
    result = compare(t, d)
    if not result.ok:
        raise click.ClickException(result.message)
    click.echo(("warning: " if result.padded else "ok: ") + result.message)
