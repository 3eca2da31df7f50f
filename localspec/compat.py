"""Whether a draft model can speculate for a target: same vocabulary.

Speculative decoding passes token ids from the draft to the target, so both
must give every id the same meaning. Vocabularies may differ only in padding
at the end (the shared ids identical), which is allowed with a warning.
"""

from __future__ import annotations

import warnings

from .backend import Model
from .errors import VocabMismatchError

_VOCAB_TYPES = {0: "none", 1: "SPM", 2: "BPE", 3: "WPM", 4: "UGM", 5: "RWKV", 6: "PLaMo2"}


def check_vocab(target: Model, draft: Model) -> None:
    """Raise VocabMismatchError unless ``draft`` shares ``target``'s vocabulary.

    Compares the tokenizer type, every token text of the shared id range, and
    the special BOS/EOS ids. A size difference with identical shared tokens
    (padding) only warns.
    """
    t_name, d_name = target.path.name, draft.path.name
    if target.vocab_type() != draft.vocab_type():
        raise VocabMismatchError(
            f"Draft {d_name} uses a {_VOCAB_TYPES.get(draft.vocab_type(), '?')} tokenizer but target "
            f"{t_name} uses {_VOCAB_TYPES.get(target.vocab_type(), '?')}; pick a draft from the same model family."
        )
    shared = min(target.n_vocab, draft.n_vocab)
    for i in range(shared):
        a, b = target.token_text(i), draft.token_text(i)
        if a != b:
            raise VocabMismatchError(
                f"Draft {d_name} and target {t_name} have different vocabularies: token id {i} is "
                f"{b!r} in the draft but {a!r} in the target; pick a draft from the same model family."
            )
    for what, t_id, d_id in (("BOS", target.bos, draft.bos), ("EOS", target.eos, draft.eos)):
        if t_id != d_id:
            raise VocabMismatchError(
                f"Draft {d_name} has {what} token id {d_id} but target {t_name} has {t_id}; "
                "pick a draft from the same model family."
            )
    if target.n_vocab != draft.n_vocab:
        warnings.warn(
            f"Draft {d_name} has {draft.n_vocab} tokens and target {t_name} has {target.n_vocab}; "
            f"the first {shared} are identical, so the difference is treated as padding.",
            stacklevel=2,
        )
