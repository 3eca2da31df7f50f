"""Write tiny llama-architecture GGUFs with random weights for fast tests.

The vocabulary is byte-level BPE like GPT-2's: the 256 byte tokens, a few
merges, and special tokens for a ChatML template. llama.cpp loads such a
file in milliseconds and runs it in well under a millisecond per token.

A draft for a target is the same model with noise added to its weights
(``noise``): it agrees with the target often but not always, which is what
acceptance tests need. ``noise=0`` gives an identical copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import gguf
import numpy as np
from gguf.vocab import bytes_to_unicode

MERGES = ["Ġ t", "h e", "i n", "Ġ a", "e r", "o n", "Ġt he", "r e", "Ġ s", "a t", "e n", "o r"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


#: A Hermes-style chat template of our own, as Qwen2.5 writes tool calls: the tools in a system turn, calls
#: and their answers in the conversation.
HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou may call these functions:\n"
    "{%- for t in tools %}\n{{ t | tojson }}{%- endfor %}\n"
    'Call one as <tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call><|im_end|>\n{% endif %}'
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- elif m.tool_calls %}<|im_start|>assistant"
    "{%- for c in m.tool_calls %}\n<tool_call>\n"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}\n</tool_call>'
    "{%- endfor %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_tokens() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values, in byte order (gguf's own table)."""
    table = bytes_to_unicode()
    return [table[b] for b in range(256)]


def vocabulary(pad_to: int = 0, rename: Optional[dict[int, str]] = None,
               user_tokens: Sequence[str] = (), control_tokens: Sequence[str] = ()) -> tuple[list[str], list[int]]:
    """Token texts and types; ``user_tokens`` appends user-defined tokens (as Qwen's ``<tool_call>``),
    ``control_tokens`` control tokens (as GPT-OSS's ``<|channel|>``, which detokenize to nothing),
    ``pad_to`` padding tokens, ``rename`` alters texts."""
    tokens = byte_tokens() + [m.replace(" ", "") for m in MERGES] + SPECIALS + list(user_tokens) + list(control_tokens)
    types = [1] * (len(tokens) - len(SPECIALS) - len(user_tokens) - len(control_tokens)) + [3] * len(SPECIALS) \
        + [4] * len(user_tokens) + [3] * len(control_tokens)
    while len(tokens) < pad_to:
        tokens.append(f"[PAD{len(tokens)}]")
        types.append(5)  # unused
    for i, text in (rename or {}).items():
        tokens[i] = text
    return tokens, types


def write_tiny_model(
    path: Path,
    *,
    seed: int = 0,
    noise: float = 0.0,
    noise_seed: int = 1,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    n_ctx: int = 1024,
    pad_to: int = 0,
    rename: Optional[dict[int, str]] = None,
    tokenizer: str = "gpt2",
    chat_template: Optional[str] = CHAT_TEMPLATE,
    eos: Optional[int] = None,
    pad_clones: bool = False,
    metadata: Optional[dict[str, Any]] = None,
    user_tokens: Sequence[str] = (),
    control_tokens: Sequence[str] = (),
) -> Path:
    """Write a tiny llama GGUF and return its path.

    Args:
        path: where to write.
        seed: weights seed (same seed, same model).
        noise: std of Gaussian noise added to every weight, relative to its scale.
        noise_seed: seed of that noise.
        pad_to: pad the vocabulary with unused tokens up to this size.
        rename: token id -> text changes, to make a mismatching vocabulary.
        tokenizer: GGUF tokenizer model name ("gpt2" for byte-level BPE).
        chat_template: Jinja2 chat template stored in the file (None for none).
        eos: end-of-generation token id (default ``<|im_end|>``); pointing it at
            an ordinary token makes a model that stops where a test wants.
        pad_clones: give padding token i the embedding and output row of real
            token i, so the model puts as much probability on each padding
            token as on its original (half its mass when ``pad_to`` doubles the
            vocabulary), and the real tokens keep the unpadded model's weights.
        metadata: extra key/values (``general.size_label``, ``general.type``...):
            a str, bool, int (stored as uint64) or float (float32) each.
        user_tokens: user-defined tokens after the special ones (``<tool_call>``, ``</tool_call>``).
        control_tokens: control tokens after those (``<|channel|>``, ``<|message|>``).
    """
    tokens, types = vocabulary(pad_to, rename, user_tokens, control_tokens)
    n_vocab = len(tokens)
    # rows drawn at random; the rest are clones
    n_real = len(vocabulary(0, None, user_tokens, control_tokens)[0]) if pad_clones else n_vocab

    def rows(scale: float) -> np.ndarray:
        w = weight(n_real, n_embd, scale=scale)
        return w if n_real == n_vocab else w[np.arange(n_vocab) % n_real]
    rng = np.random.default_rng(seed)
    noise_rng = np.random.default_rng(noise_seed)
    head_dim = n_embd // n_head

    def weight(*shape: int, scale: float) -> np.ndarray:
        w = rng.standard_normal(shape) * scale
        if noise:
            w += noise_rng.standard_normal(shape) * scale * noise
        return w.astype(np.float32)  # GGUF F32; numpy scalars would otherwise make it f64

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model(tokenizer)
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>") if eos is None else eos)
    w.add_add_bos_token(False)
    if chat_template:
        w.add_chat_template(chat_template)
    for key, value in (metadata or {}).items():
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint64(key, value)
        else:
            w.add_float32(key, float(value))

    s = 1.0 / np.sqrt(n_embd)
    w.add_tensor("token_embd.weight", rows(1.0))
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", weight(n_embd, n_embd, scale=s))
        w.add_tensor(f"blk.{i}.attn_k.weight", weight(n_head_kv * head_dim, n_embd, scale=s))
        w.add_tensor(f"blk.{i}.attn_v.weight", weight(n_head_kv * head_dim, n_embd, scale=s))
        w.add_tensor(f"blk.{i}.attn_output.weight", weight(n_embd, n_embd, scale=s))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", weight(n_ff, n_embd, scale=s))
        w.add_tensor(f"blk.{i}.ffn_up.weight", weight(n_ff, n_embd, scale=s))
        w.add_tensor(f"blk.{i}.ffn_down.weight", weight(n_embd, n_ff, scale=1.0 / np.sqrt(n_ff)))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("output.weight", rows(0.5))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def token_id(text: str, user_tokens: Sequence[str] = (), control_tokens: Sequence[str] = ()) -> int:
    """The id of the token whose text is ``text``: a single character is its byte's token (``"Ġ"``-style
    stand-ins for a merge, as ``MERGES`` writes them without the space), anything else a special, user or
    control token of that vocabulary."""
    tokens, _ = vocabulary(0, None, user_tokens, control_tokens)
    if len(text.encode()) == 1:
        return byte_tokens().index(bytes_to_unicode()[text.encode()[0]])
    return tokens.index(text)


def bigram_weights(table: dict[int, dict[int, float]], n_vocab: int, n_embd: int,
                   otherwise: int) -> tuple[np.ndarray, np.ndarray]:
    """The token embedding and output head of a model that predicts from its last token alone, as ``table``
    designs it (see ``write_bigram_model``): one-hot embeddings (``n_embd`` >= ``n_vocab``), and a head that
    gives the RMS-normed one-hot row of each token its row of logits."""
    logits = np.zeros((n_vocab, n_vocab), dtype=np.float32)  # [previous, next]
    for prev in range(n_vocab):
        for nxt, logit in table.get(prev, {otherwise: 20.0}).items():
            logits[prev, nxt] = logit
    # RMS norm turns a one-hot row into sqrt(n_embd) times itself: the head divides that back out
    output = np.zeros((n_vocab, n_embd), dtype=np.float32)
    output[:, :n_vocab] = logits.T / np.sqrt(n_embd)
    return np.eye(n_vocab, n_embd, dtype=np.float32), output


def write_bigram_model(
    path: Path,
    table: dict[int, dict[int, float]],
    *,
    user_tokens: Sequence[str] = (),
    control_tokens: Sequence[str] = (),
    chat_template: Optional[str] = CHAT_TEMPLATE,
    otherwise: Optional[int] = None,
    n_head: int = 4,
    n_layer: int = 1,
    seed: int = 0,
) -> Path:
    """Write a tiny llama GGUF whose next token depends on the last token alone, as ``table`` designs it.

    The blocks' outputs are zero, so the residual stream is the last token's embedding, a one-hot row; the
    output head turns it into that token's row of ``table`` (``table[previous] = {next: logit}``, every
    other logit 0). A token without a row is followed by ``otherwise`` (default: ``<|im_end|>``, the end
    token) with logit 20. Greedy decoding walks the chain the table spells out, and a row with close
    logits is a designed choice for sampling.

    Args:
        path: where to write.
        table: the logits that follow each token (token ids, as ``token_id`` gives them).
        user_tokens: user-defined tokens (as ``write_tiny_model``).
        control_tokens: control tokens (as ``write_tiny_model``).
        chat_template: the chat template stored in the file.
        otherwise: the token that follows a token without a row.
        n_head: attention heads (the width is the vocabulary size rounded up to a multiple of 4 * n_head).
        n_layer: blocks (their attention and feed-forward weights are random, their outputs zero).
        seed: seed of those random weights.
    """
    tokens, types = vocabulary(0, None, user_tokens, control_tokens)
    n_vocab = len(tokens)
    eos = tokens.index("<|im_end|>")
    step = 4 * n_head
    n_embd = (n_vocab + step - 1) // step * step
    n_ff = 2 * n_embd
    head_dim = n_embd // n_head
    rng = np.random.default_rng(seed)
    embedding, output = bigram_weights(table, n_vocab, n_embd, eos if otherwise is None else otherwise)

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("bigram")
    w.add_context_length(1024)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(head_dim)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(eos)
    w.add_add_bos_token(False)
    if chat_template:
        w.add_chat_template(chat_template)
    w.add_tensor("token_embd.weight", embedding)
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", rand(n_embd, n_embd))
        w.add_tensor(f"blk.{i}.attn_k.weight", rand(n_embd, n_embd))
        w.add_tensor(f"blk.{i}.attn_v.weight", rand(n_embd, n_embd))
        w.add_tensor(f"blk.{i}.attn_output.weight", np.zeros((n_embd, n_embd), dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", rand(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_up.weight", rand(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_down.weight", np.zeros((n_embd, n_ff), dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("output.weight", output)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)
