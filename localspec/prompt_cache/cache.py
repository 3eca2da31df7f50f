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
* **Lookup** walks the prompt's blocks of ``BLOCK`` tokens through a chain of
  hashes (each block's hash covers every token before it), so finding the
  longest cached prefix takes time linear in the prompt, whatever the number
  of entries. A plain attention cache can use any shared prefix of an entry
  (the rest is cut off); a recurrent state or a sliding window only an entry
  that is a whole prefix, which is why those are also saved at a chat's
  message boundaries (see ``engine.Generation``).
* **Tiers**: RAM under a strict byte budget (states waiting for the disk
  count in it), and a folder on disk under its own, written by a background
  thread so a save costs the caller one copy of the state. Eviction is least
  recently used, a restore counting as ``HIT_BONUS_SECONDS`` of later use,
  so a shared system prompt outlives one-off side requests.
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

import itertools
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional, Union

import numpy as np

from ..runtime import memory
from ..runtime.model import Model
from . import files
from .files import BadFile, State

#: Tokens per hashed block of the lookup chain.
BLOCK = 32
#: Default budgets: this share of the memory free at start (at most RAM_MOST), and of the disk free (at most DISK_MOST).
RAM_SHARE, RAM_MOST = 0.25, 8 * 2**30
DISK_SHARE, DISK_MOST = 0.10, 16 * 2**30
#: Prompts shorter than this are not worth an entry (a restore costs more than their processing).
MIN_TOKENS = BLOCK

#: A restore counts as recent use for this many seconds more than a save, so a shared prefix outlives
#: one-off side requests without freezing the RAM tier once every entry has been hit.
HIT_BONUS_SECONDS = 600.0
#: The disk writer stops after this long with nothing to write (a later save starts it again).
WRITER_IDLE_SECONDS = 2.0


@dataclass
class Entry:
    """One model's saved state after ``tokens``.

    Attributes:
        identity: the model's ``state_identity``.
        tokens: the prefix the state holds.
        size: bytes of the state.
        data: the state, while it is in RAM (None: only on disk).
        file: its disk file, once written (None: RAM only).
        hits: times it was restored.
        used: when it was saved or last restored (``time.monotonic``).
    """

    identity: str
    tokens: np.ndarray
    size: int
    data: Optional[State] = None
    file: Optional[Path] = None
    hits: int = 0
    used: float = field(default_factory=time.monotonic)
    serial: int = 0
    queued: bool = False  # waiting for the disk writer, which holds the state meanwhile (counted in RAM)
    removed: bool = False  # dropped from the cache: the writer must not bring it back


@dataclass
class CacheStats:
    """What the cache has done since it was opened."""

    saves: int = 0
    restores: int = 0
    restored_tokens: int = 0
    disk_reads: int = 0
    disk_writes: int = 0
    rejected_files: int = 0
    save_seconds: float = 0.0
    restore_seconds: float = 0.0
    saved_bytes: int = 0
    restored_bytes: int = 0
    read_seconds: float = 0.0
    read_bytes: int = 0


def _chain(tokens: np.ndarray) -> Iterable[int]:
    """The hash of each whole block of ``tokens`` together with every block before it, in order."""
    h = 0
    for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
        h = hash((h, tokens[start : start + BLOCK].tobytes()))
        yield h


class _Index:
    """Entries of one model by their token blocks: ``through[h]`` holds every entry whose tokens begin with
    the blocks chained into ``h``, ``ends[h]`` those whose last whole block that is (0: none whole)."""

    def __init__(self) -> None:
        self.through: dict[int, set[int]] = {}
        self.ends: dict[int, set[int]] = {}

    def add(self, serial: int, tokens: np.ndarray) -> None:
        last = 0
        for h in _chain(tokens):
            self.through.setdefault(h, set()).add(serial)
            last = h
        self.ends.setdefault(last, set()).add(serial)

    def remove(self, serial: int, tokens: np.ndarray) -> None:
        last = 0
        for h in _chain(tokens):
            self._drop(self.through, h, serial)
            last = h
        self._drop(self.ends, last, serial)

    @staticmethod
    def _drop(table: dict[int, set[int]], h: int, serial: int) -> None:
        held = table.get(h)
        if held is not None:
            held.discard(serial)
            if not held:
                del table[h]

    def candidates(self, tokens: np.ndarray) -> set[int]:
        """Entries that may share the most with ``tokens``: those sharing its deepest indexed block, and every
        entry ending in a block it shares (a whole-prefix entry, which is all a recurrent state can use)."""
        found = set(self.ends.get(0, ()))
        deepest: set[int] = set()
        for h in _chain(tokens):
            through = self.through.get(h)
            if not through:
                break
            deepest = through
            found |= self.ends.get(h, set())
        return found | deepest


def usable(model: Model, entry_tokens: np.ndarray, wanted: np.ndarray) -> int:
    """How many of ``wanted`` a restore of an entry holding ``entry_tokens`` gives ``model``: any shared prefix for
    an attention cache (the rest is cut off), only the whole entry for a recurrent state or a sliding window."""
    n = min(len(entry_tokens), len(wanted))
    diff = np.flatnonzero(entry_tokens[:n] != wanted[:n])
    shared = int(diff[0]) if diff.size else n
    if model.cuts_after_load:
        return shared
    return shared if shared == len(entry_tokens) else 0


def available_memory() -> int:
    """Bytes of memory available now (Linux's MemAvailable; the free pages elsewhere; 4 GiB when unknown)."""
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        try:
            return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
        except (AttributeError, ValueError, OSError):  # not on this system (macOS, Windows): a fixed amount
            return 4 * 2**30


def default_ram_budget() -> int:
    """Bytes for the RAM tier: ``RAM_SHARE`` of the memory available now, at most ``RAM_MOST``."""
    return int(min(RAM_MOST, RAM_SHARE * available_memory()))


def default_disk_budget(folder: Path) -> int:
    """Bytes for the disk tier: ``DISK_SHARE`` of the free space where ``folder`` is, at most ``DISK_MOST``."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        st = os.statvfs(probe)
    except (OSError, AttributeError):  # no statvfs (Windows): a fixed budget
        return 2 * 2**30
    return int(min(DISK_MOST, DISK_SHARE * st.f_bavail * st.f_frsize))


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n < 10 * 2**30 else f"{n / 2**30:.1f} GiB"


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
        self._entries: dict[int, Entry] = {}
        self._indexes: dict[str, _Index] = {}
        self._serials = itertools.count(1)
        self._lock = threading.RLock()
        self._said: set[str] = set()
        # seconds per token each model took to process prompts, measured (see ``observe_prefill``)
        self._prefill_rate: dict[str, float] = {}
        self._writes: queue.Queue[Optional[tuple[Entry, State]]] = queue.Queue()
        self._writer: Optional[threading.Thread] = None
        self._scanned: set[str] = set()

    # -- what it holds ----------------------------------------------------------

    @property
    def enabled(self) -> bool:
        return self.ram_bytes > 0 or self.disk_bytes > 0

    def entries(self) -> list[Entry]:
        """Every entry known, RAM and disk, newest use first."""
        with self._lock:
            return sorted(self._entries.values(), key=lambda e: -e.used)

    def ram_used(self) -> int:
        """Bytes of states held in RAM: the RAM tier's and those waiting for the disk writer."""
        with self._lock:
            return sum(e.size for e in self._entries.values() if e.data is not None or e.queued)

    def describe(self) -> str:
        """One line for a person: the budgets and where the disk tier is."""
        ram = f"{_mib(self.ram_bytes)} of RAM" if self.ram_bytes else "no RAM"
        disk = f"{_mib(self.disk_bytes)} on disk in {self.folder}" if self.disk_bytes and self.folder else "no disk"
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

    def _restore(self, model: Model, wanted: np.ndarray, live: int) -> int:
        identity = model.state_identity()
        self._scan(identity)
        if model.memory.kind != memory.FULL and live < model.n_past:
            live = 0  # going back in a recurrent state may mean starting again: count on nothing
        for _ in range(3):  # a disk file that fails its checks is dropped, and the next best one tried
            best = self._best(model, identity, wanted)
            if best is None or best[1] <= live or not self._worth(identity, best[0], best[1] - live):
                return live
            entry, gain = best
            data = entry.data if entry.data is not None else self._read(entry)
            if data is not None:
                return self._load(model, entry, gain, data)
        return live

    def _load(self, model: Model, entry: Entry, gain: int, data: State) -> int:
        """Put ``entry``'s state into ``model`` and cut it to the ``gain`` tokens it shares; what it then holds."""
        t0 = time.perf_counter()
        ok = model.load_state(entry.tokens, data)
        seconds = time.perf_counter() - t0
        if not ok:
            self._forget(entry, f"llama.cpp refused a saved state of {model.path.name}")
            return 0
        model.truncate(gain)  # an attention cache keeps only the shared part
        with self._lock:
            entry.hits += 1
            entry.used = time.monotonic() + HIT_BONUS_SECONDS
            self.stats.restores += 1
            self.stats.restored_tokens += gain
            self.stats.restore_seconds += seconds
            self.stats.restored_bytes += entry.size
        if entry.file is not None:
            files.touch(entry.file)
        return gain

    def _best(self, model: Model, identity: str, wanted: np.ndarray) -> Optional[tuple[Entry, int]]:
        with self._lock:
            index = self._indexes.get(identity)
            if index is None:
                return None
            best: Optional[tuple[Entry, int]] = None
            for serial in index.candidates(wanted):
                entry = self._entries[serial]
                if (entry.data is None and entry.file is None) or len(entry.tokens) > model.n_ctx:
                    continue  # its state is on its way to disk, or it does not fit this context
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
            self._say("budget", f"localspec: a prompt-cache entry of {_mib(size)} is larger than the cache's "
                                f"budgets ({self.describe()}); prompts this long are not cached.")
            return None
        to_disk = bool(self.disk_bytes) and self.folder is not None and size <= self.disk_bytes
        with self._lock:
            self.stats.saves += 1
            self.stats.save_seconds += time.perf_counter() - t0
            self.stats.saved_bytes += size
            entry = Entry(identity, tokens, size, data if size <= self.ram_bytes else None,
                          serial=next(self._serials))
            if model.cuts_after_load and entry.data is not None:
                self._supersede(identity, tokens)
            self._add(entry)
            entry.queued = to_disk  # a state waiting for the writer counts in the RAM budget
            self._fit_ram(keep=entry)
            if self.ram_used() > self.ram_bytes:  # no room beside the others: written here, not kept in RAM
                entry.data, entry.queued = None, False
        if entry.queued:
            self._write_later(entry, data)
        elif to_disk:
            self._write(entry, data)
        if entry.data is None and entry.file is None:  # nowhere to keep it after all
            with self._lock:
                self._remove(entry)
            return None
        return entry

    def _held(self, identity: str, tokens: np.ndarray) -> bool:
        with self._lock:
            index = self._indexes.get(identity)
            if index is None:
                return False
            for serial in index.candidates(tokens):
                e = self._entries[serial]
                if (e.data is not None or e.file is not None or e.queued) and len(e.tokens) == len(tokens) \
                        and np.array_equal(e.tokens, tokens):
                    e.used = max(e.used, time.monotonic())
                    return True
        return False

    def _supersede(self, identity: str, tokens: np.ndarray) -> None:
        """Drop this model's RAM states that ``tokens`` extends: an attention cache's longer state serves every
        prompt the shorter one did (their disk files stay, for other processes)."""
        index = self._indexes.get(identity)
        if index is None:
            return
        for serial in list(index.candidates(tokens)):
            e = self._entries[serial]
            if len(e.tokens) < len(tokens) and e.data is not None and np.array_equal(e.tokens, tokens[: len(e.tokens)]):
                e.data = None
                if e.file is None and not e.queued:
                    self._remove(e)

    def _add(self, entry: Entry) -> None:
        self._entries[entry.serial] = entry
        self._indexes.setdefault(entry.identity, _Index()).add(entry.serial, entry.tokens)

    def _remove(self, entry: Entry) -> None:
        entry.removed = True
        entry.data = None
        if self._entries.pop(entry.serial, None) is not None:
            index = self._indexes.get(entry.identity)
            if index is not None:
                index.remove(entry.serial, entry.tokens)

    def _fit_ram(self, keep: Optional[Entry] = None) -> None:
        """Evict RAM states other than ``keep``'s, least recently used first (a restore counts as later use),
        until the budget holds; an entry written to disk stays known there."""
        held = sorted((e for e in self._entries.values() if e.data is not None and e is not keep),
                      key=lambda e: e.used)
        used = self.ram_used()
        for e in held:
            if used <= self.ram_bytes:
                break
            e.data = None
            if not e.queued:
                used -= e.size
                if e.file is None:
                    self._remove(e)

    def clear(self) -> int:
        """Forget every entry, in RAM and on disk; returns how many files and entries there were."""
        self.flush()
        with self._lock:
            n = len(self._entries)
            for e in list(self._entries.values()):
                self._remove(e)
            self._scanned.clear()
        if self.folder is not None:
            files.remove_all(self.folder)
        return n

    # -- the disk tier ------------------------------------------------------------

    def _write_later(self, entry: Entry, data: State) -> None:
        with self._lock:  # the writer decides to stop under this lock too, so no write is left behind
            self._writes.put((entry, data))  # the same bytes as the RAM entry: nothing writes to them again
            if self._writer is None or not self._writer.is_alive():
                self._writer = threading.Thread(target=self._write_loop, name="localspec-prompt-cache", daemon=True)
                self._writer.start()

    def _write_loop(self) -> None:
        """The writer: runs while there is something to write, and stops after ``WRITER_IDLE_SECONDS`` idle."""
        while True:
            try:
                item = self._writes.get(timeout=WRITER_IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._writes.empty():
                        self._writer = None
                        return
                continue
            try:
                if item is None:
                    continue
                entry, data = item
                try:
                    if not entry.removed:
                        self._write(entry, data)
                finally:
                    with self._lock:
                        entry.queued = False
                        if entry.file is None and entry.data is None:
                            self._remove(entry)
            except Exception:  # a notice that failed, say: the writer goes on
                pass
            finally:
                self._writes.task_done()

    def flush(self) -> None:
        """Wait until every queued disk write is done."""
        with self._lock:
            alive = self._writer is not None and self._writer.is_alive()
        if alive:
            self._writes.join()

    def close(self) -> None:
        """Finish the disk writes and drop the RAM tier (the disk tier stays, for the next process)."""
        self.flush()
        with self._lock:
            for e in list(self._entries.values()):
                e.data = None
                if e.file is None:
                    self._remove(e)

    def _write(self, entry: Entry, data: State) -> None:
        assert self.folder is not None
        path = files.model_folder(self.folder, entry.identity) / files.file_name(entry.tokens)
        try:
            self._make_room(entry.size + 4 * len(entry.tokens) + 4096)
            files.write(path, entry.identity, entry.tokens, data)
        except OSError as exc:
            self._say("disk", f"localspec: could not write a prompt-cache entry in {path.parent} "
                              f"({exc.strerror or exc}); prompts are cached in RAM only for now.")
            return
        with self._lock:
            if entry.removed:  # dropped while it was being written (cleared, refused): not an entry any more
                files.unlink(path)
                return
            entry.file = path
            self.stats.disk_writes += 1

    def _make_room(self, size: int) -> None:
        """Delete the least recently used files (by modification time, which a restore renews) until ``size``
        more bytes fit the disk budget; every model's and every process's files count, temporaries too."""
        assert self.folder is not None
        held = files.files_by_age(files.version_folder(self.folder))
        used = sum(s for _, s, _ in held)
        for _, s, f in held:
            if used + size <= self.disk_bytes:
                break
            used -= s
            files.unlink(f)
            with self._lock:
                for e in [e for e in self._entries.values() if e.file == f]:
                    e.file = None
                    if e.data is None and not e.queued:
                        self._remove(e)

    def _scan(self, identity: str) -> None:
        """Learn the disk files of this model (once per model): their headers and tokens, not their states; and
        remove what writes that never finished left behind."""
        if self.folder is None or not self.disk_bytes:
            return
        with self._lock:
            if identity in self._scanned:
                return
            self._scanned.add(identity)
            known = {e.file for e in self._entries.values() if e.file is not None}
        files.remove_stale_temporaries(files.version_folder(self.folder))
        folder = files.model_folder(self.folder, identity)
        for f in sorted(folder.glob(f"*{files.SUFFIX}")) if folder.is_dir() else ():
            if f in known:
                continue
            try:
                header, tokens = files.read_header(f, identity)
            except FileNotFoundError:
                continue
            except BadFile as why:
                self._reject(f, str(why))
                continue
            with self._lock:
                self._add(Entry(identity, tokens, int(header["state_bytes"]), None, f, used=0.0,
                                serial=next(self._serials)))

    def _read(self, entry: Entry) -> Optional[bytes]:
        """The state of a disk entry, checked; None (the entry dropped, with a notice if the file was bad)."""
        assert entry.file is not None
        t0 = time.perf_counter()
        try:
            data = files.read_state(entry.file, entry.identity)
        except FileNotFoundError:  # another process evicted it: nothing wrong
            with self._lock:
                self._remove(entry)
            return None
        except BadFile as why:
            self._forget(entry, str(why))
            return None
        with self._lock:
            self.stats.disk_reads += 1
            self.stats.read_seconds += time.perf_counter() - t0
            self.stats.read_bytes += len(data)
        return data

    def _reject(self, path: Path, why: str) -> None:
        self.stats.rejected_files += 1
        self._say(f"file:{path}", f"localspec: ignored and deleted the prompt-cache file {path} ({why}).")
        files.unlink(path)

    def _forget(self, entry: Entry, why: str) -> None:
        with self._lock:
            self._remove(entry)
        if entry.file is not None:
            self._reject(entry.file, why)
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
