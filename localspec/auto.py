"""Auto mode: choose prompt lookup, history, the draft model or plain decoding, and K, each round.

The choice maximises expected tokens per second under a cost model:

* the machine's costs come from a **calibration**: the target's time to
  verify 1..Kmax+1 tokens and the draft model's time per step, measured with
  the pair's real settings and cached per (model files, llama-cpp-python
  version, device, threads, GPU layers);
* each method's per-token acceptance alpha is **estimated online** with a
  prior (from a look at the prompt) and exponential decay, separately for
  lookup matches of each n-gram length and history matches of each length
  band (history's estimates outlive one generation: the pair keeps them).
  Lookup and history are also scored in rounds they sit out: their first
  guess is compared with the token the target chose, which costs nothing,
  so a guesser that starts to pay is noticed at once;
* with acceptance alpha and draft length K, a round yields on average
  (1 - alpha^(K+1)) / (1 - alpha) tokens (the accepted prefix plus the
  target's own token) and costs verify(K+1) plus K draft steps (draft model)
  or the search (lookup, history); plain decoding yields 1 token per verify(1).

On a compute-bound CPU, verify(K+1) grows almost linearly with K, so only a
well-matched lookup pays; on a memory-bound GPU verify(K+1) ~ verify(1) and
long drafts win. Auto only chooses what to propose: acceptance is unchanged,
so the output stays exactly the target's.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from .backend import Model, default_threads, gpu_offload_supported
from .drafters import EMPTY_DRAFT, Draft, ModelDrafter, PromptLookupDrafter
from .history import HistoryDrafter, HistoryIndex
from .options import AUTO_KMAX, SamplingParams
from .paths import cache_dir, write_atomic

KMAX = AUTO_KMAX
#: Bumped whenever ``measure`` or what it measures changes (3: huge pages for the model buffers),
#: so profiles measured the old way are measured again.
CALIBRATION_VERSION = 3
#: Speculate only when the predicted speedup clears this, so estimation noise cannot make auto slower than plain.
MIN_GAIN = 1.1
_CALIBRATION_TEXT = (
    "def merge(a, b):\n    out = []\n    i = j = 0\n    while i < len(a) and j < len(b):\n"
    "        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n        else:\n"
    "            out.append(b[j]); j += 1\n    return out + a[i:] + b[j:]\n"
    "The quick brown fox jumps over the lazy dog while the committee reviews the report. "
)


@dataclass
class CostProfile:
    """Measured (or assumed) costs, in seconds.

    Attributes:
        verify: verify[n - 1] is the target's time to evaluate n tokens with
            logits for all of them, n = 1 .. kmax + 1.
        draft_step: the draft model's time for one token (0 without a draft).
        lookup: the prompt-lookup search time per round.
        source: "measured", "cache" or a name for a synthetic profile.
    """

    verify: list[float]
    draft_step: float = 0.0
    lookup: float = 2e-5
    source: str = "measured"

    @property
    def kmax(self) -> int:
        return len(self.verify) - 1

    def relative(self) -> dict[str, object]:
        """Costs relative to one target step (what decides everything)."""
        v1 = self.verify[0]
        return {"verify": [round(v / v1, 3) for v in self.verify], "draft_step": round(self.draft_step / v1, 3)}

    @classmethod
    def synthetic(cls, verify_ratios: list[float], draft_ratio: float, step: float = 0.02,
                  name: str = "synthetic") -> CostProfile:
        """A profile from ratios to one target step, e.g. a GPU-like flat verify curve."""
        return cls([r * step for r in verify_ratios], draft_ratio * step, 2e-5, name)


def expected_tokens(alpha: float, k: int) -> float:
    """Mean tokens per round with per-token acceptance alpha and draft length k."""
    if k == 0:
        return 1.0
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def round_cost(profile: CostProfile, method: str, k: int) -> float:
    """Seconds for one round of ``method`` with draft length k."""
    if method == "plain" or k == 0:
        return profile.verify[0]
    extra = k * profile.draft_step if method == "draft" else profile.lookup  # lookup and history: a search
    return profile.verify[k] + extra


def best_k(profile: CostProfile, method: str, alpha: float, kmax: int,
           min_gain: float = MIN_GAIN) -> tuple[int, float]:
    """The draft length with the highest expected tokens/second, and that speedup over plain.

    K = 0 (plain, speedup 1.0) unless some K is predicted at least ``min_gain`` times faster.
    """
    plain = 1.0 / profile.verify[0]
    best, best_speed = 0, 1.0
    threshold = min_gain
    for k in range(1, min(kmax, profile.kmax) + 1):
        speed = expected_tokens(alpha, k) / round_cost(profile, method, k) / plain
        if speed > best_speed and speed >= threshold:
            best, best_speed = k, speed
    return best, best_speed


class AcceptanceEstimate:
    """Per-token acceptance alpha from decayed counts of kept tokens and rejections.

    A round that drafts K tokens and keeps ``kept`` contributes ``kept``
    successes and one failure if kept < K: the maximum-likelihood estimate
    of a geometric acceptance truncated at K. Old evidence fades by
    ``decay`` per drafted token, so the estimate spans the last ~1/(1-decay)
    guesses whatever K was.
    """

    def __init__(self, prior_alpha: float, prior_weight: float = 2.0, decay: float = 0.95):
        self.kept = prior_alpha * prior_weight
        self.rejected = (1.0 - prior_alpha) * prior_weight
        self.decay = decay

    @property
    def alpha(self) -> float:
        total = self.kept + self.rejected
        return self.kept / total if total > 0 else 0.0

    def update(self, drafted: int, kept: int) -> None:
        fade = self.decay ** drafted
        self.kept = self.kept * fade + kept
        self.rejected = self.rejected * fade + (1.0 if kept < drafted else 0.0)

    def shrink(self, weight: float) -> None:
        """Keep alpha but count the evidence as at most ``weight`` guesses, so new evidence moves it fast."""
        total = self.kept + self.rejected
        if total > weight:
            self.kept *= weight / total
            self.rejected *= weight / total


_COPY_CUES = re.compile(
    r"\b(rewrite|rephrase|fix|correct|edit|modify|refactor|rename|update|change|quote|copy|repeat|"
    r"return the (full|whole|complete|modified|updated)|keep(ing)? (everything|the rest))\b",
    re.IGNORECASE,
)


def prompt_prior(text: str, prompt_tokens: np.ndarray) -> float:
    """Prior acceptance for prompt lookup from a cheap look at the prompt.

    Copy-heavy requests (rewrite, edit, quote...) over a long supplied text
    make the answer repeat the prompt; otherwise lookup mostly finds
    incidental matches.
    """
    copy_request = bool(_COPY_CUES.search(text))
    long_material = len(prompt_tokens) > 120
    if copy_request and long_material:
        return 0.7
    if copy_request or long_material:
        return 0.45
    return 0.25


@dataclass
class AutoReport:
    """What auto did in one generation, for stats."""

    rounds: dict[str, int] = field(default_factory=lambda: {"plain": 0, "lookup": 0, "history": 0, "draft": 0})
    #: Each change of choice: round number, method, k, alpha it acted on, predicted speedup.
    changes: list[dict[str, object]] = field(default_factory=list)
    alpha: dict[str, float] = field(default_factory=dict)
    profile: dict[str, object] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


# (predicted speedup, method, k, alpha, its estimate, the lookup or history draft)
_Choice = tuple[float, str, int, float, Optional[AcceptanceEstimate], Draft]

#: History matches are weighed by length band: 2-3, 4-7, 8-15 and 16 or more tokens.
HISTORY_BANDS = (2, 4, 8, 16)
#: Prior acceptance per band: a long match in earlier output is usually followed the same way. (Replaying
#: the related-requests workload gave per-token acceptance 0.74, 0.82, 0.88 and 0.96 by band; the priors
#: stay below that, since other workloads repeat less.)
HISTORY_PRIORS = (0.45, 0.6, 0.75, 0.9)
#: What one generation carries over of the estimates the last ones learned, in guesses: a new request may
#: be about something else, and two or three wasted history rounds should be enough to notice.
HISTORY_CARRY_WEIGHT = 4.0


def history_band(match: int) -> int:
    """The length band of a history match (an index into HISTORY_BANDS)."""
    return sum(match >= lo for lo in HISTORY_BANDS[1:])


def history_estimates() -> dict[int, AcceptanceEstimate]:
    """Fresh acceptance estimates for history matches, one per band (a pair keeps them across generations)."""
    return {i: AcceptanceEstimate(p) for i, p in enumerate(HISTORY_PRIORS)}


class AutoDrafter:
    """A drafter that picks lookup, history, the draft model, or nothing (plain) each round.

    Args:
        profile: the machine's costs (see ``calibrate``).
        lookup: the prompt-lookup drafter.
        model: the draft-model drafter, or None.
        kmax: the longest draft considered.
        lookup_prior: prior acceptance for lookup (see ``prompt_prior``).
        explore_every: at most one exploratory round per this many rounds,
            to re-check a method the estimates have ruled out.
        history: the history drafter, or None.
        history_alpha: its estimates by match band (see ``history_estimates``);
            updated in place, so a caller can keep them for the next generation.
    """

    name = "auto"

    def __init__(self, profile: CostProfile, lookup: PromptLookupDrafter, model: Optional[ModelDrafter],
                 kmax: int = KMAX, lookup_prior: float = 0.25, explore_every: int = 32,
                 history: Optional[HistoryDrafter] = None,
                 history_alpha: Optional[dict[int, AcceptanceEstimate]] = None):
        self.profile = profile
        self.lookup = lookup
        self.history = history
        self.history_alpha = history_alpha if history_alpha is not None else history_estimates()
        for est in self.history_alpha.values():
            est.shrink(HISTORY_CARRY_WEIGHT)
        self.kmax = min(kmax, profile.kmax)
        # A draft model that could not pay even if it were always right is never run
        # (nor fed the prompt): on a compute-bound CPU this is the usual case.
        self.draft_viable = model is not None and best_k(profile, "draft", 0.98, self.kmax)[0] > 0
        self.model = model if self.draft_viable else None
        self.models: tuple[Model, ...] = self.model.models if self.model is not None else ()
        self.explore_every = explore_every
        # lookup acceptance depends on the n-gram length of the match (1, 2, 3...)
        self.lookup_alpha = {n: AcceptanceEstimate(min(0.95, lookup_prior + 0.1 * (n - 1)))
                             for n in range(1, lookup.max_ngram + 1)}
        self.draft_alpha = AcceptanceEstimate(0.6)
        self._report = AutoReport(profile=profile.relative())
        self._pending: Optional[tuple[AcceptanceEstimate, str]] = None
        # lookup's and history's unused first guesses in a plain round, scored against the token that came
        self._shadows: list[tuple[AcceptanceEstimate, int, int]] = []
        self._last_tried = {"lookup": 0, "history": 0, "draft": 0}
        self._round = 0
        self._last_choice: Optional[tuple[str, int]] = None

    def prefill(self, context: np.ndarray) -> None:
        if self.model is not None:
            self.model.prefill(context)

    def propose(self, context: np.ndarray, k: int, rng: np.random.Generator) -> Draft:
        """Choose a method and K for this round and return its draft (empty for plain)."""
        self._round += 1
        for shadow_est, shadow_guess, at in self._shadows:
            if len(context) == at + 1:  # exactly the plain round's token was added
                shadow_est.update(1, int(context[-1] == shadow_guess))
        self._shadows = []
        kmax = min(k, self.kmax)
        choices: list[_Choice] = [
            (1.0, "plain", 0, 0.0, None, EMPTY_DRAFT)]
        if kmax > 0:
            guess = self.lookup.propose(context, kmax, rng)
            if guess.tokens:
                lk = self.lookup_alpha[self.lookup.last_match]
                kk, speed = best_k(self.profile, "lookup", lk.alpha, min(kmax, len(guess.tokens)))
                choices.append((speed, "lookup", kk, lk.alpha, lk, guess))
            if self.history is not None:
                recalled = self.history.propose(context, kmax, rng)
                if recalled.tokens:
                    hk = self.history_alpha[history_band(self.history.last_match)]
                    kk, speed = best_k(self.profile, "history", hk.alpha, min(kmax, len(recalled.tokens)))
                    choices.append((speed, "history", kk, hk.alpha, hk, recalled))
            if self.model is not None:
                kk, speed = best_k(self.profile, "draft", self.draft_alpha.alpha, kmax)
                choices.append((speed, "draft", kk, self.draft_alpha.alpha, self.draft_alpha, EMPTY_DRAFT))
        speed, method, kk, alpha, est, draft = max(choices, key=lambda c: c[0])
        if kk == 0:
            method = "plain"
            explored = self._explore(choices)
            if explored is not None:
                speed, method, kk, alpha, est, draft = explored
        if method == "plain":
            self._pending = None
            for choice in choices:
                if choice[1] in ("lookup", "history") and choice[4] is not None:
                    self._shadows.append((choice[4], choice[5].tokens[0], len(context)))
            self._note("plain", 0, alpha, 1.0)
            return EMPTY_DRAFT
        self._last_tried[method] = self._round
        self._note(method, kk, alpha, speed)
        self._pending = (est, method) if est is not None else None
        if method in ("lookup", "history"):
            return Draft(draft.tokens[:kk], None, method)
        assert self.model is not None
        return self.model.propose(context, kk, rng)

    def _explore(self, choices: list[_Choice]) -> Optional[_Choice]:
        """A cheap K=1 round of a method not tried for a while that could pay if alpha were higher."""
        for speed, method, _, alpha, est, draft in choices[1:]:
            stale = self._round - self._last_tried[method] >= self.explore_every
            optimistic = best_k(self.profile, method, min(0.98, alpha + 0.25), 1)[1] > 1.0
            if stale and optimistic:
                return (speed, method, 1, alpha, est, draft)
        return None

    def observe(self, drafted: int, kept: int) -> None:
        """Feedback after verification: update the estimate of the method just used."""
        if self._pending is not None and drafted > 0:
            est, method = self._pending
            est.update(drafted, kept)
        self._pending = None

    def settle(self, context: np.ndarray) -> None:
        if self.model is not None:
            self.model.settle(context)
        self._report.alpha = {"draft": round(self.draft_alpha.alpha, 3)} if self.model else {}
        for n, est in self.lookup_alpha.items():
            self._report.alpha[f"lookup{n}"] = round(est.alpha, 3)
        if self.history is not None:
            for band, est in self.history_alpha.items():
                self._report.alpha[f"history{HISTORY_BANDS[band]}+"] = round(est.alpha, 3)

    def report(self) -> dict[str, object]:
        """Rounds per method, the choices made and the estimates behind them."""
        return self._report.to_dict()

    def _note(self, method: str, k: int, alpha: float, speed: float) -> None:
        self._report.rounds[method] += 1
        if self._last_choice != (method, k):
            self._last_choice = (method, k)
            if len(self._report.changes) < 50:
                self._report.changes.append({"round": self._round, "method": method, "k": k,
                                            "alpha": round(alpha, 3), "predicted_speedup": round(speed, 3)})


# -- calibration -----------------------------------------------------------------------------------


def _file_identity(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"


def threads_key(target: Model) -> str:
    """Identity of what the fastest thread count depends on: the target's setup and the cores.

    Not the draft model: the sweep never runs it, so loading the target alone reuses the answer.
    """
    return _key(["threads", *_setup(target, None), f"cores={default_threads()}"])


def choose_threads(target: Model, refresh: bool = False,
                   cache_file: Optional[Path] = None, notify: Optional[Callable[[str], None]] = None,
                   ) -> tuple[int, dict[int, float]]:
    """The fastest thread count for single-token steps on this machine, measured once and cached.

    Args:
        notify: told in one line when a measurement starts.

    Returns:
        (threads, seconds per step at each thread count tried).
    """
    path = _store_path(cache_file)
    key = threads_key(target)
    rec = _read_store(path).get(key)
    if rec and not refresh:
        return int(rec["threads"]), {int(n): float(t) for n, t in rec["step_seconds"].items()}
    if notify is not None:
        notify("localspec: measuring the fastest thread count for this machine (once; --threads overrides)")
    sweep = measure_threads(target, default_threads())
    best = min(sweep, key=lambda n: sweep[n])
    store = _read_store(path)
    store[key] = {"threads": best, "step_seconds": sweep, "target": str(target.path), "measured_at": time.time()}
    _save_store(path, store, notify)
    return best, sweep


def _setup(target: Model, draft: Optional[Model]) -> list[str]:
    """The model files, library, device and settings every measurement depends on."""
    import llama_cpp

    return [_file_identity(target.path), _file_identity(draft.path) if draft else "-", llama_cpp.__version__,
            "gpu" if gpu_offload_supported() else "cpu", f"ngl={target.n_gpu_layers}", f"fa={target.flash_attn}"]


def _key(parts: list[str]) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:24]


def calibration_key(target: Model, draft: Optional[Model], kmax: int) -> str:
    """Identity of everything a calibration depends on."""
    return _key([*_setup(target, draft), f"threads={target.n_threads}", f"kmax={kmax}",
                 f"calibration={CALIBRATION_VERSION}"])


def _median_time(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def measure(target: Model, draft: Optional[Model], kmax: int = KMAX, reps: int = 5,
            context_tokens: int = 256) -> CostProfile:
    """Time verification of 1..kmax+1 tokens on the target and one draft step.

    Runs after a context of ``context_tokens`` tokens (a typical prompt), with
    warm caches, like a real round. ``reps`` passes over every n, alternating
    upwards and downwards so drift hits all n alike; each n takes the median.
    Leaves both caches holding that calibration context.
    """
    base = target.tokenize(_CALIBRATION_TEXT, add_special=False)
    context_tokens = max(1, min(context_tokens, target.n_ctx - (kmax + 1)))  # a small context holds it all
    ctx = (base * (context_tokens // len(base) + 1))[:context_tokens]
    probe = (base * 2)[: kmax + 1]

    def run(model: Model, n: int) -> None:
        model.eval(probe[:n], logits="all")
        model.truncate(len(ctx))

    target.truncate(0)
    target.eval(ctx, logits="none")
    for n in (kmax + 1, 1):
        run(target, n)  # warm-up: buffers sized for the largest batch, and the single-token graph
    sizes = list(range(1, kmax + 2))
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for rep in range(reps):
        for n in sizes if rep % 2 == 0 else sizes[::-1]:
            times[n].append(_median_time(lambda n=n: run(target, n), 1))
    verify = [float(np.median(times[n])) for n in sizes]
    # Costs must not fall with n. Noise is mostly upward spikes (scheduling, a cold graph), so
    # each n takes the cheapest time seen for any n at least as large, not the dearest below it.
    verify = [float(v) for v in np.minimum.accumulate(verify[::-1])[::-1]]
    step = 0.0
    if draft is not None:
        draft.truncate(0)
        draft.eval(ctx, logits="none")
        run(draft, 1)
        step = _median_time(lambda: run(draft, 1), 2 * reps + 1)
    lookup = PromptLookupDrafter()
    arr = np.asarray(ctx, dtype=np.int32)
    rng = np.random.default_rng(0)
    lookup_cost = _median_time(lambda: lookup.propose(arr, kmax, rng), 20)
    return CostProfile(verify, step, lookup_cost, "measured")


def measure_threads(target: Model, max_threads: int, steps: int = 7) -> dict[int, float]:
    """Seconds per single-token step of the target at 1..max_threads threads (median of ``steps``).

    Leaves the target at the thread count it had, with an empty cache.
    """
    base = target.tokenize(_CALIBRATION_TEXT, add_special=False)
    ctx = (base * 4)[:128]
    was = target.n_threads
    out: dict[int, float] = {}
    target.reset()
    target.eval(ctx, logits="none")
    try:
        for n in range(1, max_threads + 1):
            target.set_threads(n)

            def step() -> None:
                target.eval(base[:1], logits="last")
                target.truncate(len(ctx))

            step()  # warm-up at this thread count
            out[n] = _median_time(step, steps)
    finally:
        target.set_threads(was)
        target.reset()
    return out


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


def calibrate(target: Model, draft: Optional[Model], kmax: int = KMAX, refresh: bool = False,
              cache_file: Optional[Path] = None, notify: Optional[Callable[[str], None]] = None) -> CostProfile:
    """The cached cost profile for these models and settings, measuring it if needed.

    Measuring leaves both models' caches empty.

    Args:
        refresh: measure again even if a cached profile exists.
        cache_file: JSON file of profiles (default: ``calibration.json`` in the cache dir).
        notify: told in one line when a measurement starts.
    """
    path = _store_path(cache_file)
    key = calibration_key(target, draft, kmax)
    store = _read_store(path)
    if not refresh and key in store:
        rec = store[key]
        return CostProfile(rec["verify"], rec["draft_step"], rec["lookup"], "cache")
    if notify is not None:
        notify("localspec: measuring this machine's costs for auto mode (a few seconds, once per models and "
               "settings; `localspec calibrate` shows them)")
    profile = measure(target, draft, kmax)
    target.reset()
    if draft is not None:
        draft.reset()
    store = _read_store(path)  # another process may have added profiles meanwhile
    store[key] = {"verify": profile.verify, "draft_step": profile.draft_step, "lookup": profile.lookup,
                  "target": str(target.path), "draft": str(draft.path) if draft else None,
                  "threads": target.n_threads, "gpu_layers": target.n_gpu_layers, "measured_at": time.time()}
    _save_store(path, store, notify)
    return profile


def auto_drafter(profile: CostProfile, draft_model: Optional[Model], params: SamplingParams,
                 prompt_text: str, prompt_tokens: np.ndarray, kmax: int = KMAX,
                 history: Optional[HistoryIndex] = None,
                 history_alpha: Optional[dict[int, AcceptanceEstimate]] = None) -> AutoDrafter:
    """An AutoDrafter for one generation, with the lookup prior set from the prompt.

    Args:
        history: the index of earlier generations to draft from (None: no history).
        history_alpha: history's acceptance estimates, kept by the caller across generations.
    """
    model = ModelDrafter(draft_model, params) if draft_model is not None else None
    return AutoDrafter(profile, PromptLookupDrafter(), model, kmax=kmax,
                       lookup_prior=prompt_prior(prompt_text, prompt_tokens),
                       history=HistoryDrafter(history) if history is not None else None,
                       history_alpha=history_alpha)


def predicted_table(profile: CostProfile, has_draft: bool, alphas: tuple[float, ...] = (0.3, 0.5, 0.7, 0.9)) -> str:
    """A readable summary of a profile: relative costs and what auto would choose at each acceptance."""
    rel = profile.relative()
    verify = rel["verify"]
    assert isinstance(verify, list)
    lines = [
        f"cost profile ({profile.source}): one target step {1000 * profile.verify[0]:.1f} ms",
        "  verify n tokens / one step: " + "  ".join(f"{n + 1}:{v:.2f}" for n, v in enumerate(verify)),
    ]
    if has_draft:
        lines.append(f"  draft step / target step: {rel['draft_step']:.2f}")
    lines.append("  predicted speedup over plain (best K) at per-token acceptance alpha:")
    methods = ["lookup"] + (["draft"] if has_draft else [])
    lines.append("    alpha  " + "  ".join(f"{m:>14}" for m in methods))
    for a in alphas:
        cells = []
        for m in methods:
            k, s = best_k(profile, m, a, profile.kmax)
            cells.append(f"{s:5.2f}x (K={k})" if k else "  plain (K=0)")
        lines.append(f"    {a:5.2f}  " + "  ".join(f"{c:>14}" for c in cells))
    return "\n".join(lines)
