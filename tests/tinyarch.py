"""Write tiny random-weight GGUFs of architectures other than llama, for fast tests.

Like ``tinymodel.write_tiny_model``: the same byte-level BPE vocabulary,
ChatML template, bos/eos choices, F32 tensors, and the same meaning of
``seed`` / ``noise`` / ``noise_seed`` (a noisy copy is a draft that agrees
with its target often but not always). The weights are drawn in the same
order whatever ``noise`` is, so noise only perturbs them.

* ``write_tiny_mamba``: "mamba", purely recurrent memory (no partial rollback).
* ``write_tiny_qwen35``: "qwen35", gated delta-net + full attention hybrid,
  with ``nextn`` MTP blocks appended.
* ``write_tiny_lfm2``: "lfm2", short convolution + attention hybrid.
* ``write_tiny_gemma2``: "gemma2", interleaved sliding-window attention.

Run ``python tests/tinyarch.py`` to write each one and check that llama.cpp
loads and runs it (and rolls back recurrent state where it can).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Optional, Sequence

import gguf
import numpy as np
from tinymodel import CHAT_TEMPLATE, MERGES, SPECIALS, bigram_weights, vocabulary


class _Draw:
    """Weights from ``seed`` plus, when ``noise`` > 0, relative noise from ``noise_seed``."""

    def __init__(self, seed: int, noise: float, noise_seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.noise_rng = np.random.default_rng(noise_seed)
        self.noise = noise

    def __call__(self, *shape: int, scale: float, mean: float = 0.0) -> np.ndarray:
        """A numpy ``shape`` array (GGUF/ggml order reversed) of N(mean, scale) values, noise added."""
        w = mean + self.rng.standard_normal(shape) * scale
        if self.noise:
            w += self.noise_rng.standard_normal(shape) * scale * self.noise
        return w.astype(np.float32)


def _ones(n: int) -> np.ndarray:
    return np.ones(n, dtype=np.float32)


def _writer(path: Path, arch: str, *, n_ctx: int, n_embd: int, n_layer: int, user_tokens: Sequence[str] = (),
            control_tokens: Sequence[str] = (), chat_template: str = CHAT_TEMPLATE) -> gguf.GGUFWriter:
    """A writer with the generic and tokenizer metadata of ``tinymodel`` already added (``user_tokens`` and
    ``control_tokens`` appended to the vocabulary)."""
    tokens, types = vocabulary(user_tokens=user_tokens, control_tokens=control_tokens)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(tokens.index(SPECIALS[0]))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(chat_template)
    return w


def _finish(w: gguf.GGUFWriter, path: Path) -> Path:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def _ffn(w: gguf.GGUFWriter, draw: _Draw, i: int, n_embd: int, n_ff: int, out: float = 1.0) -> None:
    """SwiGLU (or GeGLU) feed-forward weights of block ``i`` (``out`` scales its output projection)."""
    s = 1.0 / math.sqrt(n_embd)
    w.add_tensor(f"blk.{i}.ffn_gate.weight", draw(n_ff, n_embd, scale=s))
    w.add_tensor(f"blk.{i}.ffn_up.weight", draw(n_ff, n_embd, scale=s))
    w.add_tensor(f"blk.{i}.ffn_down.weight", draw(n_embd, n_ff, scale=1.0 / math.sqrt(n_ff)) * out)


def write_tiny_mamba(
    path: Path,
    *,
    seed: int = 0,
    noise: float = 0.0,
    noise_seed: int = 1,
    n_embd: int = 64,
    n_layer: int = 2,
    d_state: int = 16,
    d_conv: int = 4,
    dt_rank: int = 4,
    n_ctx: int = 1024,
) -> Path:
    """Write a tiny Mamba (v1) GGUF: recurrent state only, no KV cache.

    Args:
        path: where to write.
        seed: weights seed (same seed, same model).
        noise: std of Gaussian noise added to every weight, relative to its scale.
        noise_seed: seed of that noise.
        n_embd: model width; the inner width is 2 * n_embd (llama.cpp supports no other).
        n_layer: number of Mamba blocks.
        d_state: SSM state size per channel.
        d_conv: causal conv kernel width.
        dt_rank: rank of the time-step projection.
        n_ctx: training context length stored in the file.
    """
    draw = _Draw(seed, noise, noise_seed)
    n_vocab = len(vocabulary()[0])
    d_inner = 2 * n_embd
    w = _writer(path, "mamba", n_ctx=n_ctx, n_embd=n_embd, n_layer=n_layer)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_head_count_kv(0)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(dt_rank)
    w.add_layer_norm_rms_eps(1e-5)

    w.add_tensor("token_embd.weight", draw(n_vocab, n_embd, scale=1.0))
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", _ones(n_embd))
        w.add_tensor(f"blk.{i}.ssm_in.weight", draw(2 * d_inner, n_embd, scale=1.0 / math.sqrt(n_embd)))
        w.add_tensor(f"blk.{i}.ssm_conv1d.weight", draw(d_inner, d_conv, scale=1.0 / math.sqrt(d_conv)))
        w.add_tensor(f"blk.{i}.ssm_conv1d.bias", draw(d_inner, scale=0.1))
        w.add_tensor(f"blk.{i}.ssm_x.weight", draw(dt_rank + 2 * d_state, d_inner, scale=1.0 / math.sqrt(d_inner)))
        w.add_tensor(f"blk.{i}.ssm_dt.weight", draw(d_inner, dt_rank, scale=1.0 / math.sqrt(dt_rank)))
        # softplus(dt) around 0.05-0.3: states that remember a few to tens of tokens
        w.add_tensor(f"blk.{i}.ssm_dt.bias", draw(d_inner, scale=0.5, mean=-2.0))
        # A = -exp(A_log), as the converter stores it; no "weight" suffix on ssm_a / ssm_d
        w.add_tensor(f"blk.{i}.ssm_a", -np.exp(draw(d_inner, d_state, scale=0.5)))
        w.add_tensor(f"blk.{i}.ssm_d", draw(d_inner, scale=0.1, mean=1.0))
        w.add_tensor(f"blk.{i}.ssm_out.weight", draw(n_embd, d_inner, scale=1.0 / math.sqrt(d_inner)))
    w.add_tensor("output_norm.weight", _ones(n_embd))
    w.add_tensor("output.weight", draw(n_vocab, n_embd, scale=0.5))
    return _finish(w, path)


def write_tiny_qwen35(
    path: Path,
    *,
    seed: int = 0,
    noise: float = 0.0,
    noise_seed: int = 1,
    nextn: int = 1,
    n_embd: int = 64,
    n_layer: int = 2,
    full_attention_interval: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    head_dim: int = 16,
    n_rot: int = 8,
    n_ff: int = 128,
    d_state: int = 16,
    n_k_heads: int = 2,
    n_v_heads: int = 4,
    d_conv: int = 4,
    n_ctx: int = 1024,
    trunk: float = 1.0,
    bigram_head: bool = False,
    head_hidden: float = 0.0,
    table: Optional[dict[int, dict[int, float]]] = None,
    user_tokens: Sequence[str] = (),
    chat_template: str = CHAT_TEMPLATE,
) -> Path:
    """Write a tiny Qwen3.5 hybrid GGUF (gated delta-net + gated full attention) with MTP blocks.

    Block ``i`` is full attention when ``(i + 1) % full_attention_interval == 0``
    and linear attention (gated delta net) otherwise: with the defaults, block 0
    is linear and block 1 full. ``nextn`` MTP blocks follow as blocks
    ``n_layer .. n_layer + nextn - 1`` (llama.cpp runs MTP drafts for exactly one).

    Args:
        path: where to write.
        seed: weights seed (same seed, same model).
        noise: std of Gaussian noise added to every weight, relative to its scale.
        noise_seed: seed of that noise.
        nextn: number of next-n (MTP) blocks appended; 0 for none.
        n_embd: model width.
        n_layer: number of regular blocks.
        full_attention_interval: every this many blocks, one is full attention.
        n_head: query heads of full-attention blocks.
        n_head_kv: key/value heads of full-attention blocks.
        head_dim: attention head size.
        n_rot: rotated dimensions per head (partial rotary, IMRoPE sections sum to n_rot / 2).
        n_ff: feed-forward width.
        d_state: delta-net key/value head size.
        n_k_heads: delta-net key heads (``ssm.group_count``).
        n_v_heads: delta-net value heads (``ssm.time_step_rank``); a multiple of n_k_heads.
        d_conv: delta-net causal conv kernel width.
        n_ctx: training context length stored in the file.
        trunk: scale of every regular block's output projections (attention, delta net, FFN); near 0 the
            model predicts mostly from its last token alone, like a bigram table.
        bigram_head: make the MTP block exactly that bigram table (its projection passes the token
            embedding through, its block adds nothing), so it guesses what a small ``trunk`` target says.
        head_hidden: with ``bigram_head``, how much of the target's hidden state the projection adds to the
            embedding (0: none), so that the head's guesses depend on the hidden state it is given too.
        table: design the bigram instead of drawing it (as ``tinymodel.write_bigram_model``: ``table[previous]
            = {next: logit}``, the end token after a token without a row); needs ``n_embd`` at least the
            vocabulary's size, and gives the designed model with ``trunk=0``.
        user_tokens: user-defined tokens appended to the vocabulary.
        chat_template: the chat template stored in the file.
    """
    draw = _Draw(seed, noise, noise_seed)
    n_vocab = len(vocabulary(user_tokens=user_tokens)[0])
    key_dim, value_dim = d_state * n_k_heads, d_state * n_v_heads
    half = n_rot // 2
    sections = [half - 2 * (half // 3), half // 3, half // 3, 0]  # text positions: any split works
    w = _writer(path, "qwen35", n_ctx=n_ctx, n_embd=n_embd, n_layer=n_layer + nextn, user_tokens=user_tokens,
                chat_template=chat_template)
    embedding, head = draw(n_vocab, n_embd, scale=1.0), np.empty(0)
    if nextn:
        w.add_nextn_predict_layers(nextn)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(n_rot)
    w.add_rope_dimension_sections(sections)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_full_attention_interval(full_attention_interval)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(value_dim)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(n_v_heads)
    w.add_ssm_group_count(n_k_heads)

    s, s_o = 1.0 / math.sqrt(n_embd), 1.0 / math.sqrt(n_head * head_dim)

    def attention(i: int, out: float) -> None:
        # the query projection holds query and output gate, per head: [q(head_dim), gate(head_dim)]
        w.add_tensor(f"blk.{i}.attn_q.weight", draw(2 * n_head * head_dim, n_embd, scale=s))
        w.add_tensor(f"blk.{i}.attn_k.weight", draw(n_head_kv * head_dim, n_embd, scale=s))
        w.add_tensor(f"blk.{i}.attn_v.weight", draw(n_head_kv * head_dim, n_embd, scale=s))
        w.add_tensor(f"blk.{i}.attn_output.weight", draw(n_embd, n_head * head_dim, scale=s_o) * out)
        w.add_tensor(f"blk.{i}.attn_q_norm.weight", _ones(head_dim))
        w.add_tensor(f"blk.{i}.attn_k_norm.weight", _ones(head_dim))

    if table is not None:
        embedding, head = bigram_weights(table, n_vocab, n_embd, vocabulary()[0].index("<|im_end|>"))
    w.add_tensor("token_embd.weight", embedding)
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", _ones(n_embd))
        w.add_tensor(f"blk.{i}.post_attention_norm.weight", _ones(n_embd))
        if (i + 1) % full_attention_interval == 0:
            attention(i, trunk)
        else:
            conv_dim = 2 * key_dim + value_dim
            w.add_tensor(f"blk.{i}.attn_qkv.weight", draw(conv_dim, n_embd, scale=s))  # q, k, v (pre-conv)
            w.add_tensor(f"blk.{i}.attn_gate.weight", draw(value_dim, n_embd, scale=s))  # z, gates the output norm
            w.add_tensor(f"blk.{i}.ssm_conv1d.weight", draw(conv_dim, d_conv, scale=1.0 / math.sqrt(d_conv)))
            w.add_tensor(f"blk.{i}.ssm_dt.bias", draw(n_v_heads, scale=0.5, mean=-1.0))
            w.add_tensor(f"blk.{i}.ssm_a", -np.exp(draw(n_v_heads, scale=0.5)))  # -exp(A_log); no suffix
            w.add_tensor(f"blk.{i}.ssm_beta.weight", draw(n_v_heads, n_embd, scale=s))
            w.add_tensor(f"blk.{i}.ssm_alpha.weight", draw(n_v_heads, n_embd, scale=s))
            w.add_tensor(f"blk.{i}.ssm_norm.weight", _ones(d_state))
            w.add_tensor(f"blk.{i}.ssm_out.weight", draw(n_embd, value_dim, scale=1.0 / math.sqrt(value_dim)) * trunk)
        _ffn(w, draw, i, n_embd, n_ff, trunk)
    w.add_tensor("output_norm.weight", _ones(n_embd))
    output = draw(n_vocab, n_embd, scale=0.5)
    w.add_tensor("output.weight", output if table is None else head)
    for i in range(n_layer, n_layer + nextn):  # drawn last: the trunk is the same whatever nextn is
        # a full-attention block fed with [enorm(embedding), hnorm(hidden)] through eh_proj;
        # embed_tokens and shared_head_head are left out, so the main embedding and head are shared
        w.add_tensor(f"blk.{i}.attn_norm.weight", _ones(n_embd))
        w.add_tensor(f"blk.{i}.post_attention_norm.weight", _ones(n_embd))
        out = 0.0 if bigram_head else 1.0
        attention(i, out)
        _ffn(w, draw, i, n_embd, n_ff, out)
        eh = draw(n_embd, 2 * n_embd, scale=1.0 / math.sqrt(2 * n_embd))
        if bigram_head:  # [enorm(embedding), hnorm(hidden)] -> the embedding half alone
            eh = np.hstack([np.eye(n_embd), head_hidden * np.eye(n_embd)]).astype(np.float32)
        w.add_tensor(f"blk.{i}.nextn.eh_proj.weight", eh)
        w.add_tensor(f"blk.{i}.nextn.enorm.weight", _ones(n_embd))
        w.add_tensor(f"blk.{i}.nextn.hnorm.weight", _ones(n_embd))
        w.add_tensor(f"blk.{i}.nextn.shared_head_norm.weight", _ones(n_embd))
    return _finish(w, path)


def write_tiny_lfm2(
    path: Path,
    *,
    seed: int = 0,
    noise: float = 0.0,
    noise_seed: int = 1,
    n_embd: int = 64,
    n_layer: int = 3,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    l_cache: int = 3,
    n_ctx: int = 1024,
) -> Path:
    """Write a tiny LFM2 GGUF: gated short-convolution blocks with attention blocks between.

    Even blocks (0, 2, ...) are convolution, odd ones attention: llama.cpp tells
    them apart by a per-block ``attention.head_count_kv`` of 0.

    Args:
        path: where to write.
        seed: weights seed (same seed, same model).
        noise: std of Gaussian noise added to every weight, relative to its scale.
        noise_seed: seed of that noise.
        n_embd: model width.
        n_layer: number of blocks.
        n_head: query heads of attention blocks.
        n_head_kv: key/value heads of attention blocks.
        n_ff: feed-forward width.
        l_cache: short-convolution kernel width (``shortconv.l_cache``).
        n_ctx: training context length stored in the file.
    """
    draw = _Draw(seed, noise, noise_seed)
    n_vocab = len(vocabulary()[0])
    head_dim = n_embd // n_head
    kv_heads = [0 if i % 2 == 0 else n_head_kv for i in range(n_layer)]
    w = _writer(path, "lfm2", n_ctx=n_ctx, n_embd=n_embd, n_layer=n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_shortconv_l_cache(l_cache)

    s = 1.0 / math.sqrt(n_embd)
    w.add_tensor("token_embd.weight", draw(n_vocab, n_embd, scale=1.0))
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", _ones(n_embd))
        if kv_heads[i] == 0:
            w.add_tensor(f"blk.{i}.shortconv.in_proj.weight", draw(3 * n_embd, n_embd, scale=s))  # B, C, x
            w.add_tensor(f"blk.{i}.shortconv.conv.weight", draw(n_embd, l_cache, scale=1.0 / math.sqrt(l_cache)))
            w.add_tensor(f"blk.{i}.shortconv.out_proj.weight", draw(n_embd, n_embd, scale=s))
        else:
            w.add_tensor(f"blk.{i}.attn_q.weight", draw(n_embd, n_embd, scale=s))
            w.add_tensor(f"blk.{i}.attn_k.weight", draw(n_head_kv * head_dim, n_embd, scale=s))
            w.add_tensor(f"blk.{i}.attn_v.weight", draw(n_head_kv * head_dim, n_embd, scale=s))
            w.add_tensor(f"blk.{i}.attn_output.weight", draw(n_embd, n_embd, scale=s))
            w.add_tensor(f"blk.{i}.attn_q_norm.weight", _ones(head_dim))
            w.add_tensor(f"blk.{i}.attn_k_norm.weight", _ones(head_dim))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", _ones(n_embd))
        _ffn(w, draw, i, n_embd, n_ff)
    w.add_tensor("token_embd_norm.weight", _ones(n_embd))  # LFM2's final norm goes by this name in GGUF
    w.add_tensor("output.weight", draw(n_vocab, n_embd, scale=0.5))
    return _finish(w, path)


def write_tiny_gemma2(
    path: Path,
    *,
    seed: int = 0,
    noise: float = 0.0,
    noise_seed: int = 1,
    window: int = 8,
    n_embd: int = 64,
    n_layer: int = 4,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    n_ctx: int = 1024,
) -> Path:
    """Write a tiny Gemma 2 GGUF: sliding-window blocks (even) interleaved with global ones (odd).

    The output head is tied to the token embedding, as in Gemma 2 (llama.cpp
    loads no ``output.weight`` for it), and logits are soft-capped at 30. To
    keep greedy output from repeating its input token, the final norm is drawn
    with zero mean and the post-attention / post-FFN norms have gain 4.

    Args:
        path: where to write.
        seed: weights seed (same seed, same model).
        noise: std of Gaussian noise added to every weight, relative to its scale.
        noise_seed: seed of that noise.
        window: sliding window, in tokens, of the even blocks.
        n_embd: model width.
        n_layer: number of blocks.
        n_head: query heads.
        n_head_kv: key/value heads.
        n_ff: feed-forward width.
        n_ctx: training context length stored in the file.
    """
    draw = _Draw(seed, noise, noise_seed)
    n_vocab = len(vocabulary()[0])
    head_dim = n_embd // n_head
    w = _writer(path, "gemma2", n_ctx=n_ctx, n_embd=n_embd, n_layer=n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_sliding_window(window)
    w.add_attn_logit_softcapping(50.0)
    w.add_final_logit_softcapping(30.0)

    s = 1.0 / math.sqrt(n_embd)
    # tied: the input (scaled by sqrt(n_embd) in the graph) and the output head
    w.add_tensor("token_embd.weight", draw(n_vocab, n_embd, scale=0.25))
    post = 4.0 * _ones(n_embd)  # post-norm gains > 1: blocks, not the sqrt(n_embd)-scaled input, lead the residual
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", _ones(n_embd))
        w.add_tensor(f"blk.{i}.attn_q.weight", draw(n_head * head_dim, n_embd, scale=s))
        w.add_tensor(f"blk.{i}.attn_k.weight", draw(n_head_kv * head_dim, n_embd, scale=s))
        w.add_tensor(f"blk.{i}.attn_v.weight", draw(n_head_kv * head_dim, n_embd, scale=s))
        w.add_tensor(f"blk.{i}.attn_output.weight", draw(n_embd, n_head * head_dim, scale=s))
        w.add_tensor(f"blk.{i}.post_attention_norm.weight", post)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", _ones(n_embd))
        _ffn(w, draw, i, n_embd, n_ff)
        w.add_tensor(f"blk.{i}.post_ffw_norm.weight", post)
    # zero-mean final norm: with a tied head, a norm of ones makes the current token's own embedding
    # (scaled by sqrt(n_embd) on the residual stream) its top logit, and greedy output repeats it forever
    w.add_tensor("output_norm.weight", draw(n_embd, scale=1.0))
    return _finish(w, path)


# --- self-check -------------------------------------------------------------------------------------------------


def write_tiny_bert(path: Path, *, seed: int = 0, pooling: str = "mean", n_ctx: int = 128, n_embd: int = 32,
                    n_layer: int = 2, n_head: int = 4, n_ff: int = 64, labels: Sequence[str] = ("score",)) -> Path:
    """A tiny "bert" encoder (no memory: each input is read whole), pooling ``"mean"``, ``"cls"`` or ``"rank"``
    (a reranker: a classification head giving one score per label for a query and a document)."""
    draw = _Draw(seed, 0.0, 1)
    w = _writer(path, "bert", n_ctx=n_ctx, n_embd=n_embd, n_layer=n_layer)
    n_vocab = len(vocabulary()[0])
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_token_type_count(2)
    w.add_pooling_type({"mean": gguf.PoolingType.MEAN, "cls": gguf.PoolingType.CLS,
                        "rank": gguf.PoolingType.RANK}[pooling])
    s = 1.0 / math.sqrt(n_embd)
    w.add_tensor("token_embd.weight", draw(n_vocab, n_embd, scale=1.0))
    w.add_tensor("token_types.weight", draw(2, n_embd, scale=0.1))
    w.add_tensor("position_embd.weight", draw(n_ctx, n_embd, scale=0.1))
    w.add_tensor("token_embd_norm.weight", _ones(n_embd))
    w.add_tensor("token_embd_norm.bias", np.zeros(n_embd, dtype=np.float32))
    for i in range(n_layer):
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(f"blk.{i}.{name}.weight", draw(n_embd, n_embd, scale=s))
            w.add_tensor(f"blk.{i}.{name}.bias", draw(n_embd, scale=0.02))
        for name in ("attn_output_norm", "layer_output_norm"):
            w.add_tensor(f"blk.{i}.{name}.weight", _ones(n_embd))
            w.add_tensor(f"blk.{i}.{name}.bias", np.zeros(n_embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_up.weight", draw(n_ff, n_embd, scale=s))
        w.add_tensor(f"blk.{i}.ffn_up.bias", draw(n_ff, scale=0.02))
        w.add_tensor(f"blk.{i}.ffn_down.weight", draw(n_embd, n_ff, scale=1.0 / math.sqrt(n_ff)))
        w.add_tensor(f"blk.{i}.ffn_down.bias", draw(n_embd, scale=0.02))
    if pooling == "rank":
        w.add_classifier_output_labels(list(labels))
        w.add_tensor("cls.weight", draw(n_embd, n_embd, scale=s))
        w.add_tensor("cls.bias", draw(n_embd, scale=0.02))
        w.add_tensor("cls.output.weight", draw(len(labels), n_embd, scale=s))
        w.add_tensor("cls.output.bias", draw(len(labels), scale=0.02))
    return _finish(w, path)


def _rollback_check(model_path: Path, n_rs_seq: int = 8) -> dict[str, object]:
    """Decode 10 tokens, remove the last 4, decode them again; compare with a fresh 10-token decode."""
    import ctypes

    import llama_cpp as lc

    mparams = lc.llama_model_default_params()
    model = lc.llama_model_load_from_file(str(model_path).encode(), mparams)
    assert model, f"cannot load {model_path}"
    n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
    out: dict[str, object] = {
        "recurrent": lc.llama_model_is_recurrent(model),
        "hybrid": lc.llama_model_is_hybrid(model),
        "nextn": lc.llama_model_n_layer_nextn(model),
    }
    tokens = list(b"The quick ")  # byte token ids: a byte's token id is its value
    assert len(tokens) == 10

    def context() -> lc.llama_context_p:
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = 512
        cparams.n_rs_seq = n_rs_seq
        ctx = lc.llama_init_from_model(model, cparams)
        assert ctx
        return ctx

    def decode(ctx: lc.llama_context_p, toks: list[int], pos0: int) -> np.ndarray:
        batch = lc.llama_batch_init(len(toks), 0, 1)
        try:
            for j, t in enumerate(toks):
                batch.token[j] = t
                batch.pos[j] = pos0 + j
                batch.n_seq_id[j] = 1
                batch.seq_id[j][0] = 0
                batch.logits[j] = j == len(toks) - 1
            batch.n_tokens = len(toks)
            rc = lc.llama_decode(ctx, batch)
            assert rc == 0, f"llama_decode returned {rc}"
        finally:
            lc.llama_batch_free(batch)
        ptr = lc.llama_get_logits_ith(ctx, -1)
        return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,)).copy()

    ctx = context()
    out["n_rs_seq"] = lc.llama_n_rs_seq(ctx)
    decode(ctx, tokens, 0)
    mem = lc.llama_get_memory(ctx)
    out["seq_rm"] = bool(lc.llama_memory_seq_rm(mem, 0, 6, -1))
    if out["seq_rm"]:
        again = decode(ctx, tokens[6:], 6)
        # second time, one token at a time
        assert lc.llama_memory_seq_rm(mem, 0, 6, -1)
        for j in range(6, 10):
            single = decode(ctx, [tokens[j]], j)
        fresh_ctx = context()
        fresh = decode(fresh_ctx, tokens, 0)
        lc.llama_free(fresh_ctx)
        out["diff_batch"] = float(np.abs(again - fresh).max())
        out["diff_1by1"] = float(np.abs(single - fresh).max())
    lc.llama_free(ctx)
    lc.llama_model_free(model)
    return out


def _mtp_loads(model_path: Path) -> str:
    """Whether the model loads with ``load_mtp = True``, and a default and an MTP context can be made."""
    import llama_cpp as lc

    mparams = lc.llama_model_default_params()
    if not hasattr(mparams, "load_mtp"):
        return "no load_mtp field"
    mparams.load_mtp = True
    model = lc.llama_model_load_from_file(str(model_path).encode(), mparams)
    if not model:
        return "load failed"
    results = ["loads"]
    for kind, ctx_type in (("default", lc.LLAMA_CONTEXT_TYPE_DEFAULT), ("MTP", lc.LLAMA_CONTEXT_TYPE_MTP)):
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = 512
        cparams.ctx_type = ctx_type
        ctx = lc.llama_init_from_model(model, cparams)
        results.append(f"{kind} context {'ok' if ctx else 'failed'}")
        if ctx:
            lc.llama_free(ctx)
    lc.llama_model_free(model)
    return ", ".join(results)


def _greedy(path: Path, prompt: str, n: int = 24) -> list[int]:
    """Greedy continuation token ids of ``prompt``, eos or not."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=512, verbose=False)
    out: list[int] = []
    for t in llm.generate(llm.tokenize(prompt.encode(), add_bos=False), temp=0.0):
        out.append(t)
        if len(out) == n:
            break
    return out


def _agreement(target: Path, draft: Path, prompt: str, gen: list[int]) -> float:
    """Share of the target's greedy tokens ``gen`` that the draft also predicts, given the same prefix."""
    import llama_cpp

    tops = []
    for path in (target, draft):
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=512, logits_all=True, verbose=False)
        toks = llm.tokenize(prompt.encode(), add_bos=False)
        llm.eval(toks + gen)
        tops.append(np.argmax(llm.scores[len(toks) - 1 : len(toks) + len(gen) - 1], axis=1))
    return float(np.mean(tops[0] == tops[1]))


def _self_check(folder: Optional[Path] = None) -> None:
    """Write each architecture, run it, and print a table (``python tests/tinyarch.py``)."""
    import itertools
    import tempfile
    import time

    import llama_cpp

    def quiet(level: int, text: bytes, data: object) -> None:
        pass

    callback = llama_cpp.llama_log_callback(quiet)  # kept alive while llama.cpp may call it
    llama_cpp.llama_log_set(callback, None)
    folder = folder or Path(tempfile.mkdtemp(prefix="tinyarch-"))
    writers: dict[str, Callable[..., Path]] = {
        "mamba": write_tiny_mamba, "qwen35": write_tiny_qwen35, "lfm2": write_tiny_lfm2, "gemma2": write_tiny_gemma2,
    }
    prompt = "The quick brown fox"
    print(f"{'arch':7} {'determ':6} {'distinct':8} {'maxrun':6} {'prompt':6} {'draft':5} {'ms/tok':6} "
          f"{'recr':5} {'hybrid':6} {'nextn':5} {'n_rs':4} {'seq_rm':6} {'d_batch':8} {'d_1by1':8} text")
    for name, write in writers.items():
        path = write(folder / f"{name}.gguf")
        texts, ms = [], math.inf
        for _ in range(2):  # fresh objects: the same text twice
            llm = llama_cpp.Llama(model_path=str(path), n_ctx=512, verbose=False)
            t0 = time.perf_counter()
            r = llm.create_completion(prompt, max_tokens=24, temperature=0)
            assert isinstance(r, dict)
            ms = min(ms, (time.perf_counter() - t0) * 1000 / max(1, r["usage"]["completion_tokens"]))
            texts.append(r["choices"][0]["text"])
            del llm
        gen = _greedy(path, prompt)
        max_run = max(len(list(g)) for _, g in itertools.groupby(gen))
        differs = _greedy(path, "Hello") != gen
        agree = _agreement(path, write(folder / f"{name}-draft.gguf", noise=0.05), prompt, gen)
        low = _rollback_check(path)
        d_batch, d_1by1 = (f"{low[k]:.1e}" if k in low else "-" for k in ("diff_batch", "diff_1by1"))
        print(f"{name:7} {texts[0] == texts[1]!s:6} {len(set(gen)):<8} {max_run:<6} {differs!s:6} {agree:<5.2f} "
              f"{ms:<6.2f} {low['recurrent']!s:5} {low['hybrid']!s:6} {low['nextn']!s:5} {low['n_rs_seq']!s:4} "
              f"{low['seq_rm']!s:6} {d_batch:8} {d_1by1:8} {texts[0]!r}")
        if name == "qwen35":
            print(f"{'':7} load_mtp=True: {_mtp_loads(path)}")


if __name__ == "__main__":
    _self_check()
