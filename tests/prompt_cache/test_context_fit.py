"""The context `serve` chooses: the largest the model was trained for that its KV caches fit in memory."""

from __future__ import annotations

import json

import click
import pytest
from conftest import real_models_dir
from serverproc import ServeProcess
from tinyarch import write_tiny_qwen35
from tinymodel import write_tiny_model

from localspec.cli.shared import model_options
from localspec.loading import MIN_CONTEXT, fit_context
from localspec.runtime.gguf_metadata import GGUFHeader, read_local
from localspec.runtime.model import FLASH_ATTN_CONTEXT, Model

GIB = 2**30


def header(**metadata) -> GGUFHeader:
    return GGUFHeader({"general.architecture": "a", "a.block_count": 4, "a.embedding_length": 256,
                       "a.attention.head_count": 8, **metadata}, 3, 0, 0)


def test_kv_bytes_count_the_layers_that_attend():
    assert header().kv_bytes_per_token() == 4 * 8 * (32 + 32) * 2  # no head_count_kv: one KV head a head
    assert header(**{"a.attention.head_count_kv": 2}).kv_bytes_per_token() == 4 * 2 * 64 * 2
    assert header(**{"a.attention.head_count_kv": 2, "a.attention.key_length": 128,
                     "a.attention.value_length": 64}).kv_bytes_per_token() == 4 * 2 * 192 * 2
    # hybrids: recurrent layers have no KV heads, or only every interval-th layer attends
    assert header(**{"a.attention.head_count_kv": [0, 0, 0, 2]}).kv_bytes_per_token() == 2 * 64 * 2
    assert header(**{"a.attention.head_count_kv": 2, "a.full_attention_interval": 4}).kv_bytes_per_token() == \
        2 * 64 * 2
    assert GGUFHeader({"general.architecture": "rwkv6"}, 3, 0, 0).kv_bytes_per_token() is None


@pytest.fixture(scope="module")
def long_trained(tmp_path_factory):
    """A tiny model that says it was trained for 131072 tokens."""
    path = tmp_path_factory.mktemp("long") / "long.gguf"
    write_tiny_model(path, seed=0, n_ctx=131072)
    return path


def test_the_training_context_where_memory_holds_it_else_the_most_that_fits(long_trained, tiny_dir):
    per_token = 2 * 2 * 16 * 2 * 2  # 2 layers, 2 KV heads of 16, keys and values, f16
    assert fit_context(long_trained, memory=64 * GIB).n_ctx == 131072
    weights = long_trained.stat().st_size
    room = weights + 2 * per_token * 40000  # half of it holds 40000 tokens: 39 steps of 1024
    choice = fit_context(long_trained, memory=room)
    assert choice.n_ctx == 39 * 1024 and "the most of the 131072" in choice.reason
    assert fit_context(long_trained, memory=weights).n_ctx == MIN_CONTEXT  # the least, memory or not
    both = fit_context(tiny_dir / "target.gguf", tiny_dir / "draft.gguf", memory=64 * GIB)
    assert both.n_ctx == 1024 and "training context" in both.reason and "KV cache takes" in both.reason


def test_an_mtp_head_counts_its_rows_and_cache_for_each_sequence(tmp_path):
    plain = header(**{"a.attention.head_count_kv": 2})
    assert plain.mtp_bytes_per_token() == 0
    head = header(**{"a.attention.head_count_kv": 2, "a.nextn_predict_layers": 1})
    assert head.mtp_bytes_per_token() == 256 * 4 + 2 * 64 * 2  # a float32 hidden row, one layer's keys and values
    path = tmp_path / "mtp.gguf"
    write_tiny_qwen35(path, seed=0, nextn=1, n_ctx=131072)
    kv, rows = read_local(path).kv_bytes_per_token(), read_local(path).mtp_bytes_per_token()
    room = path.stat().st_size + 2 * (kv + 4 * rows) * 40000  # half of it: 40000 tokens for four sequences
    one, four = fit_context(path, memory=room), fit_context(path, memory=room, parallel=4)
    assert four.n_ctx == 39 * 1024 < one.n_ctx and "MTP head" in four.reason


@pytest.mark.real
def test_the_real_pair_gets_its_32k_training_context():
    d = real_models_dir()
    choice = fit_context(d / "target.gguf", d / "draft.gguf", memory=16 * GIB)
    assert choice.n_ctx == 32768 and "1.3 GB" in choice.reason  # 40 KiB a token, both models
    assert fit_context(d / "target.gguf", d / "draft.gguf", memory=3 * GIB).n_ctx < 32768


def test_serve_says_the_context_it_chose_and_refuses_longer_prompts_in_each_apis_shape(tiny_dir, tmp_path):
    s = ServeProcess(["-t", str(tiny_dir / "target.gguf"), "-d", str(tiny_dir / "draft.gguf"), "-m", "plain"],
                     tmp_path)
    try:
        assert "context 1024 tokens: the model's training context" in s.output()
        assert s.get("/api/ps")["models"][0]["context_length"] == 1024
        long = " ".join(f"w{i}" for i in range(1500))
        status, reply, _ = s.post("/v1/chat/completions", json.dumps({"messages": [
            {"role": "user", "content": long}]}).encode())
        assert status == 400 and reply["error"]["code"] == "context_length_exceeded"
        status, reply, _ = s.post("/api/chat", json.dumps({"model": "target", "stream": False, "messages": [
            {"role": "user", "content": long}]}).encode())
        assert status == 400 and "context holds 1024" in reply["error"]
    finally:
        s.close()
    s = ServeProcess(["-t", str(tiny_dir / "target.gguf"), "--ctx", "512", "-m", "plain"], tmp_path)
    try:
        assert "training context" not in s.output() and s.get("/api/ps")["models"][0]["context_length"] == 512
    finally:
        s.close()


@pytest.mark.parametrize("writer", ["write_tiny_qwen35", "write_tiny_lfm2", "write_tiny_mamba"])
def test_the_headers_bytes_a_token_are_what_llama_cpp_keeps_for_each_token(writer, tmp_path):
    import tinyarch

    from localspec.runtime import memory
    from localspec.runtime.gguf_metadata import read_local
    from localspec.runtime.model import Model

    path = getattr(tinyarch, writer)(tmp_path / "m.gguf")
    estimate = read_local(path).kv_bytes_per_token() or 0
    with Model(path, n_ctx=256, n_threads=1) as m:
        tokens = m.tokenize("hello world " * 10, add_special=False)[:40]
        m.eval(tokens[:10])
        before = len(memory.save_sequence(m._ctx))
        m.eval(tokens[10:])
        grown = (len(memory.save_sequence(m._ctx)) - before) / 30
    assert estimate <= grown <= estimate + 32  # a saved cell also holds its position and sequence


def test_flash_attention_defaults_on_for_long_contexts_on_the_cpu(tiny_dir):
    # A long context is made for long prompts, which flash attention reads faster; short ones keep it off
    # (the f16 rounding would move logits between batch shapes for little gain). Asked for, either holds.
    target = tiny_dir / "target.gguf"
    for n_ctx, asked, expected in ((FLASH_ATTN_CONTEXT, None, True), (FLASH_ATTN_CONTEXT - 1024, None, False),
                                   (FLASH_ATTN_CONTEXT, False, False), (2048, True, True)):
        m = Model(target, n_ctx=n_ctx, n_gpu_layers=0, flash_attn=asked)
        try:
            assert m.flash_attn is expected, (n_ctx, asked)
            assert f"fa={expected}" in m.state_identity()  # a state saved under one is never loaded under the other
        finally:
            m.close()
    @click.command()
    @model_options
    def probe(models):  # the CLI's help names the same threshold
        pass

    assert str(FLASH_ATTN_CONTEXT) in probe.get_help(click.Context(probe))
