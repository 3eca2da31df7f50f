"""Embeddings and reranking (``localspec.load_embedding``) on tiny random "bert" models the tests write: the
vectors llama-cpp-python's own ``embed`` gives for the same file, a batch equal to its inputs one by one, token
ids equal to their text, ``dimensions``, a reranker's scores, and a sentence for each kind of bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tinyarch import write_tiny_bert

from localspec import ConfigError, ContextOverflowError, ModelFileError, TokenIdError, load_embedding

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "hello", "def add(a, b):\n    return a + b"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("embed")
    write_tiny_bert(d / "embed.gguf", seed=3)
    write_tiny_bert(d / "cls.gguf", seed=4, pooling="cls")
    write_tiny_bert(d / "rerank.gguf", seed=5, pooling="rank")
    return d


@pytest.fixture(scope="module")
def embedder(models: Path):
    with load_embedding(models / "embed.gguf", n_threads=2) as e:
        yield e


@pytest.mark.parametrize("name", ["embed.gguf", "cls.gguf"])
def test_the_vectors_are_llama_cpp_pythons_own(models: Path, name: str):
    """Mean and CLS pooling give, normalised or not, what llama-cpp-python's ``embed`` gives for the file
    (same threads; no flash attention on either side)."""
    import llama_cpp

    lcp = llama_cpp.Llama(str(models / name), embedding=True, n_threads=2, n_threads_batch=2, verbose=False)
    with load_embedding(models / name, n_threads=2) as e:
        assert e.pooling == name.split(".")[0].replace("embed", "mean")
        for normalize in (False, True):
            theirs = np.array(lcp.embed(TEXTS, normalize=normalize), dtype=np.float32)
            np.testing.assert_allclose(e.embed(TEXTS, normalize=normalize), theirs, rtol=0, atol=1e-6)
    lcp.close()


def test_a_batch_is_its_inputs_one_by_one_and_ids_are_their_text(embedder):
    together = embedder.embed(TEXTS)
    alone = np.vstack([embedder.embed(t) for t in TEXTS])
    np.testing.assert_allclose(together, alone, rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-6)
    ids = [embedder.model.tokenize(t, parse_special=False) for t in TEXTS]
    np.testing.assert_allclose(embedder.embed(ids), together, rtol=0, atol=1e-6)
    np.testing.assert_allclose(embedder.embed(ids[0]), together[:1], rtol=0, atol=1e-5)  # a flat list: one input


def test_dimensions_keep_the_first_numbers_then_normalise(embedder):
    full = embedder.embed(TEXTS[:2], normalize=False)
    cut = embedder.embed(TEXTS[:2], dimensions=8)
    assert cut.shape == (2, 8)
    np.testing.assert_allclose(cut, full[:, :8] / np.linalg.norm(full[:, :8], axis=1, keepdims=True), atol=1e-6)
    np.testing.assert_allclose(embedder.embed(TEXTS[:2], dimensions=8, normalize=False), full[:, :8], atol=1e-6)


def test_more_inputs_than_one_decode_holds_come_back_in_order(embedder):
    """Inputs past what one decode takes (its tokens, its sequences) go in further decodes, rows in order."""
    many = [f"item number {i} of the list" for i in range(150)]
    rows = embedder.embed(many)
    assert rows.shape == (150, embedder.dim)
    for i in (0, 63, 64, 149):
        np.testing.assert_allclose(rows[i], embedder.embed(many[i])[0], atol=1e-5)


@pytest.mark.parametrize("bad, error, words", [
    ([], ConfigError, "empty"),
    ("", ConfigError, "empty string"),
    (["fine", ""], ConfigError, "Input 1 is an empty string"),
    ([[]], ConfigError, "empty list of token ids"),
    ([[1, 2], [10**9]], TokenIdError, "send ids this model knows"),
    ({"text": "x"}, ConfigError, "not dict"),
    ([3.5], ConfigError, "not float"),
])
def test_bad_input_is_refused_in_a_sentence(embedder, bad, error, words):
    with pytest.raises(error, match=words):
        embedder.embed(bad)


def test_an_input_too_long_is_refused_or_truncated_as_asked(embedder):
    text = "word " * (embedder.n_ctx + 20)
    with pytest.raises(ContextOverflowError, match=rf"more than the {embedder.n_ctx} embed reads"):
        embedder.embed(["short", text])
    cut = embedder.embed(text, truncate=True)
    ids = embedder.model.tokenize(text, parse_special=False)[: embedder.n_ctx]
    np.testing.assert_allclose(cut, embedder.embed(ids), rtol=0, atol=1e-6)
    for dims in (0, embedder.dim + 1):
        with pytest.raises(ConfigError, match=f"dimensions must be 1 to {embedder.dim}"):
            embedder.embed("x", dimensions=dims)


def test_a_reranker_scores_each_document_alone(models: Path, embedder):
    with load_embedding(models / "rerank.gguf", n_threads=2) as r:
        assert r.is_reranker and r.pooling == "rank"
        docs = ["cats sleep a lot", "the stock market fell", "a kitten is a young cat"]
        scores = r.rank("what do cats do?", docs)
        assert scores.shape == (3,) and len(set(np.round(scores, 6))) == 3
        np.testing.assert_allclose(r.rank("what do cats do?", docs[::-1]), scores[::-1], atol=1e-5)
        np.testing.assert_allclose(r.rank("what do cats do?", docs[1:2]), scores[1:2], atol=1e-5)
        with pytest.raises(ConfigError, match="is a reranker"):
            r.embed("x")
        with pytest.raises(ConfigError, match="Document 1 must be a non-empty string"):
            r.rank("q", ["a", ""])
        with pytest.raises(ConfigError, match="query must be a non-empty string"):
            r.rank("", ["a"])
    with pytest.raises(ConfigError, match="not a reranker"):
        embedder.rank("q", ["a"])


def test_a_long_document_loses_its_end_and_never_the_query(models: Path):
    with load_embedding(models / "rerank.gguf", n_ctx=64) as r:
        query, doc = "what do cats do?", "cats sleep a lot " * 40
        pair = r.pairs(query, [doc])[0]
        asked = r.model.tokenize(query, add_special=False, parse_special=False)
        assert len(pair) == 64 and list(pair[: len(asked)]) == asked
        assert r.rank(query, [doc]).shape == (1,)
        with pytest.raises(ContextOverflowError, match="Document 0 with the query is .* more than the 64"):
            r.rank(query, [doc], truncate=False)
        with pytest.raises(ContextOverflowError, match="leaving no room for a document"):
            r.rank("why " * 80, ["a"])
        with pytest.raises(ConfigError, match="non-empty list of strings"):
            r.rank(query, [])


def test_a_generating_model_without_pooling_is_refused(tiny_dir: Path):
    with pytest.raises(ModelFileError, match="pools no vector per input"):
        load_embedding(tiny_dir / "target.gguf")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(min_size=1, max_size=40), min_size=1, max_size=12))
def test_any_texts_give_one_unit_vector_each_in_order(embedder, texts):
    rows = embedder.embed(texts)
    assert rows.shape == (len(texts), embedder.dim)
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)
    # a text in a batch is rounded as the batch's shape makes llama.cpp's kernels round it (seen: 2e-5), not bit for
    # bit as alone; far below what a ranking by similarity could notice
    np.testing.assert_allclose(rows[-1], embedder.embed(texts[-1])[0], atol=1e-4)
