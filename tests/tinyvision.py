"""Write a tiny random-weight vision projector (mmproj) GGUF and tiny PNG images for fast multimodal tests.

``write_tiny_mmproj`` writes a CLIP-style ViT encoder with the LLaVA "mlp" projector (two linear layers with
GELU between them, ``mm.0`` / ``mm.2``) whose output width matches the tiny llama target of
``tinymodel.write_tiny_model`` (``n_embd`` 64). llama.cpp's libmtmd (``llama_cpp.mtmd_cpp``) loads it next to
that target; any image is resized to ``image_size`` squared (a non-square one is padded first), so every image
becomes ``(image_size // patch_size) ** 2`` embeddings (16 with the defaults), one text position each.

``png_bytes`` / ``write_png`` make random RGB PNGs with the standard library alone.

Run ``python tests/tinyvision.py`` to write both, encode two images, run them through the target and generate.

``tinyvision_families`` writes (target, projector) pairs of families that decode images differently: Qwen2-VL
(M-RoPE, fewer positions than embeddings) and Gemma 3 (non-causal attention over the image).
"""

from __future__ import annotations

import math
import struct
import zlib
from pathlib import Path
from typing import Any, Optional

import gguf
import numpy as np
from tinyarch import _finish as finish

#: CLIP's normalisation constants, as LLaVA's image processor uses them.
IMAGE_MEAN = [0.48145466, 0.4578275, 0.40821073]
IMAGE_STD = [0.26862954, 0.26130258, 0.27577711]

#: ctypes log callbacks handed to llama.cpp / libmtmd, which may call them until the process ends
_CALLBACKS: list[object] = []


def write_tiny_mmproj(
    path: Path,
    *,
    n_embd_target: int = 64,
    seed: int = 0,
    image_size: int = 32,
    patch_size: int = 8,
    n_embd: int = 32,
    n_layer: int = 1,
    n_head: int = 2,
    n_ff: int = 64,
) -> Path:
    """Write a tiny LLaVA-style mmproj GGUF (CLIP ViT + "mlp" projector) and return its path.

    The encoder: patch embedding (a ``patch_size`` stride convolution, with bias), a class token, learned
    position embeddings, pre-layer-norm, ``n_layer`` pre-norm transformer blocks (biased q/k/v/out, GELU-quick
    feed-forward), post-layer-norm. The projector: ``mm.0`` (n_embd -> n_embd_target), GELU, ``mm.2``
    (n_embd_target -> n_embd_target). The class token's output is dropped, as LLaVA does.

    llama.cpp's LLaVA graph runs the first ``block_count - 1`` blocks unless ``clip.vision.feature_layer``
    names the hidden state to project; this file names the last one (``n_layer``), so every block runs.

    Args:
        path: where to write.
        n_embd_target: width of the text model the embeddings feed (``llama_model_n_embd_inp``).
        seed: weights seed (same seed, same bytes).
        image_size: side of the square image the encoder sees; a multiple of ``patch_size``.
        patch_size: side of a patch; each patch is one image token.
        n_embd: encoder width; a multiple of ``n_head``.
        n_layer: encoder blocks.
        n_head: attention heads.
        n_ff: feed-forward width; keep it unlike ``n_embd`` (clip.cpp swaps up/down weights of "mlp"
            projector files whose ``ffn_down`` input width equals ``n_embd``, a fix for old conversions).
    """
    if image_size % patch_size or n_embd % n_head:
        raise ValueError("image_size must be a multiple of patch_size and n_embd of n_head")
    n_patches = (image_size // patch_size) ** 2
    n_pos = n_patches + 1  # the class token comes after the patches (ggml_concat in the LLaVA graph)
    rng = np.random.default_rng(seed)
    w = clip_writer(path, "mlp", image_size=image_size, patch_size=patch_size, n_embd=n_embd, n_ff=n_ff,
                    n_layer=n_layer, n_head=n_head, n_embd_target=n_embd_target, eps=1e-5, mean=IMAGE_MEAN,
                    std=IMAGE_STD, use_gelu=False)  # False: the blocks' FFN uses GELU-quick, as CLIP does
    w.add_bool("clip.has_llava_projector", True)  # legacy key; clip.cpp reads projector_type
    w.add_array("clip.vision.feature_layer", [n_layer])  # int32 array: project the last block's output

    s = 1.0 / math.sqrt(n_embd)
    # ggml ne [patch, patch, 3, n_embd]: PyTorch's Conv2d layout; inputs are normalised pixels (about +-2)
    patch_scale = 1.0 / math.sqrt(3 * patch_size**2)
    w.add_tensor("v.patch_embd.weight", draw(rng, n_embd, 3, patch_size, patch_size, scale=patch_scale))
    w.add_tensor("v.patch_embd.bias", draw(rng, n_embd, scale=0.1))
    w.add_tensor("v.class_embd", draw(rng, n_embd, scale=1.0))
    w.add_tensor("v.position_embd.weight", draw(rng, n_pos, n_embd, scale=0.5))
    w.add_tensor("v.pre_ln.weight", ones(n_embd))
    w.add_tensor("v.pre_ln.bias", zeros(n_embd))
    vit_blocks(w, rng, n_layer, n_embd, n_ff)  # ending in v.post_ln: the projector's input is layer-normed
    # GELU keeps about half the variance: mm.2 makes it up, so image embeddings have std ~1 like token rows
    w.add_tensor("mm.0.weight", draw(rng, n_embd_target, n_embd, scale=s))
    w.add_tensor("mm.0.bias", draw(rng, n_embd_target, scale=0.1))
    w.add_tensor("mm.2.weight", draw(rng, n_embd_target, n_embd_target, scale=2.0 / math.sqrt(n_embd_target)))
    w.add_tensor("mm.2.bias", draw(rng, n_embd_target, scale=0.1))
    finish(w, path)
    return Path(path)


def draw(rng: np.random.Generator, *shape: int, scale: float, mean: float = 0.0) -> np.ndarray:
    """N(mean, scale) F32 values of numpy ``shape`` (GGUF/ggml order reversed)."""
    return (mean + rng.standard_normal(shape) * scale).astype(np.float32)


def ones(n: int, value: float = 1.0) -> np.ndarray:
    return np.full(n, value, dtype=np.float32)


def zeros(n: int) -> np.ndarray:
    return np.zeros(n, dtype=np.float32)


def clip_writer(path: Path, projector: str, *, image_size: int, patch_size: int, n_embd: int, n_ff: int,
                n_layer: int, n_head: int, n_embd_target: int, eps: float, mean: list[float], std: list[float],
                use_gelu: bool) -> gguf.GGUFWriter:
    """An mmproj writer (``general.architecture`` "clip", as mmproj files have) with the keys clip.cpp requires
    of every vision projector. clip.cpp reads them with gguf_get_val_u32 / _f32, which assert the stored type:
    uint32 and float32 only."""
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_name(f"tiny-{projector}")
    w.add_description(f"{projector} image encoder (random weights, for tests)")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_string("clip.projector_type", projector)
    w.add_uint32("clip.vision.image_size", image_size)
    w.add_uint32("clip.vision.patch_size", patch_size)
    w.add_uint32("clip.vision.embedding_length", n_embd)
    w.add_uint32("clip.vision.feed_forward_length", n_ff)
    w.add_uint32("clip.vision.block_count", n_layer)
    w.add_uint32("clip.vision.attention.head_count", n_head)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", eps)
    w.add_uint32("clip.vision.projection_dim", n_embd_target)  # required, though some graphs ignore it
    w.add_array("clip.vision.image_mean", mean)  # float32 arrays of at least 3 values, required
    w.add_array("clip.vision.image_std", std)
    w.add_bool("clip.use_gelu", use_gelu)  # False: the blocks' FFN uses GELU-quick
    return w


def vit_blocks(w: gguf.GGUFWriter, rng: np.random.Generator, n_layer: int, n_embd: int, n_ff: int) -> None:
    """Pre-norm ViT blocks: LayerNorm (weight, bias), biased q/k/v/out, biased up/down feed-forward; then
    ``v.post_ln``. Keep ``n_ff`` unlike ``n_embd``: clip.cpp swaps up/down of files whose ``ffn_down`` input
    width equals ``n_embd`` (a fix for old conversions)."""
    s = 1.0 / math.sqrt(n_embd)
    for i in range(n_layer):
        b = f"v.blk.{i}"
        w.add_tensor(f"{b}.ln1.weight", ones(n_embd))
        w.add_tensor(f"{b}.ln1.bias", zeros(n_embd))
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            w.add_tensor(f"{b}.{name}.weight", draw(rng, n_embd, n_embd, scale=s))
            w.add_tensor(f"{b}.{name}.bias", draw(rng, n_embd, scale=0.02))
        w.add_tensor(f"{b}.ln2.weight", ones(n_embd))
        w.add_tensor(f"{b}.ln2.bias", zeros(n_embd))
        w.add_tensor(f"{b}.ffn_up.weight", draw(rng, n_ff, n_embd, scale=s))
        w.add_tensor(f"{b}.ffn_up.bias", draw(rng, n_ff, scale=0.02))
        w.add_tensor(f"{b}.ffn_down.weight", draw(rng, n_embd, n_ff, scale=1.0 / math.sqrt(n_ff)))
        w.add_tensor(f"{b}.ffn_down.bias", draw(rng, n_embd, scale=0.02))
    w.add_tensor("v.post_ln.weight", ones(n_embd))
    w.add_tensor("v.post_ln.bias", zeros(n_embd))


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    """One PNG chunk: length, type, data, CRC-32 of type and data."""
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_bytes(width: int, height: int, *, seed: int = 0) -> bytes:
    """A valid 8-bit RGB PNG of ``width`` x ``height`` random pixels (same seed, same bytes)."""
    if width < 1 or height < 1:
        raise ValueError("a PNG needs at least one pixel")
    pixels = np.random.default_rng(seed).integers(0, 256, size=(height, width * 3), dtype=np.uint8)
    # each scanline starts with its filter type: 0, none
    raw = b"".join(b"\x00" + row.tobytes() for row in pixels)
    # width, height, bit depth 8, colour type 2 (RGB), compression 0, filter 0, no interlace
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header) + _png_chunk(b"IDAT", zlib.compress(raw, 9))
            + _png_chunk(b"IEND", b""))


def write_png(path: Path, width: int, height: int, *, seed: int = 0) -> bytes:
    """Write ``png_bytes(width, height, seed=seed)`` to ``path`` and return the bytes."""
    data = png_bytes(width, height, seed=seed)
    Path(path).write_bytes(data)
    return data


def _run_image(mtmd: Any, mctx: Any, llm: Any, image: bytes, prompt: str, n_gen: int) -> dict[str, Any]:
    """Tokenize ``prompt`` (holding one media marker) with ``image``, encode the image chunk, evaluate all
    chunks into ``llm``'s context from position 0 and generate ``n_gen`` tokens greedily.

    Returns the image chunk's ``n_tokens`` / ``n_pos``, its embeddings, the first next-token logits, the
    generated tokens and the prompt's total positions."""
    import ctypes

    import llama_cpp

    buf = (ctypes.c_uint8 * len(image)).from_buffer(bytearray(image))
    bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(mctx, buf, len(image), False)
    assert bitmap, "libmtmd could not decode the PNG"
    chunks = mtmd.mtmd_input_chunks_init()
    text = prompt.encode()
    inp = mtmd.mtmd_input_text(text=text, text_len=len(text), add_special=False, parse_special=True)
    try:
        bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
        assert mtmd.mtmd_tokenize(mctx, chunks, ctypes.byref(inp), bitmaps, 1) == 0, "mtmd_tokenize failed"
        out: dict[str, Any] = {}
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            if mtmd.mtmd_input_chunk_get_type(chunk) != mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                continue
            n_tok = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
            out["n_tokens"], out["n_pos"] = n_tok, mtmd.mtmd_input_chunk_get_n_pos(chunk)
            out["non_causal"] = mtmd.mtmd_decode_use_non_causal(mctx, chunk)
            assert mtmd.mtmd_encode_chunk(mctx, chunk) == 0, "mtmd_encode_chunk failed"
            n_embd = llama_cpp.llama_model_n_embd_inp(llm.model)
            ptr = mtmd.mtmd_get_output_embd(mctx)
            out["embd"] = np.ctypeslib.as_array(ptr, shape=(n_tok * n_embd,)).reshape(n_tok, n_embd).copy()
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm.ctx), True)
        n_past = llama_cpp.llama_pos(0)
        rc = mtmd.mtmd_helper_eval_chunks(mctx, llm.ctx, chunks, 0, 0, llm.n_batch, True, ctypes.byref(n_past))
        assert rc == 0, f"mtmd_helper_eval_chunks failed: {rc}"
        out["n_past"] = n_past.value
    finally:
        mtmd.mtmd_input_chunks_free(chunks)
        mtmd.mtmd_bitmap_free(bitmap)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(llm.model))
    tokens: list[int] = []
    for step in range(n_gen):
        ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        # libmtmd asks logits of a text chunk's last token only: a prompt ending with the image has none
        assert ptr, "no logits: the prompt must end with text after the media marker"
        logits = np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy()
        if step == 0:
            out["logits"] = logits
        tokens.append(int(np.argmax(logits)))
        one = (llama_cpp.llama_token * 1)(tokens[-1])
        # positions follow on from the memory's last one: n_past, n_past + 1, ...
        assert llama_cpp.llama_decode(llm.ctx, llama_cpp.llama_batch_get_one(one, 1)) == 0, "llama_decode failed"
    out["tokens"] = tokens
    return out


def _self_check(folder: Optional[Path] = None) -> None:
    """Write the target and mmproj, run two images through them, and print what happened."""
    import tempfile

    import llama_cpp
    import llama_cpp.mtmd_cpp as mtmd
    from tinymodel import write_tiny_model

    def quiet(level: int, text: bytes, data: object) -> None:
        pass

    callback = llama_cpp.llama_log_callback(quiet)
    _CALLBACKS.append(callback)
    llama_cpp.llama_log_set(callback, None)
    mtmd.mtmd_log_set(callback, None)
    mtmd.mtmd_helper_log_set(callback, None)
    folder = folder or Path(tempfile.mkdtemp(prefix="tinyvision-"))
    target = write_tiny_model(folder / "target.gguf", seed=0)
    mmproj = write_tiny_mmproj(folder / "mmproj.gguf")
    same = mmproj.read_bytes() == write_tiny_mmproj(folder / "mmproj2.gguf").read_bytes()
    other = mmproj.read_bytes() != write_tiny_mmproj(folder / "mmproj3.gguf", seed=1).read_bytes()
    images = [write_png(folder / f"img{k}.png", 32, 32, seed=k) for k in range(2)]
    print(f"mmproj {mmproj.stat().st_size} bytes; same seed same bytes: {same}; other seed differs: {other}; "
          f"png deterministic: {png_bytes(32, 32, seed=0) == images[0]}")

    llm = llama_cpp.Llama(model_path=str(target), n_ctx=512, verbose=False)
    params = mtmd.mtmd_context_params_default()
    params.use_gpu = False
    params.n_threads = 2
    params.print_timings = False
    mctx = mtmd.mtmd_init_from_file(str(mmproj).encode(), llm.model, params)
    assert mctx, "mtmd_init_from_file failed"
    try:
        marker = mtmd.mtmd_default_marker().decode()
        print(f"vision: {mtmd.mtmd_support_vision(mctx)}; M-RoPE: {mtmd.mtmd_decode_use_mrope(mctx)}; "
              f"marker: {marker!r}")
        prompt = f"<|im_start|>user\n{marker}\nWhat is this?<|im_end|>\n<|im_start|>assistant\n"
        runs = []
        sizes = ["32x32", "32x32", "48x20"]  # the last is padded to a square, then resized
        for k, image in enumerate(images + [png_bytes(48, 20, seed=2)]):
            r = _run_image(mtmd, mctx, llm, image, prompt, n_gen=8)
            embd = r["embd"]
            assert embd.shape == (r["n_tokens"], 64) and np.isfinite(embd).all(), embd.shape
            print(f"image {k} ({sizes[k]}): n_tokens {r['n_tokens']}, n_pos {r['n_pos']}, "
                  f"non-causal {r['non_causal']}, "
                  f"embd {embd.shape} mean {embd.mean():+.3f} std {embd.std():.3f}, prompt positions "
                  f"{r['n_past']}, greedy {r['tokens']} {llm.detokenize(r['tokens']).decode(errors='replace')!r}")
            runs.append(r)
        diff = float(np.abs(runs[0]["logits"] - runs[1]["logits"]).max())
        print(f"max |logit difference| between images 0 and 1: {diff:.4f}; argmax "
              f"{int(np.argmax(runs[0]['logits']))} vs {int(np.argmax(runs[1]['logits']))}")
        assert diff > 1e-3, "the image does not change the logits"
        again = _run_image(mtmd, mctx, llm, images[0], prompt, n_gen=8)
        print(f"image 0 again: same embeddings {np.array_equal(again['embd'], runs[0]['embd'])}, "
              f"same tokens {again['tokens'] == runs[0]['tokens']}")
    finally:
        mtmd.mtmd_free(mctx)  # before the model it points to
        llm.close()


if __name__ == "__main__":
    _self_check()
