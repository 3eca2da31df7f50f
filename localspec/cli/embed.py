"""``localspec embed``: texts in, one JSON line per vector out (or a reranker's scores)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import click

from .shared import friendly_errors


@click.command()
@click.argument("model")
@click.argument("texts", nargs=-1)
@click.option("--input", "input_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Texts to embed, one a line (a JSON string, or an object with \"text\" and an optional \"id\").")
@click.option("--query", default=None, help="With a reranker: score each text as a document for this query.")
@click.option("--dimensions", type=click.IntRange(min=1), default=None,
              help="Keep each vector's first N numbers (then scaled to length 1 again, unless --raw), for models "
                   "trained for it.")
@click.option("--truncate", is_flag=True, help="Cut a text longer than the model reads instead of refusing it.")
@click.option("--raw", is_flag=True, help="The vectors as the model gives them, not scaled to length 1.")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="CPU threads (default: every core).")
@friendly_errors
def embed(model: str, texts: tuple[str, ...], input_file: Optional[Path], query: Optional[str],
          dimensions: Optional[int], truncate: bool, raw: bool, threads: Optional[int]) -> None:
    """Embed TEXTS (or the lines of --input) with the embedding model MODEL (a catalog name, a .gguf, or
    ollama:NAME), one JSON line per text: {"index", "id", "embedding"}; with a reranker and --query,
    {"index", "id", "score"}."""
    from ..embeddings import load_embedding

    items = [(None, t) for t in texts] + (_lines(input_file) if input_file is not None else [])
    if not items:
        raise click.UsageError("Give texts to embed, or --input FILE.")
    with load_embedding(model, n_threads=threads) as embedder:
        docs = [t for _, t in items]
        if query is not None or embedder.is_reranker:
            if query is None:
                raise click.UsageError(f"{embedder.name} is a reranker: give --query to score the texts against.")
            values: list[dict[str, object]] = [{"score": float(s)}
                                               for s in embedder.rank(query, docs, truncate=truncate)]
        else:
            rows = embedder.embed(docs, normalize=not raw, truncate=truncate, dimensions=dimensions)
            values = [{"embedding": [round(float(x), 7) for x in row]} for row in rows]
    for i, ((ident, _), value) in enumerate(zip(items, values, strict=True)):
        click.echo(json.dumps({"index": i, **({"id": ident} if ident is not None else {}), **value}))


def _lines(path: Path) -> list[tuple[Optional[str], str]]:
    """The texts of a JSONL file, a JSON string or an object with ``text`` (and ``id``) a line; blank ones skipped."""
    out: list[tuple[Optional[str], str]] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise click.UsageError(f"{path}:{n} is not JSON ({exc.msg}); give a JSON string or an object with "
                                   "\"text\" a line.") from None
        if isinstance(item, str):
            out.append((None, item))
        elif isinstance(item, dict) and isinstance(item.get("text"), str):
            out.append((None if item.get("id") is None else str(item["id"]), item["text"]))
        else:
            raise click.UsageError(f"{path}:{n} has no \"text\"; give a JSON string or an object with \"text\" a line.")
    return out
