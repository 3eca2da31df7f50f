"""Huge pages for llama.cpp's buffers: the range arithmetic, a collapse that keeps every byte, and a real model."""

from __future__ import annotations

import ctypes
import mmap
import platform
import random
import re
import sys

import numpy as np
import pytest
from clirun import run_cli

from localspec.runtime import hugepages
from localspec.runtime.hugepages import HUGE_PAGE, aligned, back_with_huge_pages, subtract

linux_madvise = pytest.mark.skipif(
    not sys.platform.startswith("linux") or hugepages.thp_mode() != "madvise",
    reason="needs Linux with transparent huge pages in madvise mode",
)


def test_subtract_and_align_agree_with_sets_of_addresses():
    rng = random.Random(3)
    for _ in range(200):
        ranges = [(a, a + rng.randint(1, 40)) for a in sorted(rng.sample(range(0, 400, 50), 4))]
        taken = [(a, a + rng.randint(1, 60)) for a in sorted(rng.sample(range(400), 3))]
        expect = {x for a, b in ranges for x in range(a, b)} - {x for a, b in taken for x in range(a, b)}
        got = subtract(ranges, taken)
        assert {x for a, b in got for x in range(a, b)} == expect
        assert all(a < b for a, b in got)
    assert aligned([(1, 3 * HUGE_PAGE + 5), (HUGE_PAGE + 1, 2 * HUGE_PAGE + 7)]) == [(HUGE_PAGE, 3 * HUGE_PAGE)]


def test_an_unreadable_proc_only_turns_huge_pages_off(monkeypatch):
    def unreadable() -> list:
        raise PermissionError("/proc/self/maps")

    monkeypatch.setattr(hugepages, "thp_mode", lambda: "madvise")
    monkeypatch.setattr(hugepages, "anonymous_ranges", unreadable)
    pages = hugepages.HugePages()
    assert not pages.enabled
    pages.apply()
    assert pages.advised == 0


def _smaps_field(start: int, field: str) -> int:
    """A kB field of the mapping that holds ``start`` in /proc/self/smaps (neighbours may have merged into it)."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= start < hi
            elif inside and head == f"{field}:":
                return int(line.split()[1])
    raise AssertionError(f"no mapping holds {start:#x}")


def _kernel() -> tuple[int, int]:
    major, minor = re.match(r"(\d+)\.(\d+)", platform.release()).groups()  # type: ignore[union-attr]
    return int(major), int(minor)


def _resident_pages(start: int, length: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    vec = (ctypes.c_ubyte * (length // 4096))()
    assert libc.mincore(start, length, vec) == 0
    return sum(b & 1 for b in vec)


@linux_madvise
def test_collapsing_keeps_every_byte_gives_huge_pages_and_leaves_untouched_memory_alone():
    size = 40 * HUGE_PAGE
    area = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = np.frombuffer(area, dtype=np.uint8)
    data = np.random.default_rng(0).integers(0, 256, size // 2, dtype=np.uint8)
    view[: size // 2] = data  # the first half is written; the second half never touched
    base = ctypes.addressof(ctypes.c_char.from_buffer(area))
    ranges = aligned([(base, base + size)])
    assert _smaps_field(base, "AnonHugePages") == 0
    collapsed = back_with_huge_pages(ranges)
    assert np.array_equal(view[: size // 2], data)
    assert _resident_pages(base + size // 2 + HUGE_PAGE, size // 2 - HUGE_PAGE) == 0  # the untouched half stays out
    assert not view[size // 2:].any()
    if _kernel() >= (6, 1):  # MADV_COLLAPSE; older kernels leave it to khugepaged
        assert HUGE_PAGE * 18 <= collapsed <= size // 2 + HUGE_PAGE
        assert _smaps_field(base, "AnonHugePages") >= (size // 2 - 2 * HUGE_PAGE) // 1024
    del view
    area.close()


@linux_madvise
@pytest.mark.real
def test_a_real_model_with_huge_pages_gives_the_same_logits():
    from conftest import real_models_dir

    from localspec.runtime.model import Model

    target = real_models_dir() / "target.gguf"
    with Model(target, n_ctx=512, n_threads=2, huge_pages=False) as plain:
        prompt = plain.tokenize("def merge(a, b):\n    out = []\n" * 8)
        expect = plain.eval(prompt, logits="all").copy()  # a view into the context, freed on close
        assert plain.huge_page_bytes == 0
    with Model(target, n_ctx=512, n_threads=2) as huge:
        assert huge.huge_page_bytes > 100 * HUGE_PAGE  # the repacked weights at least
        np.testing.assert_array_equal(huge.eval(prompt, logits="all"), expect)


@linux_madvise
@pytest.mark.real
def test_huge_pages_can_be_turned_off_through_load_and_the_command_line(tmp_path, monkeypatch):
    from conftest import real_models_dir

    import localspec
    import localspec.loading

    target = real_models_dir() / "target.gguf"
    with localspec.load(target, n_ctx=256, n_threads=2, huge_pages=False, history=False) as pair:
        assert pair.target.huge_page_bytes == 0
    with localspec.load(target, n_ctx=256, n_threads=2, history=False) as pair:
        assert pair.target.huge_page_bytes > 100 * HUGE_PAGE
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    loaded: list = []
    real_load = localspec.loading.load

    def load(*args, **kwargs):
        pair = real_load(*args, **kwargs)
        loaded.append(pair.target.huge_page_bytes)
        return pair

    monkeypatch.setattr(localspec.loading, "load", load)
    for flag, off in (("--no-huge-pages", True), ("--huge-pages", False)):
        r = run_cli(["generate", "-t", str(target), "--ctx", "256", "--threads", "2", flag,
                                     "-p", "def f(x):", "-n", "2", "-m", "plain"])
        assert r.exit_code == 0, r.output
        assert (loaded[-1] == 0) == off
