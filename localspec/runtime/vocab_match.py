"""Whether a draft model can speculate for a target: the same vocabulary.

Speculative decoding passes token ids from the draft to the target, so both
must give every id the same meaning. Vocabularies may differ only in padding
at the end (the shared ids identical), which is allowed with a warning: the
engine never lets a drafted id the target lacks through.

Only the vocabularies are read (llama.cpp's vocab-only load), so a check
takes well under a second and runs before a draft's weights are loaded.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

from ..errors import VocabMismatchError

VOCAB_TYPES = {0: "none", 1: "SPM", 2: "BPE", 3: "WPM", 4: "UGM", 5: "RWKV", 6: "PLaMo2"}


@dataclass
class VocabInfo:
    """A model's vocabulary: tokenizer type, size, special ids and every token's text."""

    path: Path
    type: int
    bos: int
    eos: int
    texts: list[bytes]

    @property
    def n_tokens(self) -> int:
        return len(self.texts)


@dataclass
class Compatibility:
    """The outcome of comparing two vocabularies."""

    ok: bool
    padded: bool
    message: str


def compare(target: VocabInfo, draft: VocabInfo) -> Compatibility:
    """Compare tokenizer type, every shared token text, and BOS/EOS ids."""
    t_name, d_name = target.path.name, draft.path.name
    if target.type != draft.type:
        return Compatibility(False, False, (
            f"Draft {d_name} uses a {VOCAB_TYPES.get(draft.type, '?')} tokenizer but target {t_name} uses "
            f"{VOCAB_TYPES.get(target.type, '?')}; pick a draft from the same model family."))
    shared = min(target.n_tokens, draft.n_tokens)
    if target.texts[:shared] != draft.texts[:shared]:
        i = next(i for i in range(shared) if target.texts[i] != draft.texts[i])
        return Compatibility(False, False, (
            f"Draft {d_name} and target {t_name} have different vocabularies: token id {i} is "
            f"{draft.texts[i]!r} in the draft but {target.texts[i]!r} in the target; "
            "pick a draft from the same model family."))
    for what, t_id, d_id in (("BOS", target.bos, draft.bos), ("EOS", target.eos, draft.eos)):
        if t_id != d_id:
            return Compatibility(False, False, (
                f"Draft {d_name} has {what} token id {d_id} but target {t_name} has {t_id}; "
                "pick a draft from the same model family."))
    if target.n_tokens != draft.n_tokens:
        return Compatibility(True, True, (
            f"Draft {d_name} has {draft.n_tokens} tokens and target {t_name} has {target.n_tokens}; the first "
            f"{shared} are identical, so the difference is treated as padding."))
    return Compatibility(True, False, (
        f"Vocabularies match: {VOCAB_TYPES.get(target.type, '?')}, {target.n_tokens} tokens, "
        f"BOS {target.bos}, EOS {target.eos}."))


def check_vocab(target: VocabInfo, draft: VocabInfo) -> None:
    """Raise VocabMismatchError unless the draft can speculate for the target; warn on padding."""
    result = compare(target, draft)
    if not result.ok:
        raise VocabMismatchError(result.message)
    if result.padded:
        warnings.warn(result.message, stacklevel=2)
