"""Statistical helpers shared by the distribution tests."""

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
