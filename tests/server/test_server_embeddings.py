"""Embeddings and reranking through the server, beside the pair: the official ``openai`` client (which asks for
base64 by default) and ``ollama`` client, the rerank route in llama-server's and Jina's shape, the model lists,
a chat answered while embeddings run, and each kind of bad input refused in its API's shape."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import numpy as np
import ollama
import openai
import pytest
import requests
from inprocess import local_server, serving
from tinyarch import write_tiny_bert

from localspec import load_embedding
from localspec.server.embedding import EmbeddingService

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "hello"]


@pytest.fixture(scope="module")
def beside(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("embed-server")
    write_tiny_bert(d / "tiny-embed.gguf", seed=3)
    write_tiny_bert(d / "tiny-rerank.gguf", seed=5, pooling="rank")
    with load_embedding(d / "tiny-embed.gguf", n_threads=2) as e, load_embedding(d / "tiny-rerank.gguf") as r:
        yield EmbeddingService(e, r)


@pytest.fixture(scope="module")
def port(tiny_pair, beside):
    with serving(local_server(tiny_pair), embeddings=beside) as p:
        yield p


def test_the_openai_client_gets_the_librarys_vectors_in_base64_and_floats(port, beside):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
    want = beside.embedder.embed(TEXTS)
    got = client.embeddings.create(model="tiny-embed", input=TEXTS)  # base64 on the wire, decoded by the client
    assert [d.index for d in got.data] == [0, 1, 2] and got.model == "tiny-embed"
    np.testing.assert_allclose(np.array([d.embedding for d in got.data]), want, atol=1e-6)
    floats = client.embeddings.create(model="tiny-embed", input=TEXTS[0], encoding_format="float")
    np.testing.assert_allclose(floats.data[0].embedding, want[0], atol=1e-6)
    assert got.usage.prompt_tokens == sum(len(t) for t in beside.embedder.tokens(TEXTS))
    cut = client.embeddings.create(model="tiny-embed", input=[[5, 6, 7]], dimensions=8, encoding_format="float")
    assert len(cut.data[0].embedding) == 8
    assert abs(np.linalg.norm(cut.data[0].embedding) - 1) < 1e-5
    assert {"tiny-embed", "tiny-rerank", "target"} <= {m.id for m in client.models.list().data}


def test_the_ollama_client_reads_embed_and_the_older_embeddings(port, beside):
    client = ollama.Client(host=f"http://127.0.0.1:{port}", timeout=60)
    got = client.embed(model="tiny-embed", input=TEXTS)
    np.testing.assert_allclose(np.array(got.embeddings), beside.embedder.embed(TEXTS), atol=1e-6)
    old = client.embeddings(model="tiny-embed:latest", prompt=TEXTS[0])  # the older route: not normalised
    np.testing.assert_allclose(old.embedding, beside.embedder.embed(TEXTS[0], normalize=False)[0], atol=1e-5)
    assert "tiny-embed:latest" in {m.model for m in client.list().models}
    long = "word " * 400  # past the model's 128 tokens: Ollama cuts it unless truncate is false
    assert len(client.embed(model="tiny-embed", input=long).embeddings) == 1
    with pytest.raises(ollama.ResponseError, match="more than the 128 tiny-embed reads") as err:
        client.embed(model="tiny-embed", input=long, truncate=False)
    assert err.value.status_code == 400


def test_rerank_orders_the_documents_by_the_rerankers_scores(port, beside):
    docs = ["cats sleep a lot", "the stock market fell", "a kitten is a young cat"]
    scores = beside.reranker.rank("what do cats do?", docs)
    r = requests.post(f"http://127.0.0.1:{port}/v1/rerank", timeout=60, json={
        "model": "tiny-rerank", "query": "what do cats do?", "documents": docs, "top_n": 2,
        "return_documents": True})
    assert r.status_code == 200, r.text
    body = r.json()
    best = list(np.argsort(-scores)[:2])
    assert [x["index"] for x in body["results"]] == best
    np.testing.assert_allclose([x["relevance_score"] for x in body["results"]], scores[best], atol=1e-5)
    assert body["results"][0]["document"] == {"text": docs[best[0]]}
    plain = requests.post(f"http://127.0.0.1:{port}/rerank", timeout=60,
                          json={"query": "q", "documents": [{"text": "a"}, "b"]}).json()
    assert sorted(x["index"] for x in plain["results"]) == [0, 1] and "document" not in plain["results"][0]


@pytest.mark.parametrize("path, body, status, words", [
    ("/v1/embeddings", {"model": "tiny-embed", "input": []}, 400, "input list is empty"),
    ("/v1/embeddings", {"model": "tiny-embed", "input": ""}, 400, "empty string"),
    ("/v1/embeddings", {"model": "tiny-embed", "input": "word " * 400}, 400, "more than the 128"),
    ("/v1/embeddings", {"model": "nomic", "input": "x"}, 404, "'nomic' does not exist"),
    ("/v1/embeddings", {"model": "tiny-embed", "input": "x", "dimensions": 0}, 400, "dimensions must be 1 to 32"),
    ("/v1/embeddings", {"model": "tiny-embed", "input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
    ("/v1/rerank", {"model": "tiny-embed", "query": "q", "documents": ["a"]}, 404, "reranker is 'tiny-rerank'"),
    ("/v1/rerank", {"query": "q", "documents": ["a", ""]}, 400, "Document 1 must be a non-empty string"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, 400, "'top_n' must be at least 1"),
])
def test_bad_input_is_a_sentence_in_openais_shape(port, path, body, status, words):
    r = requests.post(f"http://127.0.0.1:{port}{path}", json=body, timeout=60)
    assert r.status_code == status and words in r.json()["error"]["message"], r.text


def test_other_servers_fields_are_ignored_and_a_null_format_is_floats(port):
    """Clients written for other servers send fields of their own (NVIDIA's input_type, Jina's task, Cohere's
    rank_fields); they change nothing, as OpenAI's own server ignores what it does not know."""
    r = requests.post(f"http://127.0.0.1:{port}/v1/embeddings", timeout=60, json={
        "model": "tiny-embed", "input": ["a"], "input_type": "query", "task": "retrieval", "encoding_format": None})
    assert r.status_code == 200 and isinstance(r.json()["data"][0]["embedding"], list), r.text
    r = requests.post(f"http://127.0.0.1:{port}/v1/rerank", timeout=60, json={
        "query": "q", "documents": [{"text": "a", "title": "t"}], "rank_fields": ["text"], "max_tokens_per_doc": 9})
    assert r.status_code == 200 and r.json()["results"][0]["index"] == 0, r.text


def test_a_model_given_for_the_other_role_is_refused_at_start(tiny_dir: Path, tmp_path: Path):
    from clirun import run_cli

    write_tiny_bert(tmp_path / "r.gguf", seed=5, pooling="rank")
    r = run_cli(["serve", "-t", str(tiny_dir / "target.gguf"), "-d", "none", "--threads", "1", "--no-history",
                 "--embedding-model", str(tmp_path / "r.gguf"), "--port", "0"])
    assert r.exit_code == 2 and "r is a reranker; give it with --rerank-model, not --embedding-model" in r.output


def test_ollamas_routes_refuse_in_ollamas_shape(port):
    r = requests.post(f"http://127.0.0.1:{port}/api/embed", json={"model": "tiny-embed", "input": []}, timeout=60)
    assert r.status_code == 400 and "input list is empty" in r.json()["error"]


def test_a_server_without_an_embedding_model_says_how_to_load_one(tiny_pair):
    with serving(local_server(tiny_pair)) as p:
        r = requests.post(f"http://127.0.0.1:{p}/v1/embeddings", json={"model": "x", "input": "hi"}, timeout=60)
        assert r.status_code == 400 and "--embedding-model" in r.json()["error"]["message"]
        r = requests.post(f"http://127.0.0.1:{p}/v1/rerank", json={"query": "q", "documents": ["a"]}, timeout=60)
        assert r.status_code == 400 and "--rerank-model" in r.json()["error"]["message"]


def test_a_chat_is_answered_while_embeddings_run(port):
    """Embedding requests run beside the pair's generations: a chat sent amid a stream of them is answered."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
    many = [f"sentence number {i}" for i in range(64)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        embeds = [pool.submit(client.embeddings.create, model="tiny-embed", input=many) for _ in range(6)]
        chat = pool.submit(client.chat.completions.create, model="target", max_tokens=8,
                           messages=[{"role": "user", "content": "hi"}])
        assert chat.result(timeout=120).choices[0].message.content is not None
        assert all(len(f.result(timeout=120).data) == 64 for f in embeds)


def test_serve_loads_an_embedding_model_and_a_reranker_beside_the_pair(tiny_dir: Path, tmp_path: Path):
    """``localspec serve --embedding-model --rerank-model`` says what it loaded and answers with both."""
    from serverproc import ServeProcess

    write_tiny_bert(tmp_path / "e.gguf", seed=3)
    write_tiny_bert(tmp_path / "r.gguf", seed=5, pooling="rank")
    server = ServeProcess(["-t", str(tiny_dir / "target.gguf"), "-d", "none", "--threads", "1", "--no-history",
                           "--embedding-model", str(tmp_path / "e.gguf"), "--rerank-model", str(tmp_path / "r.gguf")],
                          tmp_path)
    try:
        status, body, _ = server.post("/v1/embeddings", b'{"model": "e", "input": ["hi", "there"]}')
        assert status == 200 and len(body["data"]) == 2 and len(body["data"][0]["embedding"]) == 32
        status, body, _ = server.post("/v1/rerank", b'{"model": "r", "query": "q", "documents": ["a", "b"]}')
        assert status == 200 and len(body["results"]) == 2
        out = server.output()
        assert "embedding model 'e' (mean pooling, up to 128 tokens an input)" in out
        assert "reranker 'r' (rank pooling" in out
    finally:
        server.close()
