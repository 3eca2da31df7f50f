"""What this machine generated before, as a drafter: a per-model history store and its index.

After each generation the prompt's new part and the generated tokens are
appended to a store kept for that target model (keyed by the model file's
content, so two different models never share one). ``HistoryDrafter`` then
finds the longest suffix of the current context that occurred in the store
and proposes the most frequent continuation, token by token, while a
majority of the matched occurrences agree.

Three modules, one job each: ``store`` (the file: format, lock, CRC,
compaction, set-aside copies), ``index`` (the in-memory suffix index) and
``drafter`` (proposals from the index). The package itself holds the store
and the index, below the drafters; ``localspec.drafting.history.drafter`` sits with
the other drafters and is imported from there.

Layer: drafting (the store needs only ``errors`` and ``paths``).
"""

from __future__ import annotations

from .index import HistoryIndex
from .store import (
    PROMPT_KEEP,
    HistoryCounts,
    HistoryStore,
    Record,
    clear_stores,
    history_dir,
    list_stores,
    model_id,
    set_aside_copies,
)

__all__ = ["PROMPT_KEEP", "HistoryCounts", "HistoryIndex", "HistoryStore", "Record", "clear_stores", "history_dir",
           "list_stores", "model_id", "set_aside_copies"]
