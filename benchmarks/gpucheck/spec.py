"""The shape spec: the real pair's metadata and tensor shapes, written once from the real files, read by every run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _field_value(field: Any) -> Any:
    import numpy as np

    value = field.contents()
    return value.item() if isinstance(value, np.generic) else value


def _dims(meta: dict[str, list[Any]], arch: str, n_vocab: int) -> dict[str, int]:
    """The few numbers every tensor shape is made of."""
    embd, heads = meta[f"{arch}.embedding_length"][1], meta[f"{arch}.attention.head_count"][1]
    kv_heads = meta[f"{arch}.attention.head_count_kv"][1]
    return {"n_layer": meta[f"{arch}.block_count"][1], "n_embd": embd, "n_ff": meta[f"{arch}.feed_forward_length"][1],
            "n_head": heads, "n_head_kv": kv_heads, "head_dim": embd // heads, "n_vocab": n_vocab,
            "n_embd_kv": kv_heads * (embd // heads)}


def _symbolic(shape: list[int], dims: dict[str, int]) -> list[str]:
    """A tensor shape (ggml order) in dimension names, so it can be scaled."""
    names = {dims[k]: k for k in ("n_embd", "n_ff", "n_vocab", "n_embd_kv")}
    if len(names) < 4:
        raise ValueError(f"two dimensions share a size in {dims}; tensor shapes would be ambiguous")
    return [names[n] for n in shape]


def _tokenizer_spec(fields: dict[str, Any]) -> dict[str, Any]:
    """The tokenizer's layout without its texts: sizes, the special tokens (after the ordinary ones), the
    BOS/EOS/padding tokens by text, the chat template."""
    toks, types = fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"]
    type_of = [int(types.parts[i][0]) for i in types.data]
    n_normal = type_of.index(3) if 3 in type_of else len(type_of)
    special = [[bytes(toks.parts[toks.data[i]]).decode(), type_of[i]] for i in range(n_normal, len(type_of))
               if type_of[i] != 5]  # 5: unused padding, regenerated as [PADn]
    ids = {k: _field_value(fields[f"tokenizer.ggml.{k}_token_id"]) for k in ("bos", "eos", "padding")}
    return {"model": _field_value(fields["tokenizer.ggml.model"]), "pre": _field_value(fields["tokenizer.ggml.pre"]),
            "n_tokens": len(type_of), "n_normal": n_normal, "special": special,
            "ids": {k: bytes(toks.parts[toks.data[v]]).decode() for k, v in ids.items()},
            "add_bos": bool(_field_value(fields["tokenizer.ggml.add_bos_token"])),
            "chat_template": _field_value(fields["tokenizer.chat_template"]),
            "n_merges_real": len(fields["tokenizer.ggml.merges"].data)}


def read_spec(path: Path) -> dict[str, Any]:
    """A model file's metadata (minus the vocabulary texts), tokenizer layout and symbolic tensor shapes."""
    import gguf

    r = gguf.GGUFReader(str(path))
    arch = _field_value(r.fields["general.architecture"])
    meta: dict[str, list[Any]] = {}
    for key, field in r.fields.items():
        if key.startswith(("GGUF.", "tokenizer.")) or key in ("general.architecture", "general.file_type",
                                                                "general.quantization_version"):
            continue
        meta[key] = [field.types[0].name, _field_value(field)]
    tokenizer = _tokenizer_spec(r.fields)
    dims = _dims(meta, arch, tokenizer["n_tokens"])
    blocks: dict[str, list[str]] = {}
    tensors: list[list[Any]] = []
    for t in r.tensors:
        shape = _symbolic([int(n) for n in t.shape], dims)
        if t.name.startswith("blk."):
            _, i, rest = t.name.split(".", 2)
            if blocks.setdefault(rest, shape) != shape:
                raise ValueError(f"{path}: block tensor {rest} changes shape at block {i}")
        else:
            tensors.append([t.name, shape])
    real_types: dict[str, int] = {}
    for t in r.tensors:
        real_types[t.tensor_type.name] = real_types.get(t.tensor_type.name, 0) + 1
    return {"file": path.name, "bytes": path.stat().st_size, "architecture": arch, "metadata": meta,
            "dims": dims, "tokenizer": tokenizer, "tensors": tensors, "block_tensors": sorted(blocks.items()),
            "real_tensor_types": real_types, "ftype": "Q4_K_M"}


def write_spec(target: Path, draft: Path, out: Path) -> dict[str, Any]:
    """Write the shape spec of the real pair to ``out`` (a few KB: no vocabulary texts)."""
    spec = {"about": "Metadata and tensor shapes (ggml order, in dimension names) of the real Qwen2.5-Coder pair, "
                     "read by benchmarks/gpu_check.py --write-spec; the GPU check writes random-weight models "
                     "of these shapes.",
            "models": {"target": read_spec(target), "draft": read_spec(draft)}}
    out.write_text(json.dumps(spec, indent=1, ensure_ascii=False) + "\n")
    return spec
