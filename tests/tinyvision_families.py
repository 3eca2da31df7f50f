"""Write tiny random-weight (target, projector) GGUF pairs of vision families whose decoding differs from LLaVA's.

``tinyvision.write_tiny_mmproj`` is a LLaVA projector: one text position per image embedding, causal attention.
These two families change that, and llama.cpp's libmtmd loads each pair and runs it:

* ``write_tiny_qwen2vl``: a ``qwen2vl`` text model (M-RoPE, ``rope.dimension_sections``) and a ``qwen2vl_merger``
  projector. ``mtmd_decode_use_mrope`` is true and an image of ``nx`` x ``ny`` embeddings takes ``max(nx, ny)``
  positions (``mtmd_input_chunk_get_n_pos``), fewer than its ``nx * ny`` embeddings (``n_tokens``). The image
  keeps its aspect ratio: about one embedding per 16 x 16 pixels, at least 8 (clip.cpp's minimum for the family).
* ``write_tiny_gemma3v``: a ``gemma3`` text model (interleaved sliding-window layers) and a ``gemma3`` projector
  (SigLIP encoder, average pooling, RMS norm, linear projection). ``mtmd_decode_use_non_causal`` is true for its
  image chunk: the image's embeddings attend to each other both ways. Every image is resized to a fixed square and
  becomes ``(image_size // patch_size // pool) ** 2`` embeddings (16 with the defaults).

Both text models have ``tinymodel``'s byte-level vocabulary with the family's image delimiters added as control
tokens (libmtmd writes them around each image as text), and ``PARTS_TEMPLATE``, a ChatML template that reads a
content list's text parts as llama-cpp-python's ``MTMDChatHandler`` passes them.

Run ``python tests/tinyvision_families.py`` to write both pairs and run them through llama-cpp-python's own
``MTMDChatHandler``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional, Sequence

import gguf
import numpy as np
from tinyarch import _finish as finish
from tinyarch import _writer
from tinymodel import vocabulary
from tinyvision import clip_writer, draw, ones, vit_blocks

#: ChatML, reading a content list's text parts (the image part arrives as a text part holding the media marker).
PARTS_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for p in m['content'] %}{% if p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: The tokens libmtmd puts around a Qwen2-VL image (``<|image_pad|>`` is the HF processor's, unused by libmtmd).
QWEN2VL_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>")
#: The tokens libmtmd puts around a Gemma 3 image.
GEMMA3_TOKENS = ("<start_of_image>", "<end_of_image>")

#: CLIP's normalisation (Qwen2-VL's image processor) and SigLIP's (Gemma 3's).
CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
SIGLIP_MEAN, SIGLIP_STD = [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]


def _text_writer(path: Path, arch: str, control_tokens: Sequence[str], *, n_ctx: int, n_embd: int, n_layer: int,
                 n_head: int, n_head_kv: int, n_ff: int, rms_eps: float) -> tuple[gguf.GGUFWriter, int]:
    """``tinyarch``'s writer of ``arch`` with ``control_tokens`` and ``PARTS_TEMPLATE``, and the shape keys every
    family reads; returns it and the vocabulary size."""
    w = _writer(path, arch, n_ctx=n_ctx, n_embd=n_embd, n_layer=n_layer, control_tokens=control_tokens,
                chat_template=PARTS_TEMPLATE)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(rms_eps)
    return w, len(vocabulary(control_tokens=control_tokens)[0])


def write_tiny_qwen2vl(folder: Path, *, seed: int = 0, n_embd: int = 64, n_layer: int = 2, n_head: int = 4,
                       n_head_kv: int = 2, n_ff: int = 128, n_ctx: int = 1024, patch_size: int = 8,
                       v_embd: int = 32, v_layer: int = 1, v_head: int = 2, v_ff: int = 64) -> tuple[Path, Path]:
    """Write ``folder/tiny-qwen2vl.gguf`` and ``folder/mmproj-tiny-qwen2vl.gguf``; return (target, mmproj).

    The target: Qwen2 blocks (biased q/k/v, SwiGLU) with multi-axis RoPE: ``rope.dimension_sections``
    (4 int32, required) splits each head's ``head_dim / 2`` rotary frequencies among the temporal, height and
    width position axes; text tokens have the same position on every axis. The projector: two ``patch_size``
    stride convolutions without bias (``v.patch_embd.weight`` and ``.weight.1``, the two frames of Qwen's
    temporal patch, summed for a still image), no position embedding (2-D RoPE inside the blocks, so
    ``v_embd // v_head`` must be a multiple of 4), LayerNorm blocks, ``v.post_ln``, then the merger: each 2 x 2
    patch group concatenated (``4 * v_embd``) through ``mm.0``, GELU, ``mm.2`` to ``n_embd``.

    Args:
        folder: where to write both files.
        seed: weights seed (same seed, same bytes).
        n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx: the text model's shape.
        patch_size: side of a patch; an image embedding covers 2 x 2 patches.
        v_embd, v_layer, v_head, v_ff: the encoder's shape.
    """
    head_dim, v_head_dim = n_embd // n_head, v_embd // v_head
    if head_dim % 4 or v_head_dim % 4 or v_ff == v_embd:
        raise ValueError("head sizes must be multiples of 4, and v_ff unlike v_embd")
    rng = np.random.default_rng(seed)
    target = Path(folder) / "tiny-qwen2vl.gguf"
    mmproj = Path(folder) / f"mmproj-{target.stem}.gguf"

    w, n_vocab = _text_writer(target, "qwen2vl", QWEN2VL_TOKENS, n_ctx=n_ctx, n_embd=n_embd, n_layer=n_layer,
                              n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, rms_eps=1e-6)
    w.add_rope_dimension_count(head_dim)  # the qwen2vl graph asserts n_rot == head_dim
    w.add_rope_freq_base(1000000.0)
    half = head_dim // 2  # Qwen2-VL's [16, 24, 24] of 64, scaled: temporal, height, width, unused
    w.add_rope_dimension_sections([half - 2 * (3 * half // 8), 3 * half // 8, 3 * half // 8, 0])
    s = 1.0 / math.sqrt(n_embd)
    w.add_tensor("token_embd.weight", draw(rng, n_vocab, n_embd, scale=1.0))
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", ones(n_embd))
        for name, rows in (("attn_q", n_embd), ("attn_k", n_head_kv * head_dim), ("attn_v", n_head_kv * head_dim)):
            w.add_tensor(f"blk.{i}.{name}.weight", draw(rng, rows, n_embd, scale=s))
            w.add_tensor(f"blk.{i}.{name}.bias", draw(rng, rows, scale=0.1))
        w.add_tensor(f"blk.{i}.attn_output.weight", draw(rng, n_embd, n_embd, scale=s))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", ones(n_embd))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", draw(rng, n_ff, n_embd, scale=s))
        w.add_tensor(f"blk.{i}.ffn_up.weight", draw(rng, n_ff, n_embd, scale=s))
        w.add_tensor(f"blk.{i}.ffn_down.weight", draw(rng, n_embd, n_ff, scale=1.0 / math.sqrt(n_ff)))
    w.add_tensor("output_norm.weight", ones(n_embd))
    w.add_tensor("output.weight", draw(rng, n_vocab, n_embd, scale=0.5))
    finish(w, target)

    # image_size is required but unused: the image keeps its own size, aligned to 2 * patch_size
    w = clip_writer(mmproj, "qwen2vl_merger", image_size=4 * patch_size, patch_size=patch_size, n_embd=v_embd,
                     n_ff=v_ff, n_layer=v_layer, n_head=v_head, n_embd_target=n_embd, eps=1e-6, mean=CLIP_MEAN,
                     std=CLIP_STD, use_gelu=False)
    patch_scale = 1.0 / math.sqrt(2 * 3 * patch_size**2)  # two convolutions summed
    w.add_tensor("v.patch_embd.weight", draw(rng, v_embd, 3, patch_size, patch_size, scale=patch_scale))
    w.add_tensor("v.patch_embd.weight.1", draw(rng, v_embd, 3, patch_size, patch_size, scale=patch_scale))
    vit_blocks(w, rng, v_layer, v_embd, v_ff)
    merged = 4 * v_embd
    w.add_tensor("mm.0.weight", draw(rng, merged, merged, scale=1.0 / math.sqrt(merged)))
    w.add_tensor("mm.0.bias", draw(rng, merged, scale=0.1))
    # GELU keeps about half the variance: mm.2 makes it up, so image embeddings have std ~1 like token rows
    w.add_tensor("mm.2.weight", draw(rng, n_embd, merged, scale=2.0 / math.sqrt(merged)))
    w.add_tensor("mm.2.bias", draw(rng, n_embd, scale=0.1))
    finish(w, mmproj)
    return target, mmproj


def write_tiny_gemma3v(folder: Path, *, seed: int = 0, n_embd: int = 64, n_layer: int = 2, n_head: int = 4,
                       n_head_kv: int = 2, n_ff: int = 128, n_ctx: int = 1024, window: int = 32,
                       image_size: int = 32, patch_size: int = 4, pool: int = 2, v_embd: int = 32, v_layer: int = 1,
                       v_head: int = 2, v_ff: int = 64) -> tuple[Path, Path]:
    """Write ``folder/tiny-gemma3v.gguf`` and ``folder/mmproj-tiny-gemma3v.gguf``; return (target, mmproj).

    The target: Gemma 3 blocks (q/k RMS norms, post-attention and post-FFN norms, GeGLU), sliding-window
    attention of ``window`` tokens in even blocks and global attention in odd ones
    (``attention.sliding_window_pattern`` 2), the output head tied to the token embedding. Token embeddings are
    scaled by ``sqrt(n_embd)`` in the graph, image embeddings are not. As in ``tinyarch.write_tiny_gemma2``, the
    final norm has zero mean and the post norms gain 4, so greedy output does not repeat its input token.

    The projector: a SigLIP encoder (biased ``patch_size`` stride convolution, learned position embeddings, GELU
    blocks, ``v.post_ln``), then ``pool`` x ``pool`` average pooling (``clip.vision.projector.scale_factor``;
    clip.cpp's default 4 is Gemma 3's 896 px / 14 px -> 64 -> 16 x 16 tokens), RMS norm times
    ``mm.soft_emb_norm.weight``, and ``mm.input_projection.weight`` (stored ``[v_embd, n_embd]`` in numpy order,
    not transposed) to ``n_embd``. Every image is resized to ``image_size`` squared, so it becomes
    ``(image_size // patch_size // pool) ** 2`` embeddings; the patch grid must be divisible by ``pool``.

    Args:
        folder: where to write both files.
        seed: weights seed (same seed, same bytes).
        n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx: the text model's shape.
        window: sliding window of the even blocks, in tokens.
        image_size, patch_size, pool: the image side, the patch side and the pooling kernel.
        v_embd, v_layer, v_head, v_ff: the encoder's shape.
    """
    grid = image_size // patch_size
    if image_size % patch_size or grid % pool or v_embd % v_head or v_ff == v_embd:
        raise ValueError("image_size must be a multiple of patch_size, the grid of pool; v_ff unlike v_embd")
    head_dim = n_embd // n_head
    rng = np.random.default_rng(seed)
    target = Path(folder) / "tiny-gemma3v.gguf"
    mmproj = Path(folder) / f"mmproj-{target.stem}.gguf"

    w, n_vocab = _text_writer(target, "gemma3", GEMMA3_TOKENS, n_ctx=n_ctx, n_embd=n_embd, n_layer=n_layer,
                              n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, rms_eps=1e-6)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(1000000.0)
    w.add_rope_freq_base_swa(10000.0)
    w.add_sliding_window(window)
    w.add_uint32("gemma3.attention.sliding_window_pattern", 2)  # every 2nd block global (Gemma 3 has 6)
    s = 1.0 / math.sqrt(n_embd)
    w.add_tensor("token_embd.weight", draw(rng, n_vocab, n_embd, scale=0.25))
    post = ones(n_embd, 4.0)
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", ones(n_embd))
        w.add_tensor(f"blk.{i}.attn_q.weight", draw(rng, n_head * head_dim, n_embd, scale=s))
        w.add_tensor(f"blk.{i}.attn_k.weight", draw(rng, n_head_kv * head_dim, n_embd, scale=s))
        w.add_tensor(f"blk.{i}.attn_v.weight", draw(rng, n_head_kv * head_dim, n_embd, scale=s))
        w.add_tensor(f"blk.{i}.attn_output.weight", draw(rng, n_embd, n_head * head_dim, scale=s))
        w.add_tensor(f"blk.{i}.attn_q_norm.weight", ones(head_dim))
        w.add_tensor(f"blk.{i}.attn_k_norm.weight", ones(head_dim))
        w.add_tensor(f"blk.{i}.post_attention_norm.weight", post)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", ones(n_embd))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", draw(rng, n_ff, n_embd, scale=s))
        w.add_tensor(f"blk.{i}.ffn_up.weight", draw(rng, n_ff, n_embd, scale=s))
        w.add_tensor(f"blk.{i}.ffn_down.weight", draw(rng, n_embd, n_ff, scale=1.0 / math.sqrt(n_ff)))
        w.add_tensor(f"blk.{i}.post_ffw_norm.weight", post)
    w.add_tensor("output_norm.weight", draw(rng, n_embd, scale=1.0))
    finish(w, target)

    w = clip_writer(mmproj, "gemma3", image_size=image_size, patch_size=patch_size, n_embd=v_embd, n_ff=v_ff,
                     n_layer=v_layer, n_head=v_head, n_embd_target=n_embd, eps=1e-6, mean=SIGLIP_MEAN,
                     std=SIGLIP_STD, use_gelu=True)
    w.add_uint32("clip.vision.projector.scale_factor", pool)
    w.add_tensor("v.patch_embd.weight", draw(rng, v_embd, 3, patch_size, patch_size,
                                              scale=1.0 / math.sqrt(3 * patch_size**2)))
    w.add_tensor("v.patch_embd.bias", draw(rng, v_embd, scale=0.1))
    w.add_tensor("v.position_embd.weight", draw(rng, grid * grid, v_embd, scale=0.5))
    vit_blocks(w, rng, v_layer, v_embd, v_ff)
    w.add_tensor("mm.soft_emb_norm.weight", ones(v_embd))  # the multiplier itself (HF's 1 + w, converted)
    # image rows of std ~2, like the sqrt(n_embd)-scaled token rows (0.25 * 8)
    w.add_tensor("mm.input_projection.weight", draw(rng, v_embd, n_embd, scale=2.0 / math.sqrt(v_embd)))
    finish(w, mmproj)
    return target, mmproj


def _image_chunks(handler: Any, prompt: str, image: bytes) -> list[tuple[int, int, bool]]:
    """(n_tokens, n_pos, use_non_causal) of each image chunk libmtmd makes of ``prompt`` with ``image``."""
    import ctypes

    mtmd = handler._mtmd_cpp
    ctx = handler.mtmd_ctx
    bitmap = handler._create_bitmap_from_bytes(image)
    chunks = mtmd.mtmd_input_chunks_init()
    text = prompt.encode()
    inp = mtmd.mtmd_input_text(text=text, text_len=len(text), add_special=False, parse_special=True)
    try:
        bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
        assert mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(inp), bitmaps, 1) == 0, "mtmd_tokenize failed"
        out = []
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                out.append((mtmd.mtmd_input_chunk_get_n_tokens(chunk), mtmd.mtmd_input_chunk_get_n_pos(chunk),
                            bool(mtmd.mtmd_decode_use_non_causal(ctx, chunk))))
        return out
    finally:
        mtmd.mtmd_input_chunks_free(chunks)
        mtmd.mtmd_bitmap_free(bitmap)


def _self_check(folder: Optional[Path] = None) -> None:
    """Write both pairs, run images through llama-cpp-python's MTMDChatHandler, and print what happened."""
    import base64
    import tempfile
    import time

    import llama_cpp
    import llama_cpp.mtmd_cpp as mtmd
    from llama_cpp.llama_chat_format import MTMDChatHandler
    from tinyvision import png_bytes

    def quiet(level: int, text: bytes, data: object) -> None:
        pass

    callback = llama_cpp.llama_log_callback(quiet)  # kept alive while llama.cpp may call it
    llama_cpp.llama_log_set(callback, None)
    mtmd.mtmd_log_set(callback, None)
    mtmd.mtmd_helper_log_set(callback, None)
    folder = folder or Path(tempfile.mkdtemp(prefix="tinyvision-families-"))
    images = {"40x30 seed 3": png_bytes(40, 30, seed=3), "40x30 seed 4": png_bytes(40, 30, seed=4),
              "64x64 seed 5": png_bytes(64, 64, seed=5), "100x20 seed 6": png_bytes(100, 20, seed=6)}

    def ask(image: bytes) -> list[Any]:
        url = "data:image/png;base64," + base64.b64encode(image).decode()
        return [{"role": "user", "content": [{"type": "text", "text": "Describe:"},
                                             {"type": "image_url", "image_url": {"url": url}},
                                             {"type": "text", "text": "now."}]}]

    def chat(llm: Any, image: bytes) -> str:
        r = llm.create_chat_completion(messages=ask(image), max_tokens=16, temperature=0, repeat_penalty=1.0)
        return str(r["choices"][0]["message"]["content"] or "")

    marker = mtmd.mtmd_default_marker().decode()
    for name, write in (("qwen2vl", write_tiny_qwen2vl), ("gemma3v", write_tiny_gemma3v)):
        target, mmproj = write(folder)
        (folder / "again").mkdir(exist_ok=True)
        again = write(folder / "again")  # same seed, same bytes
        same = target.read_bytes() == again[0].read_bytes() and mmproj.read_bytes() == again[1].read_bytes()
        print(f"== {name}: {target.name} {target.stat().st_size} B, {mmproj.name} {mmproj.stat().st_size} B, "
              f"deterministic files {same}")
        texts: dict[str, str] = {}
        for instance in range(2):  # a fresh Llama and handler give the same text again
            handler = MTMDChatHandler(str(mmproj), verbose=False)
            llm = llama_cpp.Llama(str(target), chat_handler=handler, n_ctx=1024, verbose=False)
            try:
                for label, image in images.items() if instance == 0 else list(images.items())[:1]:
                    t0 = time.perf_counter()
                    runs = [chat(llm, image), chat(llm, image)]
                    ms = (time.perf_counter() - t0) * 500
                    assert runs[0] == runs[1], runs
                    if instance:
                        print(f"  {label:13}: fresh Llama, same text {runs[0] == texts[label]}")
                        assert runs[0] == texts[label]
                        continue
                    texts[label] = runs[0]
                    chunks = _image_chunks(handler, f"<|im_start|>user\nDescribe:{marker}now.<|im_end|>\n", image)
                    mrope = bool(mtmd.mtmd_decode_use_mrope(handler.mtmd_ctx))
                    print(f"  {label:13}: image chunks (n_tokens, n_pos, non_causal) {chunks}; use_mrope {mrope}; "
                          f"twice same {runs[0] == runs[1]}; {ms:.0f} ms/call; {runs[0]!r}")
                    assert len(chunks) == 1 and mrope == (name == "qwen2vl") and chunks[0][2] == (name == "gemma3v")
                    assert chunks[0][1] < chunks[0][0] if mrope else chunks[0][1] == chunks[0][0]
            finally:
                llm.close()
        first, second = texts["40x30 seed 3"], texts["40x30 seed 4"]
        print(f"  two images give different text: {first != second}; distinct texts {len(set(texts.values()))}")
        assert first != second

if __name__ == "__main__":
    _self_check()
