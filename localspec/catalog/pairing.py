"""Which model can draft for which: one rule for the models on disk and for the Hub's.

A draft fits a target when their vocabularies are the same (the same
fingerprint) or identical except padding at the end (``vocab_match.compare``),
and the draft is at least ``MIN_RATIO`` times smaller: by parameter count
when both state one (``general.parameter_count``, a size label, or for a Hub
file a size in its name), else by file size. Models without a tokenizer are
never paired.

Drafts for one target are ranked (``rank_key``):

1. same architecture first: the same family's small model agrees with the
   target far more often than a stranger that happens to share its tokenizer;
2. exact vocabulary before one that differs by padding (a padded draft may
   propose ids the target lacks, each a wasted round);
3. same quantization width (4-bit with 4-bit...): closest in how it rounds;
4. a draft whose parameter count is known before one measured by file size only;
5. then the smallest: every candidate is already several times smaller, so
   the cheaper draft step wins.

The scan (``pair_models``), the draft search on disk (``find_draft``) and the
Hub's draft search (``remote.find_drafts``) all use these.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Optional, Protocol, Sequence, Union

from ..runtime.gguf_metadata import vocab_type_name
from ..runtime.vocab_match import compare
from ..sizes import human_bytes
from .stores import FoundModel, first_part, read_model

PathLike = Union[str, "os.PathLike[str]"]
#: How many times smaller than its target a draft must be.
MIN_RATIO = 3.0
_QUANT_BITS = re.compile(r"^(?:I?Q|TQ)(\d)")
_QUANT_TAG = re.compile(r"[-_.](i?q\d\w*|f16|bf16|f32)$", re.IGNORECASE)


class Described(Protocol):
    """What the rule reads of a model: a ``stores.FoundModel`` or a ``remote.RemoteGGUF``."""

    @property
    def name(self) -> str: ...

    @property
    def size(self) -> int: ...

    @property
    def architecture(self) -> Optional[str]: ...

    @property
    def quantization(self) -> Optional[str]: ...

    @property
    def parameters(self) -> Optional[int]: ...


def quant_family(q: Optional[str]) -> Optional[str]:
    """``Q4_K_M``, ``IQ4_XS``, ``Q4_0`` -> ``4-bit``; ``F16``/``BF16`` -> ``16-bit``; None when unknown."""
    if not q:
        return None
    m = _QUANT_BITS.match(q)
    if m:
        return f"{m.group(1)}-bit"
    return {"F16": "16-bit", "BF16": "16-bit", "F32": "32-bit"}.get(q, q)


def smaller_by(target: Described, draft: Described) -> tuple[float, bool]:
    """How many times smaller the draft is, and whether that is by parameter count (else by file size)."""
    if target.parameters and draft.parameters:
        return target.parameters / draft.parameters, True
    return target.size / max(1, draft.size), False


def small_enough(target: Described, draft: Described, min_ratio: float = MIN_RATIO) -> bool:
    """Whether ``draft`` is at least ``min_ratio`` times smaller than ``target``."""
    return smaller_by(target, draft)[0] >= min_ratio


def rank_key(target: Described, draft: Described, padded: bool) -> tuple:
    """Sorts the drafts that fit ``target`` best first (see the module's docstring)."""
    return (draft.architecture != target.architecture, padded,
            quant_family(draft.quantization) != quant_family(target.quantization),
            draft.parameters is None, draft.parameters or 0, draft.size, draft.name)


@dataclass
class FoundPair:
    """A target and a draft on this machine that fits it.

    Attributes:
        target: the model to generate with.
        draft: the model that proposes tokens.
        reason: one line saying why they fit.
        padded: the vocabularies differ only by padding at the end.
    """

    target: FoundModel
    draft: FoundModel
    reason: str
    padded: bool = False


def _ratio(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".") + "x"


def _compat(target: FoundModel, draft: FoundModel) -> tuple[bool, bool]:
    """(can draft, only by padding) for two models with tokenizers."""
    if target.fingerprint == draft.fingerprint:
        return True, False
    c = compare(target.vocab(), draft.vocab())
    return c.ok, c.padded


def _reason(target: FoundModel, draft: FoundModel, padded: bool) -> str:
    v = target.vocab()
    kind = vocab_type_name(v.type)
    if padded:
        vocab = f"same vocabulary except padding ({kind}, {v.n_tokens} and {draft.n_tokens} tokens)"
    else:
        vocab = f"same vocabulary ({kind}, {v.n_tokens} tokens)"
    ratio, by_params = smaller_by(target, draft)
    if by_params:
        size = f"draft {draft.label()} is {_ratio(ratio)} smaller than {target.label()}"
    else:
        size = f"draft file {human_bytes(draft.size)} is {_ratio(ratio)} smaller than {human_bytes(target.size)}"
    if target.architecture != draft.architecture:
        size += f" (architectures {draft.architecture} and {target.architecture})"
    return f"{vocab}; {size}"


def _drafts_for(target: FoundModel, candidates: Iterable[FoundModel], min_ratio: float) -> list[FoundPair]:
    """Every candidate that can draft for ``target``, best first."""
    if target.fingerprint is None:
        return []
    ranked = []
    for d in candidates:
        if d is target or d.fingerprint is None or d.path == target.path or not small_enough(target, d, min_ratio):
            continue
        ok, padded = _compat(target, d)
        if ok:
            ranked.append((rank_key(target, d, padded), FoundPair(target, d, _reason(target, d, padded), padded)))
    ranked.sort(key=lambda kv: kv[0])
    return [pair for _, pair in ranked]


def pair_models(found: Sequence[FoundModel], *, min_ratio: float = MIN_RATIO) -> list[FoundPair]:
    """Pair every model with the drafts on this machine that fit it.

    Returns:
        Pairs grouped by target (largest target first), best draft first within each.
    """
    generating = [m for m in found if m.role is None]  # an embedding model or reranker writes no text
    targets = sorted(generating, key=lambda m: (-(m.parameters or 0), -m.size, m.name))
    pairs: list[FoundPair] = []
    for t in targets:
        pairs.extend(_drafts_for(t, generating, min_ratio))
    return pairs


def find_draft(target: Union[PathLike, FoundModel], found: Sequence[FoundModel], *,
               min_ratio: float = MIN_RATIO) -> Optional[FoundPair]:
    """The best draft on this machine for ``target``, or None.

    Args:
        target: a model from the scan, or any GGUF path (its header is read).
        found: the scan's models.
        min_ratio: how many times smaller a draft must be.

    Raises:
        ModelFileError: ``target`` is a path that is not a readable GGUF language model.
    """
    if not isinstance(target, FoundModel):
        path = first_part(Path(target).expanduser())  # a split model is known by its first part
        target = _same_file(path, found) or read_model(path)
    drafts = _drafts_for(target, found, min_ratio)
    return drafts[0] if drafts else None


def _same_file(path: Path, found: Sequence[FoundModel]) -> Optional[FoundModel]:
    for m in found:
        try:
            if m.path == path or os.path.samefile(m.path, path):
                return m
        except OSError:
            continue
    return None


def pair_name(model: str, taken: Iterable[str] = ()) -> str:
    """A pair name from a model's file or scan name, lower case and without ``.gguf``: without its quantization
    tag too (``qwen2.5-coder-1.5b``) unless another pair has that name (then ``qwen2.5-coder-1.5b-q8_0``), made
    unique against ``taken`` (``same``, ``same-2``...)."""
    def clean(text: str) -> str:
        return re.sub(r"[^\w.-]+", "-", text).strip("-").lower() or "model"

    stem = re.sub(r"\.gguf$", "", model.split("/")[-1], flags=re.IGNORECASE)
    taken = set(taken)
    first = [clean(_QUANT_TAG.sub("", stem)), clean(stem)]
    numbered = (f"{first[-1]}-{i}" for i in range(2, len(taken) + 3))
    return next(name for name in (*dict.fromkeys(first), *numbered) if name not in taken)


@dataclass
class Suggestion:
    """A target's best pair on this machine, and the name it is (or would be) registered under.

    Attributes:
        pair: the target and its best draft.
        name: the registered pair's name, or a free name for ``localspec add``.
        registered: whether that pair is registered already.
    """

    pair: FoundPair
    name: str
    registered: bool


def suggest_pairs(pairs: Sequence[FoundPair], registered: Mapping[tuple[Optional[str], Optional[str]], str],
                  taken: Iterable[str] = ()) -> list[Suggestion]:
    """Each target's best pair among ``pairs`` (``pair_models``' order), named.

    Args:
        pairs: pairs grouped by target, best draft first.
        registered: the names of pairs registered already, by their resolved (target, draft) paths.
        taken: names in use: a new pair gets a name not among them (nor given to another new pair).
    """
    best: dict[int, FoundPair] = {}
    for p in pairs:
        best.setdefault(id(p.target), p)  # the first pair of each target is its best
    used = set(taken)
    out = []
    for p in best.values():
        known = registered.get((str(p.target.path.resolve()), str(p.draft.path.resolve())))
        name = known or pair_name(p.target.name, used)
        used.add(name)
        out.append(Suggestion(p, name, known is not None))
    return out
