"""The prompt cache's disk tier: state files under a byte budget, written by a background thread.

A save costs its caller one copy of the state: the writer thread writes it (see ``files`` for the format),
and stops after ``WRITER_IDLE_SECONDS`` with nothing to write. Room is made by deleting the least recently
used files of every model and process sharing the folder. A model's files written by earlier processes are
learnt from their headers the first time the model looks up a prompt.
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from . import files
from .entries import CacheStats, Entry, EntryTable
from .files import BadFile, State

#: The disk writer stops after this long with nothing to write (a later save starts it again).
WRITER_IDLE_SECONDS = 2.0


class DiskTier:
    """A folder of state files for the entries of an ``EntryTable``, under a byte budget.

    Args:
        folder: the cache's folder.
        budget: bytes the files may take (every model's and every process's count).
        table: the cache's entries; a file written or found is recorded on its entry.
        lock: the cache's lock, which guards ``table`` and ``stats``.
        stats: the cache's counts, which disk reads, writes and rejected files add to.
        say: ``say(key, message)`` gives one notice per key.
    """

    def __init__(self, folder: Path, budget: int, table: EntryTable, lock: threading.RLock, stats: CacheStats,
                 say: Callable[[str, str], None]):
        self.folder = folder
        self.budget = budget
        self._table = table
        self._lock = lock
        self._stats = stats
        self._say = say
        self._writes: queue.Queue[Optional[tuple[Entry, State]]] = queue.Queue()
        self._writer: Optional[threading.Thread] = None
        self._scanned: set[str] = set()

    # -- writing ------------------------------------------------------------------

    def write_later(self, entry: Entry, data: State) -> None:
        """Queue ``entry``'s state for the writer thread (started if it is not running)."""
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
                        self.write(entry, data)
                finally:
                    with self._lock:
                        entry.queued = False
                        if entry.file is None and entry.data is None:
                            self._table.remove(entry)
            except Exception:  # a notice that failed, say: the writer goes on
                pass
            finally:
                self._writes.task_done()

    def flush(self) -> None:
        """Wait until every queued write is done."""
        with self._lock:
            alive = self._writer is not None and self._writer.is_alive()
        if alive:
            self._writes.join()

    def write(self, entry: Entry, data: State) -> None:
        """Write ``entry``'s file now, making room first; a failure leaves the entry without one, said once."""
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
            self._stats.disk_writes += 1

    def _make_room(self, size: int) -> None:
        """Delete the least recently used files (by modification time, which a restore renews) until ``size``
        more bytes fit the disk budget; every model's and every process's files count, temporaries too."""
        held = files.files_by_age(files.version_folder(self.folder))
        used = sum(s for _, s, _ in held)
        for _, s, f in held:
            if used + size <= self.budget:
                break
            used -= s
            files.unlink(f)
            with self._lock:
                for e in [e for e in self._table.all() if e.file == f]:
                    e.file = None
                    if e.data is None and not e.queued:
                        self._table.remove(e)

    # -- reading ------------------------------------------------------------------

    def scan(self, identity: str) -> None:
        """Learn the files of this model (once per model): their headers and tokens, not their states; and
        remove what writes that never finished left behind."""
        if not self.budget:
            return
        with self._lock:
            if identity in self._scanned:
                return
            self._scanned.add(identity)
            known = {e.file for e in self._table.all() if e.file is not None}
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
                self.reject(f, str(why))
                continue
            with self._lock:
                self._table.add(Entry(identity, tokens, int(header["state_bytes"]), None, f, used=0.0,
                                      serial=self._table.new_serial()))

    def read(self, entry: Entry) -> Optional[bytes]:
        """The state of an entry on disk, checked; None (the entry dropped, with a notice if the file was bad)."""
        assert entry.file is not None
        t0 = time.perf_counter()
        try:
            data = files.read_state(entry.file, entry.identity)
        except FileNotFoundError:  # another process evicted it: nothing wrong
            with self._lock:
                self._table.remove(entry)
            return None
        except BadFile as why:
            with self._lock:
                self._table.remove(entry)
            self.reject(entry.file, str(why))
            return None
        with self._lock:
            self._stats.disk_reads += 1
            self._stats.read_seconds += time.perf_counter() - t0
            self._stats.read_bytes += len(data)
        return data

    def reject(self, path: Path, why: str) -> None:
        """Delete a file that is not a whole entry for its model, with one notice."""
        self._stats.rejected_files += 1
        self._say(f"file:{path}", f"localspec: ignored and deleted the prompt-cache file {path} ({why}).")
        files.unlink(path)

    def clear(self) -> None:
        """Delete every file, and scan each model's folder again when it is next looked up."""
        with self._lock:
            self._scanned.clear()
        files.remove_all(self.folder)
