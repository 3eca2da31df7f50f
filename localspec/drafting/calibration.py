"""Measuring this machine: the cost profile auto decides by, and the fastest thread count.

Both are measured with the pair's real settings and cached per (model files,
llama-cpp-python version, device, threads, GPU layers) in the cache directory,
so a machine is measured once; ``refresh`` measures again. Measuring runs the
models and leaves their caches empty: callers do it at named points
(``Pair.calibrate``, ``Pair.choose_threads``) and say so through ``notify``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from ..methods import AUTO_KMAX
from ..paths import cache_dir, write_atomic
from ..runtime.memory import FULL
from ..runtime.model import Model
from ..runtime.process import default_threads, gpu_offload_supported
from .costs import CostProfile
from .drafters import PromptLookupDrafter
from .mtp_head import MtpHead
from .together import measure_together

#: A cached time is trusted while a fresh one is within this fraction of it, or within STALE_FLOOR seconds.
STALE_TOLERANCE = 0.25
STALE_FLOOR = 0.001
#: Repetitions whose 75th percentile exceeds the fastest by this factor mean the machine was busy.
BUSY_SPREAD = 1.3
#: A cached thread choice is beaten when a few fresh steps (or batches) at another count take at most this
#: fraction of the choice's fresh time: the first measurement saw a machine that no longer is.
BEATEN = 0.85
#: What "busy" means, and what becomes of a busy measurement: it is cached like any other, since measuring
#: again at every start costs more than it saves on a virtual machine whose repetitions always disagree a
#: little; a later start whose check finds steps faster than cached (``_stale``) measures again.
_BUSY_WHY = "other programs running, or repeated steps that disagree"
_KEPT = ("; kept all the same, and measured again when a later start finds steps faster than they were, "
         "or another thread count faster (or by `localspec calibrate`)")
#: Seconds a measurement of one shape may take in the thread sweep, and one whole ``measure``, before it takes
#: fewer repetitions (never under 3): a slow machine is measured no worse for it, and sooner.
SWEEP_SHAPE_SECONDS = 1.5
MEASURE_SECONDS = 8.0
#: The most sequences the multi-sequence curve measures (``together``), where the target holds that many.
TOGETHER_MOST = 8
#: Bumped whenever ``measure`` or what it measures changes (3: huge pages for the model buffers; 4: a
#: 128-token context, whose prefill took a newcomer's slow machine 15 s at 256, and fewer passes there),
#: so profiles measured the old way are measured again.
CALIBRATION_VERSION = 4
_CALIBRATION_TEXT = (
    "def merge(a, b):\n    out = []\n    i = j = 0\n    while i < len(a) and j < len(b):\n"
    "        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n        else:\n"
    "            out.append(b[j]); j += 1\n    return out + a[i:] + b[j:]\n"
    "The quick brown fox jumps over the lazy dog while the committee reviews the report. "
)


def _file_identity(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"


def threads_key(target: Model) -> str:
    """Identity of what the fastest thread count depends on: the target's setup and the cores.

    Not the draft model: the sweep never runs it, so loading the target alone reuses the answer.
    """
    return _key(["threads", *_setup(target, None), f"cores={default_threads()}"])


@dataclass
class ThreadChoice:
    """The fastest thread counts measured for the target: for single-token steps and for verification batches.

    Attributes:
        threads: for single-token steps (memory-bound).
        batch_threads: for batches of ``AUTO_KMAX + 1`` tokens (compute-bound).
        step_seconds: seconds per step at each thread count tried.
        batch_seconds: seconds per batch at each thread count tried.
        checked: a fresh step time at ``threads`` that confirmed the cache (None when just measured),
            which ``calibrate`` may reuse to confirm its own.
        busy: the machine looked busy while the counts were measured.
    """

    threads: int
    batch_threads: int
    step_seconds: dict[int, float]
    batch_seconds: dict[int, float]
    checked: Optional[float] = None
    busy: bool = False


def choose_threads(target: Model, refresh: bool = False,
                   cache_file: Optional[Path] = None, notify: Optional[Callable[[str], None]] = None,
                   ) -> ThreadChoice:
    """The fastest thread counts for steps and for batches on this machine, measured once and cached.

    Args:
        notify: told in one line when a measurement starts.
    """
    say = notify or (lambda _: None)
    path = _store_path(cache_file)
    key = threads_key(target)
    rec = _read_store(path).get(key)
    if rec and "batch_seconds" in rec and not refresh:  # older records lack the batch sweep: measured again
        cached = ThreadChoice(int(rec["threads"]), int(rec["batch_threads"]),
                              {int(n): float(t) for n, t in rec["step_seconds"].items()},
                              {int(n): float(t) for n, t in rec["batch_seconds"].items()},
                              busy=bool(rec.get("busy")))
        why = _contradiction(target, cached, default_threads())
        if why is None:
            return cached
        say(f"localspec: the cached thread measurement no longer holds ({why}); measuring again")
    else:
        say("localspec: measuring the fastest thread counts for this machine (once; --threads and "
            "--threads-batch override)")
    steps, batches, noisy = measure_threads(target, default_threads())
    choice = ThreadChoice(min(steps, key=lambda n: steps[n]), min(batches, key=lambda n: batches[n]), steps, batches,
                          busy=noisy)
    if noisy:
        say(f"localspec: the machine looked busy while measuring the thread counts ({_BUSY_WHY}){_KEPT}")
    store = _read_store(path)
    store[key] = {"threads": choice.threads, "batch_threads": choice.batch_threads, "step_seconds": steps,
                  "batch_seconds": batches, "target": str(target.path), "measured_at": time.time(),
                  "busy": noisy}
    _save_store(path, store, notify)
    return choice


def rivals(seconds: dict[int, float], chosen: int, max_threads: int) -> list[int]:
    """The thread counts worth a few fresh steps beside ``chosen``: the runner-up of the measured ``seconds``
    and all cores, where they differ from it (a busy first measurement pins a low count)."""
    others = sorted((n for n in seconds if n != chosen and n <= max_threads), key=lambda n: seconds[n])
    return sorted({*others[:1], max_threads} - {chosen})


def _contradiction(target: Model, cached: ThreadChoice, max_threads: int) -> Optional[str]:
    """Why a few fresh steps contradict a cached thread choice, or None (then ``cached.checked`` is set).

    The chosen count's step is timed again, and so are its rivals' (see
    ``rivals``): a choice made on a busy machine can still time
    the same at its own count while another count has become much faster.
    Where the choice was measured busy, the batch count's rivals are timed
    too, a few batches each.
    """
    then, now = cached.step_seconds[cached.threads], step_seconds(target, cached.threads)
    if _stale(then, now):
        return f"a step takes {1000 * now:.1f} ms at {cached.threads} threads, {1000 * then:.1f} ms when measured"
    for n in rivals(cached.step_seconds, cached.threads, max_threads):
        rival = step_seconds(target, n)
        if _beaten(now, rival):
            return (f"a step takes {1000 * rival:.1f} ms at {n} threads and {1000 * now:.1f} ms at the "
                    f"{cached.threads} chosen")
    if cached.busy:
        mine = batch_seconds(target, cached.batch_threads)
        for n in rivals(cached.batch_seconds, cached.batch_threads, max_threads):
            rival = batch_seconds(target, n)
            if _beaten(mine, rival):
                return (f"a batch takes {1000 * rival:.1f} ms at {n} threads and {1000 * mine:.1f} ms at the "
                        f"{cached.batch_threads} chosen")
    cached.checked = now
    return None


def _setup(target: Model, draft: Optional[Model]) -> list[str]:
    """The model files, library, device and settings every measurement depends on."""
    import llama_cpp

    return [_file_identity(target.path), _file_identity(draft.path) if draft else "-", llama_cpp.__version__,
            "gpu" if gpu_offload_supported() else "cpu", f"ngl={target.n_gpu_layers}", f"fa={target.flash_attn}"]


def _key(parts: list[str]) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:24]


def calibration_key(target: Model, draft: Optional[Model], kmax: int, head: bool = False) -> str:
    """Identity of everything a calibration depends on (``head``: it measured the target's MTP head too)."""
    # a recurrent target rolls back in a context of one sequence and checkpoints in one of several: other costs
    memory = [] if target.memory.kind == FULL else [f"memory={target.memory.kind}"]
    return _key([*_setup(target, draft), f"threads={target.n_threads}", f"threads_batch={target.n_threads_batch}",
                 f"kmax={kmax}", *(["mtp-head"] if head else []), *memory,
                 f"calibration={CALIBRATION_VERSION}"])


def _times(fn: Callable[[], object], reps: int) -> list[float]:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def _median_time(fn: Callable[[], object], reps: int) -> float:
    return float(np.median(_times(fn, reps)))


def _reps(first: float, most: int, budget: float) -> int:
    """Repetitions of a measurement whose first run took ``first`` seconds: ``most``, fewer where they would
    take longer than ``budget`` seconds, never under 3 (a median needs them)."""
    return max(3, min(most, int(budget / max(first, 1e-9))))


def busy(times: list[float]) -> bool:
    """Repetitions of one measurement that disagree: most of them well above the fastest (a busy machine).

    Steps under a millisecond are not judged: their jitter is the timer's, not the machine's load.
    """
    fastest, typical = min(times), float(np.percentile(times, 75))
    return typical > STALE_FLOOR and typical > BUSY_SPREAD * fastest


def others_running(path: Path = Path("/proc/loadavg"), samples: int = 9, interval: float = 0.01) -> Optional[float]:
    """How many other tasks are runnable on this machine right now (median of a few looks at Linux's
    ``/proc/loadavg``), or None where that cannot be read."""
    counts = []
    for i in range(samples):
        try:
            running = int(path.read_text().split()[3].split("/")[0])
        except (OSError, IndexError, ValueError):
            return None
        counts.append(running - 1)  # this process, reading
        if i + 1 < samples:
            time.sleep(interval)
    return float(np.median(counts))


def contended(threads: int) -> bool:
    """Whether other programs want more of the CPU than a measurement at ``threads`` threads leaves them.

    Repetitions that agree can still all be slow: a process that keeps one core
    busy for the whole measurement slows every repetition alike, and makes
    fewer threads look best.
    """
    others = others_running()
    return others is not None and others + threads > (os.cpu_count() or 1)


def _beaten(chosen: float, rival: float) -> bool:
    """A rival count's fresh time clearly under the chosen count's (not by a timer's jitter)."""
    return rival < BEATEN * chosen and chosen - rival > STALE_FLOOR


def _stale(cached: float, fresh: float) -> bool:
    """A fresh time that the cached one no longer describes (off by more than the noise of a few steps)."""
    return abs(fresh - cached) > max(STALE_TOLERANCE * cached, STALE_FLOOR)


def step_seconds(target: Model, threads: Optional[int] = None, reps: int = 3) -> float:
    """A fresh single-step time of the target (at ``threads``, then back), median of ``reps``; empties its cache."""
    return _fresh_seconds(target, 1, threads, reps)


def batch_seconds(target: Model, threads: Optional[int] = None, reps: int = 3) -> float:
    """A fresh time of one verification batch of ``AUTO_KMAX + 1`` tokens (at ``threads`` threads for batches,
    then back), median of ``reps``; empties the target's cache."""
    return _fresh_seconds(target, AUTO_KMAX + 1, threads, reps)


def _fresh_seconds(target: Model, n: int, threads: Optional[int], reps: int) -> float:
    """Median seconds of evaluating ``n`` tokens after a short context, ``threads`` set for that shape."""
    base = target.tokenize(_CALIBRATION_TEXT, add_special=False)
    ctx = (base * 2)[: min(16, target.n_ctx - n - 1)]  # short: a step barely depends on it, and prefill is dear
    probe = (base * 2)[:n]
    was = target.n_threads, target.n_threads_batch
    if threads is not None:
        target.set_threads(*((threads, was[1]) if n == 1 else (was[0], threads)))
    target.reset()
    target.eval(ctx, logits="none")
    target.checkpoint()  # a recurrent state goes back to the context by a restore, not a replay

    def step() -> None:
        target.eval(probe, logits="last" if n == 1 else "all")
        target.truncate(len(ctx))

    try:
        step()  # warm-up
        return _median_time(step, reps)
    finally:
        target.set_threads(*was)
        target.reset()


def measure(target: Model, draft: Optional[Model], kmax: int = AUTO_KMAX, reps: int = 5,
            context_tokens: int = 128, head: Optional[MtpHead] = None) -> CostProfile:
    """Time verification of 1..kmax+1 tokens on the target, one draft step, and one step of the target's
    MTP head (``head``).

    A verification of n tokens is timed with the cut back a round then makes
    (to the first of them), so on a recurrent memory it includes a rollback,
    or a checkpoint's restore and a token evaluated again; the checkpoint's
    saving, which a drafting round pays first, is the profile's ``rollback``.

    Runs after a context of ``context_tokens`` tokens (a typical prompt), with
    warm caches, like a real round. ``reps`` passes over every n (fewer, not
    under 3, where they would take over ``MEASURE_SECONDS``), alternating
    upwards and downwards so drift hits all n alike; each n takes the median.
    Leaves both caches holding that calibration context. The profile's
    ``source`` is "measured, busy" when other programs wanted the CPU (see
    ``contended``) or the single-step repetitions disagreed (see ``busy``).
    """
    base = target.tokenize(_CALIBRATION_TEXT, add_special=False)
    context_tokens = max(1, min(context_tokens, target.n_ctx - (kmax + 1)))  # a small context holds it all
    ctx = (base * (context_tokens // len(base) + 1))[:context_tokens]
    probe = (base * 2)[: kmax + 1]

    def run(model: Model, n: int) -> None:
        model.eval(probe[:n], logits="all")
        model.truncate(len(ctx))

    def verify_once(n: int) -> float:
        t0 = time.perf_counter()
        target.eval(probe[:n], logits="all")
        target.truncate(len(ctx) + 1)  # as a round that kept none of its draft: all but the first token go
        seconds = time.perf_counter() - t0
        target.truncate(len(ctx))
        return seconds

    crowded = contended(max(target.n_threads, target.n_threads_batch))
    target.truncate(0)
    target.eval(ctx, logits="none")
    target.checkpoint()  # a recurrent state goes back to the context by a restore, not a replay
    # warm-up: buffers sized for the largest batch, and the single-token graph; a pass over every n costs
    # about their mean, n times over
    ends = [_times(functools.partial(run, target, n), 1)[0] for n in (kmax + 1, 1)]
    reps = _reps(sum(ends) / 2 * (kmax + 1), reps, MEASURE_SECONDS)
    sizes = list(range(1, kmax + 2))
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for rep in range(reps):
        for n in sizes if rep % 2 == 0 else sizes[::-1]:
            times[n].append(verify_once(n))
    verify = [float(np.median(times[n])) for n in sizes]
    # Costs must not fall with n. Noise is mostly upward spikes (scheduling, a cold graph), so
    # each n takes the cheapest time seen for any n at least as large, not the dearest below it.
    verify = [float(v) for v in np.minimum.accumulate(verify[::-1])[::-1]]
    step = 0.0
    if draft is not None:
        draft.truncate(0)
        draft.eval(ctx, logits="none")
        draft.checkpoint()
        run(draft, 1)
        step = _median_time(lambda: run(draft, 1), 2 * reps + 1)
    lookup = PromptLookupDrafter()
    arr = np.asarray(ctx, dtype=np.int32)
    rng = np.random.default_rng(0)
    lookup_cost = _median_time(lambda: lookup.propose(arr, kmax, rng), 20)
    saving = 0.0 if target.can_undo(kmax) else _median_time(lambda: target.checkpoint(refresh=True), 2 * reps + 1)
    return CostProfile(verify, step, lookup_cost, "measured, busy" if crowded or busy(times[1]) else "measured",
                       mtp_step=_head_step(head, reps) if head is not None else 0.0, rollback=saving)


def _head_step(head: MtpHead, reps: int) -> float:
    """Seconds for one token of the MTP head after the target's cache (the head caught up first)."""
    last = int(head.target.tokens[-1])
    head.target.truncate(head.target.n_past - 1)
    head.catch_up()

    def greedy(logits: np.ndarray) -> tuple[int, None]:
        return int(np.argmax(logits)), None

    head.draft(last, 1, greedy)  # warm-up
    return _median_time(lambda: head.draft(last, 1, greedy), 2 * reps + 1)


def measure_threads(target: Model, max_threads: int,
                    steps: int = 7) -> tuple[dict[int, float], dict[int, float], bool]:
    """Seconds per single-token step, and per verification batch of ``AUTO_KMAX + 1`` tokens, of the
    target at 1..max_threads threads (medians of ``steps``), and whether the machine was busy
    (see ``contended`` and ``busy``).

    Leaves the target at the thread counts it had, with an empty cache.
    """
    base = target.tokenize(_CALIBRATION_TEXT, add_special=False)
    ctx = (base * 4)[: min(128, target.n_ctx - AUTO_KMAX - 2)]
    batch = (base * 2)[: AUTO_KMAX + 1]
    was = target.n_threads, target.n_threads_batch
    step_times: dict[int, float] = {}
    batch_times: dict[int, float] = {}
    target.reset()
    target.eval(ctx, logits="none")
    target.checkpoint()  # a recurrent state goes back to the context by a restore, not a replay

    def run(tokens: list[int]) -> None:
        target.eval(tokens, logits="all")
        target.truncate(len(ctx))

    noisy = contended(max_threads)
    try:
        for n in range(1, max_threads + 1):
            target.set_threads(n, n)
            for tokens, out in ((base[:1], step_times), (batch, batch_times)):
                first = _times(functools.partial(run, tokens), 1)[0]  # warm-up at this thread count and shape
                times = _times(functools.partial(run, tokens), _reps(first, steps, SWEEP_SHAPE_SECONDS))
                out[n] = float(np.median(times))
                noisy = noisy or busy(times)
    finally:
        target.set_threads(*was)
        target.reset()
    return step_times, batch_times, noisy


def _read_store(path: Path) -> dict[str, dict]:
    if path.is_file():
        try:
            store = json.loads(path.read_text())
            return store if isinstance(store, dict) else {}
        except (OSError, ValueError):
            pass  # a damaged cache is just re-measured
    return {}


def _save_store(path: Path, store: dict[str, dict], notify: Optional[Callable[[str], None]]) -> None:
    """Cache measurements; a cache that cannot be written only means measuring again next time."""
    try:
        write_atomic(path, json.dumps(store, indent=1))
    except OSError as exc:
        if notify is not None:
            notify(f"localspec: could not cache the measurement in {path} ({exc.strerror or exc}); "
                   "it will be measured again next time.")


def _store_path(cache_file: Optional[Path]) -> Path:
    return cache_file or cache_dir() / "calibration.json"


def forget(target: Model, draft: Optional[Model], kmax: int = AUTO_KMAX, cache_file: Optional[Path] = None,
           head: bool = False) -> bool:
    """Drop the cached profile for these models and settings, so the next load measures again."""
    path = _store_path(cache_file)
    store = _read_store(path)
    if store.pop(calibration_key(target, draft, kmax, head), None) is None:
        return False
    _save_store(path, store, None)
    return True


def calibrate(target: Model, draft: Optional[Model], kmax: int = AUTO_KMAX, refresh: bool = False,
              cache_file: Optional[Path] = None, notify: Optional[Callable[[str], None]] = None,
              step: Optional[float] = None, head: Optional[MtpHead] = None) -> CostProfile:
    """The cached cost profile for these models and settings, measuring it if needed.

    Measuring leaves both models' caches empty.

    Args:
        refresh: measure again even if a cached profile exists.
        cache_file: JSON file of profiles (default: ``calibration.json`` in the cache dir).
        notify: told in one line when a measurement starts.
        step: a single-step time just measured at the target's threads (``ThreadChoice.checked``):
            it confirms a cached profile instead of a few more steps.
        head: the target's MTP head, whose step is measured too.
    """
    say = notify or (lambda _: None)
    path = _store_path(cache_file)
    key = calibration_key(target, draft, kmax, head is not None)
    store = _read_store(path)
    if not refresh and key in store:
        rec = store[key]
        then, now = rec["verify"][0], step if step is not None else step_seconds(target)  # still holds?
        if not _stale(then, now):
            cached = CostProfile(rec["verify"], rec["draft_step"], rec["lookup"], "cache",
                                 mtp_step=rec.get("mtp_step", 0.0), rollback=rec.get("rollback", 0.0),
                                 together=rec.get("together", []))
            if len(cached.together) >= min(target.n_seq, TOGETHER_MOST) or target.n_seq < 2:
                return cached
            profile = dataclasses.replace(cached, together=measure_together(target, TOGETHER_MOST))
            _save_store(path, {**_read_store(path), key: {**rec, "together": profile.together}}, notify)
            return profile
        say(f"localspec: the cached cost profile no longer holds (a step takes {1000 * now:.1f} ms, "
            f"{1000 * then:.1f} ms when measured); measuring again")
    else:
        say("localspec: measuring this machine's costs for auto mode (a few seconds, once per models and "
            "settings; `localspec calibrate` shows them)")
    profile = measure(target, draft, kmax, head=head)
    target.reset()
    profile.together = measure_together(target, TOGETHER_MOST)  # where the target holds several sequences
    if draft is not None:
        draft.reset()
    if profile.source.endswith("busy"):
        say(f"localspec: the machine looked busy while measuring auto's costs ({_BUSY_WHY}){_KEPT}; real rounds "
            "correct them meanwhile")
    store = _read_store(path)  # another process may have added profiles meanwhile
    store[key] = {"verify": profile.verify, "draft_step": profile.draft_step, "lookup": profile.lookup,
                  "mtp_step": profile.mtp_step, "rollback": profile.rollback, "together": profile.together,
                  "target": str(target.path), "draft": str(draft.path) if draft else None,
                  "busy": profile.source.endswith("busy"),
                  "threads": target.n_threads, "gpu_layers": target.n_gpu_layers, "measured_at": time.time()}
    _save_store(path, store, notify)
    return profile
