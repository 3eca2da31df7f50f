"""Helpers shared by the tests: sampled token counts and their comparison, and llama-cpp-python's own decoding."""

from __future__ import annotations

import numpy as np
from scipy import stats


def token_counts(pair, prompt, n_runs, position, **options):
    """How often each token id comes out at ``position`` over ``n_runs`` seeded samples at temperature 1."""
    counts: dict[int, int] = {}
    for seed in range(n_runs):
        r = pair.generate(prompt, max_tokens=position + 1, temperature=1.0, seed=seed, **options)
        if len(r.tokens) > position:
            counts[r.tokens[position]] = counts.get(r.tokens[position], 0) + 1
    return counts


def same_distribution(a: dict[int, int], b: dict[int, int]) -> float:
    """Chi-square test of homogeneity; rare tokens are pooled so every expected count is >= 5."""
    keys = sorted(set(a) | set(b), key=lambda t: -(a.get(t, 0) + b.get(t, 0)))
    table = [[a.get(t, 0) for t in keys], [b.get(t, 0) for t in keys]]
    table = np.array(table)
    common = table.sum(axis=0) >= 20
    pooled = np.column_stack([table[:, common], table[:, ~common].sum(axis=1)])
    pooled = pooled[:, pooled.sum(axis=0) > 0]
    return float(stats.chi2_contingency(pooled).pvalue)


def lcp_greedy(path, prompt, n, *, sampling=None, **settings):
    """llama-cpp-python's own greedy decoding of ``path`` (its high-level ``Llama``, built with ``settings``),
    end token excluded; ``sampling`` adds to ``Llama.generate``'s arguments (penalties, logits processors)."""
    import llama_cpp
    from llama_cpp import Llama

    llama = Llama(str(path), n_ctx=1024, flash_attn=False, verbose=False, **settings)
    try:
        out: list[int] = []
        for tok in llama.generate(prompt, **{"temp": 0.0, "top_k": 1, "repeat_penalty": 1.0, "reset": True,
                                             **(sampling or {})}):
            if llama_cpp.llama_vocab_is_eog(llama._model.vocab, tok) or len(out) == n:
                break
            out.append(int(tok))
        return out
    finally:
        llama.close()
