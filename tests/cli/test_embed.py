"""``localspec embed``: a JSON line per text with the library's vector (or a reranker's score), texts from the
command line and from a JSONL file, and a sentence for each kind of bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from clirun import run_cli
from tinyarch import write_tiny_bert

from localspec import load_embedding


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("embed-cli")
    write_tiny_bert(d / "e.gguf", seed=3)
    write_tiny_bert(d / "r.gguf", seed=5, pooling="rank")
    (d / "texts.jsonl").write_text('"plain text"\n\n{"id": 7, "text": "with an id"}\n', encoding="utf-8")
    return d


def test_each_text_gets_a_line_with_the_librarys_vector(files: Path):
    r = run_cli(["embed", str(files / "e.gguf"), "hello", "--input", str(files / "texts.jsonl"), "--threads", "2"])
    assert r.exit_code == 0, r.output
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["index"] for x in lines] == [0, 1, 2] and lines[2]["id"] == "7" and "id" not in lines[0]
    with load_embedding(files / "e.gguf", n_threads=2) as e:
        want = e.embed(["hello", "plain text", "with an id"])
    np.testing.assert_allclose([x["embedding"] for x in lines], want, atol=1e-6)
    short = run_cli(["embed", str(files / "e.gguf"), "hello", "--dimensions", "4"])
    assert len(json.loads(short.stdout)["embedding"]) == 4


def test_a_reranker_scores_the_texts_for_a_query(files: Path):
    r = run_cli(["embed", str(files / "r.gguf"), "cats sleep", "markets fell", "--query", "cats?"])
    assert r.exit_code == 0, r.output
    with load_embedding(files / "r.gguf") as ranker:
        want = ranker.rank("cats?", ["cats sleep", "markets fell"])
    np.testing.assert_allclose([json.loads(x)["score"] for x in r.stdout.splitlines()], want, atol=1e-6)


@pytest.mark.parametrize("args, words", [
    (["r.gguf", "a"], "is a reranker: give --query"),
    (["e.gguf"], "Give texts to embed"),
    (["e.gguf", ""], "Input 0 is an empty string"),
    (["e.gguf", "word " * 400], "more than the 128 e reads"),
    (["e.gguf", "--input", "bad.jsonl"], "bad.jsonl:2 has no \"text\""),
])
def test_bad_input_is_one_sentence(files: Path, args: list[str], words: str):
    (files / "bad.jsonl").write_text('"fine"\n{"id": 1}\n', encoding="utf-8")
    args = [str(files / a) if a.endswith((".gguf", ".jsonl")) else a for a in args]
    r = run_cli(["embed", *args])
    assert r.exit_code != 0 and words in r.output and "Traceback" not in r.output
