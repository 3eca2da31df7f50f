"""Running the suite: every prompt x method x repetition, interleaved, from empty caches."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

from ..api import Pair
from ..engine import GenerationStats
from ..errors import ConfigError
from ..history import HistoryStore
from ..methods import PLAIN, REGISTRY
from ..options import GenerationOptions
from .exactness import TIE_MARGIN, batch_noise
from .machine import machine_info
from .peers import PEER_METHODS, PeerRunner
from .records import BenchReport, Run
from .suite import BenchPrompt, MethodSpec, schedule
from .summary import summarise


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
    """
    if not methods or methods[0].method != PLAIN.name:
        raise ConfigError("The first bench method must be plain: it is the reference for speedups.")
    if pair.draft is None and any(getattr(REGISTRY.find(m.method), "needs_draft", False) for m in methods):
        raise ConfigError("Draft-model methods need a draft model (--draft).")
    profile = pair.calibrate()
    prompt_ids = {bp.name: prompt_tokens(pair, bp) for bp in prompts}  # template and tokenizer once
    noise = batch_noise(pair.target, prompt_ids[prompts[0].name])
    report = BenchReport(profile={"source": profile.source, **profile.relative(),
                                  "step_seconds": profile.verify[0], "batch_noise": noise,
                                  "tie_margin": max(TIE_MARGIN, 2 * noise)},
                         settings={"reps": reps, "max_tokens": max_tokens, "temperatures": list(temperatures),
                                   "top_p": top_p, "methods": [m.label for m in methods]})
    runs: list[Run] = []
    peers = PeerRunner(pair.target) if any(m.method in PEER_METHODS for m in methods) else None
    if peers is not None:
        report.settings["peer"] = {"library": "llama-cpp-python Llama.generate", **peers.settings}
    # Auto runs with an empty history store of its own, emptied before each run: no repetition learns
    # from another.
    try:
        with scratch_stores(pair, "empty") as (empty,):
            for temperature in temperatures:
                for pi, rep, spec in schedule(len(prompts), methods, reps):
                    bp = prompts[pi]
                    tokens = prompt_ids[bp.name]
                    if rep == 0 and (spec == methods[0] or pi == 0):  # warm-up: plain per prompt, the rest once
                        generate(pair, peers, tokens, spec, temperature, 0, min(16, max_tokens), top_p)
                    empty.clear()
                    out, stats = generate(pair, peers, tokens, spec, temperature, rep, max_tokens, top_p)
                    runs.append(Run(bp.name, bp.category, spec.method, spec.k, rep, temperature, out,
                                    stats.to_dict(), spec.history))
                    if progress:
                        progress(f"{bp.name} {spec.label}")
    finally:
        if peers is not None:
            peers.close()
    report.rows = summarise(pair, prompt_ids, runs, profile, max(TIE_MARGIN, 2 * noise))
    report.mismatches = sum(row.exactness == "MISMATCH" or row.exactness_peer == "MISMATCH" for row in report.rows)
    report.machine = machine_info(pair, checksums)
    return report


def prompt_tokens(pair: Pair, bp: BenchPrompt) -> list[int]:
    return pair.chat_tokens(bp.messages) if bp.messages is not None else pair.tokenize(bp.text or "")


def generate(pair: Pair, peers: Optional[PeerRunner], tokens: list[int], spec: MethodSpec, temperature: float,
              seed: int, max_tokens: int, top_p: float) -> tuple[list[int], GenerationStats]:
    top_p = top_p if temperature > 0 else 1.0
    if spec.method in PEER_METHODS:
        assert peers is not None
        return peers.generate(spec.method, spec.k, tokens, temperature, seed, max_tokens, top_p)
    method = REGISTRY.get(spec.method)
    return fresh_generate(pair, tokens, GenerationOptions(
        max_tokens=max_tokens, method=spec.method, k=spec.k, temperature=temperature, top_p=top_p, seed=seed,
        history=spec.history and method.uses_history))


def fresh_generate(pair: Pair, tokens: list[int], opts: GenerationOptions) -> tuple[list[int], GenerationStats]:
    """Generate from empty caches: every run prefills the whole prompt, so no run inherits another's work."""
    pair.reset()
    r = pair.generate(tokens, opts)
    return r.tokens, r.stats


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
