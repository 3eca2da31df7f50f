"""The prompt cache: saved model states for token prefixes, in RAM and on disk, so a prompt is processed once.

A model's context holds one sequence, so a request from another conversation
(or a new process) would process its whole prompt again. ``PromptCache``
keeps the state each model had after a prefix (llama.cpp's per-sequence
state: the attention cache and any recurrent state) and, before a model
processes a prompt, restores the state of the longest prefix it holds when
that saves more time than the restore costs.

* **Entries** belong to one model (``Model.state_identity``: file, build and
  the settings that shape a state), so the target's, the draft model's and
  any other model's states are found and kept apart; a state saved under
  another identity is never loaded.
* **Lookup** (``localspec.prompt_cache.index``) walks the prompt's blocks
  of ``BLOCK`` tokens through a chain of hashes (each block's hash covers
  every token before it), so finding the longest cached prefix takes time
  linear in the prompt, whatever the number of entries. A plain attention
  cache can use any shared prefix of an entry (the rest is cut off); a
  recurrent state or a sliding window only an entry that is a whole prefix,
  which is why those are also saved at a chat's message boundaries (see
  ``engine.Generation``).
* **Tiers**: RAM under a strict byte budget (states waiting for the disk
  count in it), and a folder on disk under its own
  (``localspec.prompt_cache.disk``), written by a background thread so a
  save costs the caller one copy of the state; both budgets default to a
  share of what is free (``localspec.prompt_cache.budget``). Eviction is
  least recently used, a restore counting as ``HIT_BONUS_SECONDS`` of later
  use, so a shared system prompt outlives one-off side requests.
* **Disk files** (``localspec.prompt_cache.files``) carry a header with a format
  version, the model identity, the tokens and a SHA-256 of the state: a
  truncated, corrupt or wrong-model file is found out before llama.cpp sees
  it, ignored with one notice and deleted. Files are written to a temporary
  name and renamed, so a process killed mid-save leaves nothing that loads,
  and processes sharing the folder only ever see whole files.
* **Faults** (a full disk, a damaged file, no memory) cost the cache's help
  with one notice, never a reply.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Callable, Optional, Union

import numpy as np

from ..runtime import memory
from ..runtime.model import Model
from . import files
from .budget import budget_text, default_disk_budget, default_ram_budget
from .disk import DiskTier
from .entries import CacheStats, Entry, EntryTable
from .files import State
from .index import BLOCK, usable

#: Prompts shorter than this are not worth an entry (a restore costs more than their processing).
MIN_TOKENS = BLOCK

#: A restore counts as recent use for this many seconds more than a save, so a shared prefix outlives
#: one-off side requests without freezing the RAM tier once every entry has been hit.
HIT_BONUS_SECONDS = 600.0

#: A state llama.cpp refuses in a context of several sequences is kept this many times (the others' cells
#: may have left it no room), then dropped as it would be in a context of its own.
MAX_REFUSALS = 3


class PromptCache:
    """Saved model states by token prefix, in RAM and optionally on disk (see the module's docstring).

    Nothing it does raises into a generation: a fault (a full disk, a damaged file, no memory) costs the
    cache's help with one notice, never the reply.

    Args:
        ram_bytes: the RAM tier's budget (0: no RAM tier; None: ``default_ram_budget``). States waiting to be
            written to disk count in it too.
        folder: the disk tier's folder (None: no disk tier).
        disk_bytes: the disk tier's budget (None: ``default_disk_budget``).
        notify: where one-line notices go (a damaged file, a full disk, a budget smaller than an entry).
        weigh: restore a saved prefix only where that is measured to cost less than processing it (False:
            wherever it is longer than the live context's, as on models too small for a restore to pay).
    """

    def __init__(self, ram_bytes: Optional[int] = None, folder: Union[str, os.PathLike, None] = None,
                 disk_bytes: Optional[int] = None, notify: Optional[Callable[[str], None]] = None,
                 weigh: bool = True):
        self.ram_bytes = default_ram_budget() if ram_bytes is None else max(0, int(ram_bytes))
        self.folder = Path(folder) if folder is not None else None
        self.disk_bytes = 0 if self.folder is None else (default_disk_budget(self.folder) if disk_bytes is None
                                                         else max(0, int(disk_bytes)))
        self.weigh = weigh
        self.notify = notify or (lambda _: None)
        self.stats = CacheStats()
        self._entries = EntryTable()
        self._lock = threading.RLock()
        self._said: set[str] = set()
        # seconds per token each model took to process prompts, measured (see ``observe_prefill``)
        self._prefill_rate: dict[str, float] = {}
        self._disk = (DiskTier(self.folder, self.disk_bytes, self._entries, self._lock, self.stats, self._say)
                      if self.folder is not None else None)

    # -- what it holds ----------------------------------------------------------

    @property
    def enabled(self) -> bool:
        return self.ram_bytes > 0 or self.disk_bytes > 0

    def entries(self) -> list[Entry]:
        """Every entry known, RAM and disk, newest use first."""
        with self._lock:
            return sorted(self._entries.all(), key=lambda e: -e.used)

    def ram_used(self) -> int:
        """Bytes of states held in RAM: the RAM tier's and those waiting for the disk writer."""
        with self._lock:
            return sum(e.size for e in self._entries.all() if e.data is not None or e.queued)

    def describe(self) -> str:
        """One line for a person: the budgets and where the disk tier is."""
        ram = f"{budget_text(self.ram_bytes)} of RAM" if self.ram_bytes else "no RAM"
        disk = (f"{budget_text(self.disk_bytes)} on disk in {self.folder}" if self.disk_bytes and self.folder
                else "no disk")
        return f"prompt cache: {ram}, {disk}"

    # -- restoring --------------------------------------------------------------

    def restore(self, model: Model, wanted: np.ndarray) -> int:
        """Give ``model`` the longest prefix of ``wanted`` the cache or its own context holds, when a saved one is
        longer than its own by more than the restore costs. Returns the tokens of ``wanted`` it then holds.

        A state llama.cpp refuses, or a disk file that fails its checks, is dropped (with one notice) and the
        next best tried; the caller then processes whatever is missing.
        """
        live = model.common_prefix(wanted)
        if not self.enabled or len(wanted) < MIN_TOKENS:
            return live
        try:
            return self._restore(model, wanted, live)
        except Exception as exc:  # the cache must never cost a reply
            self._say(f"restore:{type(exc).__name__}", f"localspec: the prompt cache could not restore a state "
                                                       f"({exc}); the prompt is processed instead.")
            return model.common_prefix(wanted)

    def holds(self, model: Model) -> bool:
        """Whether a state in RAM gives ``model`` back everything its context holds now, so that emptying the
        context loses nothing a restore (a copy) does not bring back."""
        tokens = model.tokens
        if not self.enabled or len(tokens) < MIN_TOKENS:
            return False
        best = self._best(model, model.state_identity(), tokens)  # of those giving as much, one in RAM first
        return best is not None and best[1] == len(tokens) and best[0].data is not None

    def _restore(self, model: Model, wanted: np.ndarray, live: int) -> int:
        identity = model.state_identity()
        if self._disk is not None:
            self._disk.scan(identity)
        if model.memory.kind != memory.FULL and live < model.n_past:
            live = 0  # going back in a recurrent state may mean starting again: count on nothing
        tried: set[int] = set()
        for _ in range(3):  # a disk file that fails its checks is dropped, a refused state passed over: the next
            best = self._best(model, identity, wanted, tried)
            if best is None or best[1] <= live or not self._worth(identity, best[0], best[1] - live):
                return live
            entry, gain = best
            tried.add(entry.serial)
            data = entry.data if entry.data is not None else self._read(entry)
            if data is not None:
                loaded = self._load(model, entry, gain, data)
                if loaded is not None:
                    return loaded
                live = 0  # refused: llama.cpp emptied the sequence first
        return live

    def _load(self, model: Model, entry: Entry, gain: int, data: State) -> Optional[int]:
        """Put ``entry``'s state into ``model`` and cut it to the ``gain`` tokens it shares; what it then holds
        (None: refused, the model emptied, the entry kept for when the other sequences hold fewer cells)."""
        t0 = time.perf_counter()
        ok = model.load_state(entry.tokens, data)
        seconds = time.perf_counter() - t0
        if not ok:
            with self._lock:
                entry.refusals += 1
                kept = model.n_seq > 1 and entry.refusals <= MAX_REFUSALS  # the others' cells may leave no room
            if kept:
                self._say("restore:cells", "localspec: the prompt cache could not restore a saved state beside the "
                                           "other requests' cells; the prompt is read instead, and the state kept.")
                return None
            self._forget(entry, f"llama.cpp refused a saved state of {model.path.name}")
            return 0
        model.truncate(gain)  # an attention cache keeps only the shared part
        with self._lock:
            entry.refusals = 0  # it loads: refusals count in a row
            entry.hits += 1
            entry.used = time.monotonic() + HIT_BONUS_SECONDS
            self.stats.restores += 1
            self.stats.restored_tokens += gain
            self.stats.restore_seconds += seconds
            self.stats.restored_bytes += entry.size
        if entry.file is not None:
            files.touch(entry.file)
        return gain

    def _best(self, model: Model, identity: str, wanted: np.ndarray,
              tried: frozenset[int] | set[int] = frozenset()) -> Optional[tuple[Entry, int]]:
        with self._lock:
            best: Optional[tuple[Entry, int]] = None
            for entry in self._entries.candidates(identity, wanted):
                if (entry.data is None and entry.file is None) or len(entry.tokens) > model.n_ctx or \
                        entry.serial in tried:
                    continue  # its state is on its way to disk, it does not fit this context, or tried already
                n = usable(model, entry.tokens, wanted)
                if n and (best is None or (n, *_cheaper(entry)) > (best[1], *_cheaper(best[0]))):
                    best = (entry, n)
            return best

    def _worth(self, identity: str, entry: Entry, gained: int) -> bool:
        """Whether restoring ``entry`` to gain ``gained`` tokens over the live context costs less than processing
        them: both measured (prompt processing by ``observe_prefill``, restores and saves by their bytes, disk
        reads by theirs). Before either is measured a restore is taken: it is a copy, a prompt is a model's
        forward passes."""
        rate = self._prefill_rate.get(identity)
        moved = self.stats.saved_bytes + self.stats.restored_bytes
        spent = self.stats.save_seconds + self.stats.restore_seconds
        if not self.weigh or rate is None or not moved or not spent:
            return True
        read = 0.0
        if entry.data is None:  # a disk read too: at its measured speed, or at 200 MB/s until one is measured
            read = entry.size * (self.stats.read_seconds / self.stats.read_bytes if self.stats.read_bytes else 5e-9)
        return entry.size * spent / moved + read < gained * rate

    def observe_prefill(self, model: Model, tokens: int, seconds: float) -> None:
        """A model processed ``tokens`` prompt tokens in ``seconds``: what a restore is weighed against."""
        if tokens >= BLOCK and seconds > 0:
            identity = model.state_identity()
            old = self._prefill_rate.get(identity)
            rate = seconds / tokens
            self._prefill_rate[identity] = rate if old is None else 0.5 * (old + rate)

    # -- saving -------------------------------------------------------------------

    def save(self, model: Model) -> Optional[Entry]:
        """Save ``model``'s state for the tokens its context holds now (a copy in RAM; the disk file is written
        in the background). Returns the entry, or None when nothing was saved (too short, held already, over
        every budget, or a fault, said once)."""
        if not self.enabled or model.n_past < MIN_TOKENS:
            return None
        try:
            return self._save(model)
        except Exception as exc:  # MemoryError included: the cache must never cost a reply
            self._say(f"save:{type(exc).__name__}", f"localspec: the prompt cache could not save a state ({exc}); "
                                                    "this prompt is not cached.")
            return None

    def _save(self, model: Model) -> Optional[Entry]:
        identity = model.state_identity()
        tokens = np.array(model.tokens, dtype=np.int32)
        if self._held(identity, tokens):
            return None
        t0 = time.perf_counter()
        data = model.save_state()
        size = len(data)
        if size > max(self.ram_bytes, self.disk_bytes):
            self._say("budget", f"localspec: a prompt-cache entry of {budget_text(size)} is larger than the "
                                f"cache's budgets ({self.describe()}); prompts this long are not cached.")
            return None
        disk = self._disk if self.disk_bytes and size <= self.disk_bytes else None
        with self._lock:
            self.stats.saves += 1
            self.stats.save_seconds += time.perf_counter() - t0
            self.stats.saved_bytes += size
            entry = Entry(identity, tokens, size, data if size <= self.ram_bytes else None,
                          serial=self._entries.new_serial())
            if model.cuts_after_load and entry.data is not None:
                self._supersede(identity, tokens)
            self._entries.add(entry)
            entry.queued = disk is not None  # a state waiting for the writer counts in the RAM budget
            self._fit_ram(keep=entry)
            if self.ram_used() > self.ram_bytes:  # no room beside the others: written here, not kept in RAM
                entry.data, entry.queued = None, False
        if disk is not None and entry.queued:
            disk.write_later(entry, data)
        elif disk is not None:  # too large to wait in RAM: written now
            disk.write(entry, data)
        if entry.data is None and entry.file is None:  # nowhere to keep it after all
            with self._lock:
                self._entries.remove(entry)
            return None
        return entry

    def _held(self, identity: str, tokens: np.ndarray) -> bool:
        with self._lock:
            for e in self._entries.candidates(identity, tokens):
                if (e.data is not None or e.file is not None or e.queued) and len(e.tokens) == len(tokens) \
                        and np.array_equal(e.tokens, tokens):
                    e.used = max(e.used, time.monotonic())
                    return True
        return False

    def _supersede(self, identity: str, tokens: np.ndarray) -> None:
        """Drop this model's RAM states that ``tokens`` extends: an attention cache's longer state serves every
        prompt the shorter one did (their disk files stay, for other processes)."""
        for e in self._entries.candidates(identity, tokens):
            if len(e.tokens) < len(tokens) and e.data is not None and np.array_equal(e.tokens, tokens[: len(e.tokens)]):
                e.data = None
                if e.file is None and not e.queued:
                    self._entries.remove(e)

    def _fit_ram(self, keep: Optional[Entry] = None) -> None:
        """Evict RAM states other than ``keep``'s, least recently used first (a restore counts as later use),
        until the budget holds; an entry written to disk stays known there."""
        held = sorted((e for e in self._entries.all() if e.data is not None and e is not keep),
                      key=lambda e: e.used)
        used = self.ram_used()
        for e in held:
            if used <= self.ram_bytes:
                break
            e.data = None
            if not e.queued:
                used -= e.size
                if e.file is None:
                    self._entries.remove(e)

    def clear(self) -> int:
        """Forget every entry, in RAM and on disk; returns how many files and entries there were."""
        self.flush()
        with self._lock:
            n = len(self._entries)
            for e in self._entries.all():
                self._entries.remove(e)
        if self._disk is not None:
            self._disk.clear()
        return n

    # -- the disk tier ------------------------------------------------------------

    def flush(self) -> None:
        """Wait until every queued disk write is done."""
        if self._disk is not None:
            self._disk.flush()

    def close(self) -> None:
        """Finish the disk writes and drop the RAM tier (the disk tier stays, for the next process)."""
        self.flush()
        with self._lock:
            for e in self._entries.all():
                e.data = None
                if e.file is None:
                    self._entries.remove(e)

    def _read(self, entry: Entry) -> Optional[bytes]:
        """The state of a disk entry, checked; None (the entry dropped, with a notice if the file was bad)."""
        assert self._disk is not None  # an entry has a file only where there is a disk tier
        return self._disk.read(entry)

    def _forget(self, entry: Entry, why: str) -> None:
        with self._lock:
            self._entries.remove(entry)
        if entry.file is not None and self._disk is not None:
            self._disk.reject(entry.file, why)
        else:
            self._say(why, f"localspec: dropped a prompt-cache entry ({why}).")

    def _say(self, key: str, message: str) -> None:
        """One notice per kind of trouble, not one per request."""
        if key not in self._said:
            self._said.add(key)
            try:
                self.notify(message)
            except Exception:
                pass


def _cheaper(entry: Entry) -> tuple[bool, int]:
    """Between entries that give as many tokens: one in RAM, then the smaller state."""
    return entry.data is not None, -entry.size
