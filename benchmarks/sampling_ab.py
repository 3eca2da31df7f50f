"""Python's cost of a sampled token: ``localspec.sampling.acceptance`` at an earlier commit against the working tree.

Interleaved repetitions of ``choose`` (one sampled token) and a round with a sampled draft of 4 (four
draws, then acceptance over five lazy target rows), on logits rows of a real model after a code and
prose prompt ("real"), and on N(0, 0.5) noise rows like a random-weight model's ("flat").

    python benchmarks/sampling_ab.py --old-rev 98092c1 [--target T.gguf] [--reps 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PROMPT = ("def quicksort(arr):\n    \"\"\"Sort a list.\"\"\"\n    if len(arr) <= 1:\n        return arr\n"
          "    pivot = arr[len(arr) // 2]\n The history of Rome began when")
SETTINGS = (dict(temperature=0.7, top_p=0.9), dict(temperature=0.7),
            dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05))


def old_module(rev: str) -> Any:
    """The acceptance module as it was at ``rev`` (``localspec/sampling/acceptance.py``, before the packages
    ``localspec/acceptance.py``), imported beside the current package."""
    for name in ("localspec/sampling/acceptance.py", "localspec/acceptance.py"):
        shown = subprocess.run(["git", "show", f"{rev}:{name}"], cwd=REPO, capture_output=True, text=True)
        if shown.returncode == 0:
            break
    else:
        raise SystemExit(f"{rev} has no acceptance module at either path; name a commit of this repository.")
    text = shown.stdout.replace("from ..options import", "from localspec.options import")
    path = Path(tempfile.mkdtemp()) / "old_acceptance.py"
    path.write_text(text.replace("from .options import", "from localspec.options import"))
    spec = importlib.util.spec_from_file_location("old_acceptance", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def real_rows(target: Path, n: int = 40) -> Any:
    """The last ``n`` logits rows of ``target`` over the prompt."""
    import numpy as np

    from localspec.runtime.model import Model

    model = Model(target, n_ctx=512)
    try:
        rows = model.eval(model.tokenize(PROMPT), logits="all")
        return np.array(rows[-n:], dtype=np.float32)
    finally:
        model.close()


def time_one(mod: Any, rows: Any, params: Any, seed: int) -> tuple[float, float]:
    """Milliseconds per ``choose`` and per round of a sampled draft of 4, on these rows."""
    import numpy as np

    rng = np.random.default_rng(seed)
    t = time.perf_counter()
    for x in rows:
        mod.choose(x, params, rng)
    choose_ms = (time.perf_counter() - t) / len(rows) * 1e3
    rng = np.random.default_rng(seed)
    rounds = range(0, len(rows) - 5, 5)
    t = time.perf_counter()
    for i in rounds:
        q = [mod.choose(r, params, rng)[1] for r in rows[i:i + 4]]
        mod.accept_sampled([int(np.argmax(r)) for r in q], q, mod.ProbRows(rows[i:i + 5], params), rng)
    return choose_ms, (time.perf_counter() - t) / len(rounds) * 1e3


def main() -> int:
    import numpy as np

    from localspec.options import SamplingParams
    from localspec.sampling import acceptance as new

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old-rev", required=True, help="the commit whose acceptance.py is 'before'")
    ap.add_argument("--target", type=Path, default=Path.home() / ".cache/localspec/test-models/target.gguf")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    old = old_module(args.old_rev)
    real = real_rows(args.target)
    flat = (np.random.default_rng(1).standard_normal(real.shape) * 0.5).astype(np.float32)
    print("rows  sampling                                      choose before/after   round4 before/after (ms)")
    for label, rows in (("real", real), ("flat", flat)):
        for kw in SETTINGS:
            params = SamplingParams(**kw)
            times: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
            for rep in range(args.reps):  # interleaved: drift hits both alike
                for name, mod in (("old", old), ("new", new)):
                    times[name].append(time_one(mod, rows, params, rep))
            med = {name: np.median(np.array(v), axis=0) for name, v in times.items()}
            print(f"{label:<5} {str(kw):<45} {med['old'][0]:6.2f} / {med['new'][0]:5.2f}        "
                  f"{med['old'][1]:6.1f} / {med['new'][1]:5.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
