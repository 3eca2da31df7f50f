"""Recording a workload once, for the replay: each prompt's greedy reply, and the draft model's guesses.

The replay (``localspec.drafting.replay``) predicts any method's and auto's speedup on
any cost profile from these recordings, so the acceptance measured here on a
CPU combines with costs measured elsewhere (a GPU's). Greedy acceptance does
not depend on the hardware, up to the kernels' batch-shape rounding at
near-ties.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np

from ..drafting.replay import Recorded
from ..options import GenerationOptions
from .runner import prompt_tokens
from .suite import BenchPrompt

if TYPE_CHECKING:
    from ..api import Pair
    from ..runtime.model import Model

#: Bumped when what a recording holds changes, so old files are recorded again.
TRACE_VERSION = 1
_CHUNK = 64  # teacher-forced rows per decode call: logits of 64 x 152k floats stay small


def draft_guesses(draft: Model, prompt: list[int], reply: list[int]) -> Optional[list[int]]:
    """The draft model's greedy token after ``prompt + reply[:i]`` for every i, by one teacher-forced pass.

    Returns None when the draft cannot run on this text: an id past its
    vocabulary (a padded target's), or more tokens than its context holds.
    Leaves the draft's cache empty.
    """
    tokens = prompt + reply
    if not reply or max(tokens) >= draft.n_vocab or len(tokens) > draft.n_ctx:
        return None
    draft.reset()
    try:
        draft.eval(prompt[:-1], logits="none")
        fed = [prompt[-1], *reply[:-1]]
        out: list[int] = []
        for start in range(0, len(fed), _CHUNK):
            rows = draft.eval(fed[start : start + _CHUNK], logits="all")
            out.extend(int(t) for t in np.argmax(rows, axis=1))  # row i: the guess after fed[start + i]
        return out
    finally:
        draft.reset()


def record(pair: Pair, prompts: Sequence[BenchPrompt], max_tokens: int,
           say: Callable[[str], None] = lambda _: None) -> list[Recorded]:
    """Decode each prompt plainly and greedily from empty caches, and record the draft's guesses along it."""
    out = []
    for bp in prompts:
        tokens = prompt_tokens(pair, bp)
        text = (pair.format_chat(bp.messages) if bp.messages is not None
                else bp.prefix + (bp.suffix or "") if bp.prefix is not None else bp.text or "")
        pair.reset()
        reply = pair.generate(tokens, GenerationOptions(max_tokens=max_tokens, method="plain", temperature=0.0,
                                                        history=False)).tokens
        guesses = draft_guesses(pair.draft, tokens, reply) if pair.draft is not None else None
        out.append(Recorded(bp.name, text, tokens, reply, guesses, bp.category))
        agree = "" if guesses is None else f", draft agrees on {np.mean(np.equal(guesses, reply)):.0%}"
        say(f"recorded {bp.name}: {len(reply)} tokens{agree}")
    return out


def save(path: Path, requests: Sequence[Recorded], meta: dict[str, Any]) -> None:
    """Write recordings (with ``meta``: which models, how many tokens) as JSON."""
    path.write_text(json.dumps({"version": TRACE_VERSION, "meta": meta,
                                "requests": [vars(r) for r in requests]}))


def load(path: Path, meta: Optional[dict[str, Any]] = None) -> Optional[list[Recorded]]:
    """Recordings from ``path``; None when it is missing, damaged, of another version, or ``meta`` differs."""
    try:
        data = json.loads(path.read_text())
        if data.get("version") != TRACE_VERSION or (meta is not None and data.get("meta") != meta):
            return None
        return [Recorded(**r) for r in data["requests"]]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
