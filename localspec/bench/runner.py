"""Running the suite: every prompt x method x repetition, interleaved, from empty caches."""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Protocol, Sequence

from ..api import Pair
from ..drafting.costs import CostProfile
from ..drafting.history import HistoryStore
from ..errors import ConfigError
from ..events import GenerationStats
from ..methods import AUTO, PLAIN, REGISTRY
from ..options import GenerationOptions
from .exactness import TIE_MARGIN, batch_noise
from .machine import machine_info
from .peers import PEER_METHODS, PeerRunner
from .records import BenchReport, Run
from .structured import Prepared, prepare
from .suite import BenchPrompt, MethodSpec, rotation
from .summary import summarise, widest_interval


@dataclass(frozen=True)
class Precision:
    """Run more repetitions until the ratios are known this well, or the time is spent.

    Attributes:
        width: stop a prompt once every one of its ratios has a 95% interval narrower than this share of
            the ratio (0.04: about plus or minus 2%).
        budget_seconds: wall-clock time for the repetitions beyond the least number; each prompt may start
            another rotation until its share of it, and what an earlier prompt left over, is spent.
        max_reps: repetitions per prompt at most.
    """

    width: float
    budget_seconds: float
    max_reps: int = 40

    #: Repetitions before the width is first judged: an interval from two or three is itself too unsure
    #: (stopping whenever one happens to look narrow would make the intervals too narrow).
    min_reps = 5


def run_bench(
    pair: Pair,
    prompts: Sequence[BenchPrompt],
    methods: Sequence[MethodSpec],
    *,
    reps: int = 3,
    max_tokens: int = 128,
    temperatures: Sequence[float] = (0.0,),
    top_p: float = 1.0,
    progress: Optional[Callable[[str], None]] = None,
    checksums: bool = True,
    precision: Optional[Precision] = None,
    on_prompt: Optional[Callable[[str, int, float], None]] = None,
    lockstep: bool = False,
) -> BenchReport:
    """Measure every method on every prompt; see the module docstring.

    Args:
        pair: loaded models (loaded once for the whole run).
        prompts: the suite.
        methods: must start with plain (the reference).
        reps: repetitions per method, interleaved.
        max_tokens: tokens per generation.
        temperatures: 0 for greedy (checked for exactness); others sample with seed = repetition.
        top_p: nucleus mass for the sampled runs (localspec's and the peers').
        progress: called once per generation with a short description.
        checksums: hash the model files for the report.
        precision: with it, more repetitions follow the first ``reps`` (at least ``Precision.min_reps``),
            one rotation of every method at a time, until each prompt's intervals are narrow enough.
        on_prompt: called after each prompt with its name, its repetitions and its widest interval.
        lockstep: run a repetition's methods side by side, a token of each in turn (see ``lockstep``), each
            localspec method on models of its own (loaded once more for every one after the first), so that
            a burst of load on a shared machine slows them alike and their ratio keeps its value.

    Raises:
        ConfigError: a first method other than plain, draft methods without a draft model, or (lockstep) a
            row given twice.
    """
    if not methods or methods[0].method != PLAIN.name:
        raise ConfigError("The first bench method must be plain: it is the reference for speedups.")
    if pair.draft is None and any(getattr(REGISTRY.find(m.method), "needs_draft", False) for m in methods):
        raise ConfigError("Draft-model methods need a draft model (--draft).")
    peer_rows = any(m.method in PEER_METHODS for m in methods)
    if lockstep and len(set(methods)) < len(methods):
        raise ConfigError("In lockstep every row runs on models of its own: give each row once.")
    # template, tokenizer and constraints once, before any measuring: a prompt the target cannot take fails now
    prepared = {bp.name: prepare(pair, bp, peers=peer_rows) for bp in prompts}
    profile = pair.calibrate()
    noise = batch_noise(pair.target, prepared[prompts[0].name].tokens)
    report = BenchReport(profile={"source": profile.source, **profile.relative(),
                                  "step_seconds": profile.verify[0], "batch_noise": noise,
                                  "tie_margin": max(TIE_MARGIN, 2 * noise)},
                         settings={"reps": reps, "max_tokens": max_tokens, "temperatures": list(temperatures),
                                   "precision": None if precision is None else dataclasses.asdict(precision),
                                   "top_p": top_p, "methods": [m.label for m in methods], "lockstep": lockstep})
    constrained = sorted(name for name, p in prepared.items() if p.grammar is not None)
    if constrained:
        report.settings["constrained"] = constrained
    runs: list[Run] = []
    peers = PeerRunner(pair.target) if peer_rows else None
    if peers is not None:
        report.settings["peer"] = {"library": "llama-cpp-python Llama.generate", **peers.settings}
    # Auto runs with an empty history store of its own, emptied before each run: no repetition learns
    # from another's output. The pair's cost correction does carry over, as it does for a user: auto is
    # measured as it runs after a few generations on this machine.
    extra = 0.0  # seconds spent on repetitions beyond the least number, all prompts so far
    shares = len(temperatures) * len(prompts)  # the budget is shared out per prompt and temperature
    ours = [m for m in methods if m.method not in PEER_METHODS]
    pairs = {m: pair for m in ours}
    try:
        if lockstep:  # the first (plain) on the pair itself, every other method on a copy, with the same costs
            for m in ours[1:]:
                pairs[m] = _twin(pair, profile, m)
        # auto's empty history: the pair's, and in lockstep one for each copy
        with scratch_stores(pair, *(f"empty-{i}" for i in range(len(ours) if lockstep else 1))) as empties:
            for m, store in zip(ours[1:], empties[1:], strict=False):  # none one after another
                pairs[m].set_history(store)
            session = _Session(pairs, peers, empties, methods, max_tokens, top_p, progress, lockstep)
            for ti, temperature in enumerate(temperatures):
                for pi, bp in enumerate(prompts):
                    # this prompt's share of the budget, and what the earlier prompts left of theirs
                    allowance = (precision.budget_seconds * (ti * len(prompts) + pi + 1) / shares - extra
                                 if precision is not None else 0.0)
                    mine, spent = session.measure(bp, prepared[bp.name], temperature, reps, precision, allowance,
                                                  warm_all=pi == 0)
                    extra += spent
                    runs += mine
                    if on_prompt:
                        on_prompt(bp.name, 1 + max(r.rep for r in mine), widest_interval(mine))
    finally:
        if peers is not None:
            peers.close()
        for twin in pairs.values():
            if twin is not pair:
                twin.close()
    report.rows = summarise(pair, {name: p.tokens for name, p in prepared.items()}, runs, profile,
                            max(TIE_MARGIN, 2 * noise),
                            {name: p.grammar for name, p in prepared.items() if p.grammar is not None})
    report.mismatches = sum(row.exactness == "MISMATCH" or row.exactness_peer == "MISMATCH" for row in report.rows)
    report.machine = machine_info(pair, checksums)
    return report


def _twin(pair: Pair, profile: CostProfile, spec: MethodSpec) -> Pair:
    """A second pair over the same files, settings and costs, with caches of its own, for ``spec``'s row (the
    draft model too where the row may run it)."""
    method = REGISTRY.get(spec.method)
    target = pair.target.reopen()
    try:
        draft = pair.draft.reopen() if pair.draft is not None and (method.needs_draft or method is AUTO) else None
    except BaseException:
        target.close()
        raise
    twin = Pair(target, draft, defaults=pair.defaults, draft_k=pair.draft_k, notify=pair.notify)
    twin.set_profile(profile)
    return twin


@dataclass
class _Session:
    """What every prompt's repetitions share: the models (each localspec method's pair), the peer, the empty
    history stores auto drafts from, the settings."""

    pairs: dict[MethodSpec, Pair]
    peers: Optional[PeerRunner]
    empty: Sequence[HistoryStore]
    methods: Sequence[MethodSpec]
    max_tokens: int
    top_p: float
    progress: Optional[Callable[[str], None]]
    lockstep: bool = False

    def measure(self, bp: BenchPrompt, prompt: Prepared, temperature: float, reps: int,
                precision: Optional[Precision], allowance: float, warm_all: bool) -> tuple[list[Run], float]:
        """One prompt's runs: ``reps`` rotations of the methods, then more while ``precision`` asks for them
        and ``allowance`` seconds are not spent on them; the runs, and the seconds the extra ones took."""
        runs: list[Run] = []
        least = reps if precision is None else max(reps, min(precision.min_reps, precision.max_reps))
        for rep in range(least):
            runs += self.repetition(bp, prompt, temperature, rep, warm_all)
        extra_from = time.monotonic()
        rep = least
        while (precision is not None and rep < precision.max_reps and time.monotonic() < extra_from + allowance
               and widest_interval(runs) > precision.width):
            runs += self.repetition(bp, prompt, temperature, rep, warm_all)
            rep += 1
        return runs, time.monotonic() - extra_from

    def repetition(self, bp: BenchPrompt, prompt: Prepared, temperature: float, rep: int,
                   warm_all: bool) -> list[Run]:
        """Repetition ``rep`` of every method, in the order ``rotation`` gives it (the first one warmed up),
        one after another, or in lockstep."""
        order = rotation(self.methods, rep)
        warm = [spec for spec in order if rep == 0 and (spec == self.methods[0] or warm_all)]  # the rest: once
        if self.lockstep:
            for spec in warm:
                self._warm_up(prompt, spec, temperature)
            for store in self.empty:
                store.clear()
            started = [start(self.pairs.get(spec), self.peers, prompt, spec, temperature, rep, self.max_tokens,
                             self.top_p) for spec in order]
            try:
                lockstep(started)
            finally:  # on an error, the runs still under way end before their models can be closed
                for run in started:
                    run.close()
            outcomes = [run.outcome() for run in started]
        else:
            outcomes = []
            for spec in order:
                if spec in warm:
                    self._warm_up(prompt, spec, temperature)
                self.empty[0].clear()
                outcomes.append(generate(self.pairs.get(spec), self.peers, prompt, spec, temperature, rep,
                                         self.max_tokens, self.top_p))
                if self.progress:
                    self.progress(f"{bp.name} {spec.label}")
        if self.lockstep and self.progress:
            for spec in order:
                self.progress(f"{bp.name} {spec.label}")
        return [Run(bp.name, bp.category, spec.method, spec.k, rep, temperature, out, stats.to_dict(), spec.history)
                for spec, (out, stats) in zip(order, outcomes, strict=True)]

    def _warm_up(self, prompt: Prepared, spec: MethodSpec, temperature: float) -> None:
        generate(self.pairs.get(spec), self.peers, prompt, spec, temperature, 0, min(16, self.max_tokens), self.top_p)


class Running(Protocol):
    """A generation under way, advanced a token at a time."""

    def advance(self) -> bool:
        """Decide the next token (the first: process the prompt too); False once the generation has ended."""

    def outcome(self) -> tuple[list[int], GenerationStats]:
        """The tokens and stats so far."""

    def close(self) -> None:
        """End the generation where it is (nothing, once it has ended)."""


def lockstep(runs: Sequence[Running]) -> None:
    """Advance every run a token at a time, in turn, until all have ended.

    Each run times only its own steps, so what slows the machine for a few seconds (another program, a
    neighbour on the host) falls on every run alike, within a step or two of each other: the ratio of their
    speeds is measured far more tightly than from runs one after another. A run that ends early leaves the
    others to go on by themselves.
    """
    going = list(runs)
    while going:
        going = [run for run in going if run.advance()]


class _OurRun:
    """One of localspec's generations under way (see ``Running``), from empty caches."""

    def __init__(self, pair: Pair, tokens: list[int], opts: GenerationOptions):
        pair.reset()
        self._stream = pair.stream(tokens, opts)
        self._events = iter(self._stream)

    def advance(self) -> bool:
        return next(self._events, None) is not None

    def outcome(self) -> tuple[list[int], GenerationStats]:
        r = self._stream.result
        return r.tokens, r.stats

    def close(self) -> None:
        self._events.close()  # the stream's own cleanup: both caches left consistent


def prompt_tokens(pair: Pair, bp: BenchPrompt) -> list[int]:
    """The token ids of a prompt that decodes freely (the related workload's, a recording's).

    Raises:
        ConfigError: the prompt gives a constraint, which only the suite bench decodes under.
    """
    if bp.response_format is not None or bp.tools is not None:
        raise ConfigError(f"{bp.name} gives a response_format or tools, which the related workload and the "
                          "recordings do not decode under; run it with `localspec bench --suite FILE`.")
    return prepare(pair, bp, peers=False).tokens


def generate(pair: Optional[Pair], peers: Optional[PeerRunner], prompt: Prepared, spec: MethodSpec,
             temperature: float, seed: int, max_tokens: int, top_p: float) -> tuple[list[int], GenerationStats]:
    """One timed generation of ``spec`` from empty caches: its tokens and stats."""
    return _finish(start(pair, peers, prompt, spec, temperature, seed, max_tokens, top_p))


def _finish(run: Running) -> tuple[list[int], GenerationStats]:
    """``run`` advanced to its end (closed on an error): its tokens and stats."""
    try:
        while run.advance():
            pass
    finally:
        run.close()
    return run.outcome()


def start(pair: Optional[Pair], peers: Optional[PeerRunner], prompt: Prepared, spec: MethodSpec,
          temperature: float, seed: int, max_tokens: int, top_p: float) -> Running:
    """A generation of ``spec`` from empty caches, to be advanced a token at a time (``pair``: a localspec
    method's models; ``peers``: llama-cpp-python's)."""
    top_p = top_p if temperature > 0 else 1.0
    if spec.method in PEER_METHODS:
        assert peers is not None
        return peers.start(spec.method, spec.k, prompt.tokens, temperature, seed, max_tokens, top_p,
                           grammar=prompt.peer_grammar)
    assert pair is not None
    method = REGISTRY.get(spec.method)
    return _OurRun(pair, prompt.tokens, GenerationOptions(
        max_tokens=max_tokens, method=spec.method, k=spec.k, temperature=temperature, top_p=top_p, seed=seed,
        history=spec.history and method.uses_history, grammar=prompt.grammar, logit_bias=prompt.logit_bias))


def fresh_generate(pair: Pair, tokens: list[int], opts: GenerationOptions) -> tuple[list[int], GenerationStats]:
    """Generate from empty caches: every run prefills the whole prompt, so no run inherits another's work."""
    return _finish(_OurRun(pair, tokens, opts))


@contextlib.contextmanager
def scratch_stores(pair: Pair, *names: str) -> Iterator[list[HistoryStore]]:
    """Empty history stores in a temporary directory, one per name; the pair's own setting comes back after.

    The user's store is neither used nor changed by a bench.
    """
    with tempfile.TemporaryDirectory(prefix="localspec-bench-") as scratch:
        stores = [HistoryStore(pair.target.path, directory=Path(scratch) / name) for name in names]
        saved = pair.set_history(stores[0])
        try:
            yield stores
        finally:
            pair.set_history(saved)
