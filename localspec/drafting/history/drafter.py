"""The history drafter: what followed the longest suffix of the context in earlier generations."""

from __future__ import annotations

import numpy as np

from ...errors import ConfigError
from ...methods import HISTORY, REGISTRY
from ...runtime.model import Model
from ..drafters import EMPTY_DRAFT, Draft, Drafter, DraftingContext
from .index import HistoryIndex


class HistoryDrafter(Drafter):
    """Proposes what followed the longest suffix of the context in earlier generations.

    Args:
        index: the store's index.
        min_match: shortest suffix match that counts.
    """

    name = "history"

    def __init__(self, index: HistoryIndex, min_match: int = 2):
        self.index = index
        self.min_match = min_match
        self.models: tuple[Model, ...] = ()
        #: Length of the suffix match behind the last proposal (0: none).
        self.last_match = 0

    def propose(self, context: np.ndarray, k: int, rng: np.random.Generator) -> Draft:
        """Up to ``k`` tokens, fewer where the earlier continuations stop agreeing."""
        self.last_match = 0
        if k <= 0 or len(context) < self.min_match:
            return EMPTY_DRAFT
        length, ends = self.index.match(context)
        if length < self.min_match:
            return EMPTY_DRAFT
        tokens, _ = self.index.continuation(ends, k)
        if not tokens:
            return EMPTY_DRAFT
        self.last_match = length
        return Draft(tokens, None, "history")


def build_history(ctx: DraftingContext) -> HistoryDrafter:
    """Method "history": what followed the same text in this model's earlier generations."""
    if ctx.history is None:
        raise ConfigError("Method 'history' needs the history store, which is off for this call "
                          "(history=False, --no-history or LOCALSPEC_HISTORY=off).")
    return HistoryDrafter(ctx.history)


REGISTRY.attach(HISTORY.name, build=build_history)
