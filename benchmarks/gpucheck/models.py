"""Random-weight models shaped like the real pair: F16 written with gguf, quantized by llama.cpp."""

from __future__ import annotations

import ctypes
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from .settings import QK_K


def scaled_dims(dims: dict[str, int], tok: dict[str, Any], scale: float) -> dict[str, int]:
    """The real dimensions, or (scale < 1) fewer layers and narrower, still K-quant-friendly widths.

    The head width stays the real one; the model width stays a multiple of QK_K
    and of a whole number of KV-head groups, so every matrix row quantizes to
    the K-quant types the real width gets.
    """
    if scale == 1:
        return dict(dims)
    hd, kv = dims["head_dim"], dims["n_head_kv"]
    step = math.lcm(QK_K, hd * kv)
    embd = max(step, round(dims["n_embd"] * scale / step) * step)
    heads = embd // hd
    n_fixed = 256 + len(tok["special"]) + 1  # the byte tokens, the specials and one more
    n_vocab = max(n_fixed, round(dims["n_vocab"] * scale))
    return {"n_layer": max(1, round(dims["n_layer"] * scale)), "n_embd": embd,
            "n_ff": max(QK_K, round(dims["n_ff"] * scale / QK_K) * QK_K), "n_head": heads, "n_head_kv": kv,
            "head_dim": hd, "n_vocab": n_vocab, "n_embd_kv": kv * hd}


def vocabulary(tok: dict[str, Any], n_vocab: int) -> tuple[list[str], list[int]]:
    """A synthetic vocabulary of ``n_vocab`` tokens laid out like the real one.

    Ordinary tokens first (the 256 GPT-2 byte tokens, then fillers), then the
    real special tokens in their real order, then unused padding: at full
    scale every special token has its real id.
    """
    from gguf.vocab import bytes_to_unicode

    n_pad_real = tok["n_tokens"] - tok["n_normal"] - len(tok["special"])
    n_pad = round(n_pad_real * n_vocab / tok["n_tokens"])
    n_normal = n_vocab - len(tok["special"]) - n_pad
    table = bytes_to_unicode()  # GPT-2's printable stand-ins for the 256 byte values
    texts = [table[b] for b in range(256)] + [f"[TOK{i}]" for i in range(256, n_normal)]
    types = [1] * n_normal
    for text, kind in tok["special"]:
        texts.append(text)
        types.append(kind)
    texts += [f"[PAD{i}]" for i in range(len(texts), n_vocab)]
    types += [5] * (n_vocab - len(types))
    return texts, types


def _add_metadata(w: Any, model: dict[str, Any], dims: dict[str, int], texts: list[str], types: list[int]) -> None:
    import gguf

    arch = model["architecture"]
    sized = {f"{arch}.block_count": "n_layer", f"{arch}.embedding_length": "n_embd",
             f"{arch}.feed_forward_length": "n_ff", f"{arch}.attention.head_count": "n_head",
             f"{arch}.attention.head_count_kv": "n_head_kv"}
    for key, (kind, value) in model["metadata"].items():
        w.add_key_value(key, dims[sized[key]] if key in sized else value, gguf.GGUFValueType[kind])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    tok = model["tokenizer"]
    w.add_tokenizer_model(tok["model"])
    w.add_tokenizer_pre(tok["pre"])
    w.add_token_list(texts)
    w.add_token_types(types)
    w.add_token_merges(["Ġ t", "h e"])  # llama.cpp needs merges for BPE; the texts are not measured
    for kind, text in tok["ids"].items():
        w.add_key_value(f"tokenizer.ggml.{kind}_token_id", texts.index(text), gguf.GGUFValueType.UINT32)
    w.add_add_bos_token(tok["add_bos"])
    w.add_chat_template(tok["chat_template"])


def tensor_list(model: dict[str, Any], dims: dict[str, int]) -> list[tuple[str, list[int]]]:
    """Every tensor's name and shape (ggml order) at these dimensions, in the real file's order of kinds."""
    out = [(name, [dims[d] for d in shape]) for name, shape in model["tensors"]]
    for i in range(dims["n_layer"]):
        out += [(f"blk.{i}.{rest}", [dims[d] for d in shape]) for rest, shape in model["block_tensors"]]
    return out


def write_f16(model: dict[str, Any], dims: dict[str, int], path: Path, seed: int) -> int:
    """Write a random-weight F16 GGUF (1-D tensors F32, as converted models have); returns its size.

    Weights are slices of one random pool, scaled by 1/sqrt(fan-in) so
    activations stay finite; norms are ones and biases zeros. Tensors are
    streamed, so a 3 GB file never sits in memory whole.
    """
    import gguf
    import numpy as np

    texts, types = vocabulary(model["tokenizer"], dims["n_vocab"])
    tensors = tensor_list(model, dims)
    w = gguf.GGUFWriter(str(path), model["architecture"])
    _add_metadata(w, model, dims, texts, types)
    for name, shape in tensors:
        dtype = np.float16 if len(shape) == 2 else np.float32
        w.add_tensor_info(name, shape[::-1], np.dtype(dtype), math.prod(shape) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    pool = rng.standard_normal(1 << 22).astype(np.float16)
    for name, shape in tensors:
        if len(shape) == 1:
            w.write_tensor_data(np.full(shape, 1.0 if "norm" in name else 0.0, dtype=np.float32))
            continue
        start = int(rng.integers(len(pool)))
        data = np.resize(np.roll(pool, -start), math.prod(shape)).reshape(shape[::-1])
        w.write_tensor_data(data * np.float16(1 / math.sqrt(shape[0])))
    w.close()
    return path.stat().st_size


def quantize(src: Path, dst: Path, ftype: str) -> None:
    """Quantize with llama.cpp's own quantize (its default per-tensor choices for ``ftype``)."""
    import llama_cpp as ll

    from localspec.runtime.process import LlamaLog

    params = ll.llama_model_quantize_default_params()
    params.ftype = getattr(ll, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = os.cpu_count() or 1
    log = LlamaLog()
    with log:
        rc = ll.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize failed ({rc}) on {src.name}: {log.last_error() or 'no log'}")


def tensor_types(path: Path) -> dict[str, int]:
    """How many tensors of each ggml type a GGUF holds."""
    import gguf

    counts: dict[str, int] = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return counts


def make_models(spec: dict[str, Any], scale: float, work: Path) -> dict[str, Any]:
    """Write and quantize the target and the draft; returns their shapes, sizes and times.

    Models an earlier run left in ``work`` at the same scale are used again (a second run).
    """
    record = work / "models.json"
    if record.is_file():
        done = json.loads(record.read_text())
        if done["scale"] == scale and all(Path(done[r]["path"]).is_file() for r in ("target", "draft")):
            return dict(done, reused=True)
    out: dict[str, Any] = {"scale": scale}
    for seed, role in enumerate(("target", "draft")):
        model = spec["models"][role]
        dims = scaled_dims(model["dims"], model["tokenizer"], scale)
        f16, quant = work / f"{role}-f16.gguf", work / f"{role}.gguf"
        t0 = time.perf_counter()
        f16_bytes = write_f16(model, dims, f16, seed)
        t1 = time.perf_counter()
        quantize(f16, quant, model["ftype"])
        t2 = time.perf_counter()
        f16.unlink()  # 3 GB at full scale; only the quantized file is used
        out[role] = {"dims": dims, "ftype": model["ftype"], "f16_bytes": f16_bytes, "bytes": quant.stat().st_size,
                     "real_bytes": model["bytes"], "tensor_types": tensor_types(quant),
                     "real_tensor_types": model["real_tensor_types"], "write_seconds": round(t1 - t0, 2),
                     "quantize_seconds": round(t2 - t1, 2), "path": str(quant)}
    record.write_text(json.dumps(out))
    return out
