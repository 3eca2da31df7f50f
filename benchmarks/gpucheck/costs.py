"""What verification, drafting and a round's Python cost on this build (the calibration, the overheads)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .settings import REPO


def load_pair(models: dict[str, Any], n_gpu_layers: int) -> tuple[Any, Any]:
    """The target and draft as localspec loads them, with every layer on the GPU (-1) or none (0)."""
    from localspec.runtime.model import Model

    target = Model(models["target"]["path"], n_gpu_layers=n_gpu_layers)
    draft = Model(models["draft"]["path"], n_gpu_layers=n_gpu_layers)
    return target, draft


def calibrate(target: Any, draft: Any, kmax: int) -> dict[str, Any]:
    """The verify curve for n = 1..kmax+1 and the draft step (``localspec.drafting.calibration.measure``)."""
    from localspec.drafting.calibration import measure

    t0 = time.perf_counter()
    profile = measure(target, draft, kmax)
    return {"kmax": kmax, "verify_seconds": profile.verify, "draft_step_seconds": profile.draft_step,
            "lookup_seconds": profile.lookup, "relative": profile.relative(), "source": profile.source,
            "n_gpu_layers": target.n_gpu_layers, "flash_attn": target.flash_attn, "threads": target.n_threads,
            "threads_batch": target.n_threads_batch, "seconds": round(time.perf_counter() - t0, 2)}


def round_overhead(target: Any, drafter: Any, k: int, params: Any, rounds: int) -> dict[str, float]:
    """Milliseconds per engine round inside and outside llama.cpp, over ``rounds`` rounds after a short prompt.

    Runs ``rounds.speculative_round`` as a generation does, appending each
    round's tokens (end-of-generation tokens too: random weights may pick one).
    """
    import numpy as np

    from localspec.decoding.rounds import speculative_round

    models = (target, *(drafter.models if drafter is not None else ()))
    context = np.zeros(target.n_ctx, dtype=np.int32)
    prompt = target.tokenize("def merge(a, b):\n    out = []\n", add_special=False)
    n = len(prompt)
    context[:n] = prompt
    target.reset()
    target.eval(prompt[:-1], logits="none")
    if drafter is not None:
        drafter.model.reset()
        drafter.prefill(context[:n])
    rng = np.random.default_rng(0)
    wall = busy = 0.0
    for i in range(rounds + 2):  # the first two warm up
        b0, t0 = sum(m.busy_seconds for m in models), time.perf_counter()
        rnd = speculative_round(target, drafter, context[:n], k, params, rng)
        if i >= 2:
            wall += time.perf_counter() - t0
            busy += sum(m.busy_seconds for m in models) - b0
        for tok in rnd.draft.tokens[: rnd.kept] + [rnd.next_token]:
            context[n] = tok
            n += 1
    return {"python_ms_per_round": round(1000 * (wall - busy) / rounds, 4),
            "llama_ms_per_round": round(1000 * busy / rounds, 4)}


def logits_copy_seconds(target: Any, kmax: int, reps: int = 20) -> list[float]:
    """Median seconds to copy n rows of logits out of llama.cpp's buffer, n = 1..kmax+1."""
    import numpy as np

    base = target.tokenize("The quick brown fox jumps over the lazy dog. ", add_special=False)
    probe = (base * (kmax + 2))[: kmax + 2]
    target.reset()
    target.eval(probe[:1], logits="none")
    out = []
    for n in range(1, kmax + 2):
        rows = target.eval(probe[1 : n + 1], logits="all")
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            rows.copy()
            times.append(time.perf_counter() - t0)
        out.append(float(np.median(times)))
        target.truncate(1)
    return out


def generation_overheads(target: Any, draft: Any, profile: dict[str, Any], tokens: int) -> dict[str, Any]:
    """The engine's own figures for whole generations (``GenerationStats``) per method, auto deciding by
    ``profile``: Python milliseconds per round outside llama.cpp, the emit loop and auto's choices included.

    Random weights may pick an end-of-generation token early; ``rounds`` says how many there were.
    """
    from localspec.api import Pair
    from localspec.drafting.costs import CostProfile

    pair = Pair(target, draft, history=False)  # not closed here: the caller owns the models
    pair.set_profile(CostProfile(profile["verify_seconds"], profile["draft_step_seconds"], profile["lookup_seconds"]))
    prompt = target.tokenize("def merge(a, b):\n    out = []\n    i = j = 0\n" * 3, add_special=False)
    out = {}
    for method, k in (("plain", None), ("lookup", None), ("draft", 4), ("auto", None)):
        stats = pair.generate(prompt, max_tokens=tokens, method=method, k=k).stats
        out[method] = {"rounds": stats.rounds, "tokens": stats.generated_tokens,
                       "python_ms_per_round": round(stats.overhead_ms_per_round, 4),
                       "decode_ms_per_token": round(1000 / stats.decode_tokens_per_second, 4)
                       if stats.decode_tokens_per_second else None}
    return out


def overheads(target: Any, draft: Any, profile: dict[str, Any], kmax: int, rounds: int) -> dict[str, Any]:
    """Python time per round outside llama.cpp (single rounds, plain and draft model, greedy and sampled; whole
    generations per method) and the time to copy logits rows."""
    from localspec.drafting.drafters import ModelDrafter
    from localspec.options import SamplingParams

    greedy, sampled = SamplingParams(), SamplingParams(temperature=0.7, top_p=0.9)
    out: dict[str, Any] = {"rounds": rounds}
    for name, params in (("greedy", greedy), ("sampled", sampled)):
        out[f"plain_{name}"] = round_overhead(target, None, 0, params, rounds)
        out[f"draft4_{name}"] = round_overhead(target, ModelDrafter(draft, params), 4, params, rounds)
    out["generation"] = generation_overheads(target, draft, profile, rounds)
    out["logits_copy_seconds"] = logits_copy_seconds(target, kmax)
    target.reset()
    draft.reset()
    return out


def cli_calibrate(models: dict[str, Any], home: Path, env: dict[str, str], timeout: float) -> dict[str, Any]:
    """``localspec calibrate --json`` on the pair through the CLI, in a fresh localspec home."""
    cmd = [sys.executable, "-m", "localspec", "calibrate", "-t", models["target"]["path"],
           "-d", models["draft"]["path"], "--json"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                       env=dict(env, LOCALSPEC_HOME=str(home), LOCALSPEC_HISTORY="off"))
    if r.returncode != 0:
        raise RuntimeError(f"localspec calibrate exited {r.returncode}: {r.stderr.strip()[-1500:]}")
    return {"command": "localspec calibrate -t TARGET -d DRAFT --json", "seconds": round(time.perf_counter() - t0, 2),
            "result": json.loads(r.stdout.strip().splitlines()[-1]), "stderr": r.stderr.strip()[-1000:]}
