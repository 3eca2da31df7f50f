"""Auto puts off a draft model's reading of the prompt until the reply is long enough to pay for it."""

from __future__ import annotations

import numpy as np

from localspec.drafting.auto import MIN_HORIZON, AutoDrafter
from localspec.drafting.candidates import Candidate
from localspec.drafting.costs import CostCorrection, CostProfile
from localspec.drafting.drafters import ModelDrafter
from localspec.drafting.estimates import AcceptanceEstimate
from localspec.methods import DRAFT
from localspec.options import SamplingParams

# Memory-bound (a GPU): verifying up to 9 tokens costs one step, a draft step 0.1 of one, so a draft model
# pays, and reading a token of prompt into it costs 0.1 / 9 of a step by the curve.
GPU = CostProfile.synthetic([1.0] * 9, 0.1, name="gpu-like")


class _Held:
    """A draft model's stand-in that holds the first ``held`` tokens of any context."""

    def __init__(self, held: int):
        self.held = held

    def common_prefix(self, tokens: np.ndarray) -> int:
        return min(self.held, len(tokens))


def _auto(held: int, max_tokens: int | None = None) -> AutoDrafter:
    drafter = ModelDrafter(_Held(held), SamplingParams())  # type: ignore[arg-type]
    candidate = Candidate(DRAFT, drafter, {0: AcceptanceEstimate(0.6)}, free=False)
    return AutoDrafter(GPU, [candidate], kmax=8, max_tokens=max_tokens)


def _first_due(auto: AutoDrafter, prompt: int, most: int) -> int | None:
    """How many tokens the reply has when auto first wants the prompt read (None: not within ``most``)."""
    auto.prefill(np.zeros(prompt, dtype=np.int32))
    for generated in range(1, most + 1):
        if auto.deferred(np.zeros(prompt + generated, dtype=np.int32), 8):
            return generated
    return None


def test_a_long_prompt_is_read_once_the_reply_has_run_long_enough_to_pay_it_back():
    short, long = _first_due(_auto(0), 2_000, 500), _first_due(_auto(0), 20_000, 2_000)
    assert short is not None and long is not None
    # the reading's cost grows with the prompt, and so does the reply that pays it back
    assert MIN_HORIZON < short < long and 5 * short < long < 20 * short


def test_a_prompt_that_is_short_or_already_held_is_read_at_once():
    assert _first_due(_auto(0), 40, 1) == 1
    assert _first_due(_auto(19_990), 20_000, 1) == 1  # the prompt cache gave the draft model nearly all of it


def test_a_reply_capped_short_never_has_a_long_prompt_read():
    assert _first_due(_auto(0, max_tokens=24), 4_000, 24) is None
    assert _first_due(_auto(0, max_tokens=2_000), 4_000, 400) is not None


def test_a_draft_model_that_has_not_read_the_prompt_is_not_chosen():
    auto = _auto(0)
    auto.prefill(np.zeros(20_000, dtype=np.int32))
    rng = np.random.default_rng(0)
    assert not auto.propose(np.zeros(20_001, dtype=np.int32), 8, rng).tokens  # plain, without running it


def _long_prompt() -> str:
    return " ".join(f"item {i} is stored in box {i % 7} next to item {i + 3}." for i in range(42))


class _Unlearning(CostCorrection):
    """A correction that learns nothing: auto decides by the GPU-like profile alone, whatever this machine's
    real rounds cost."""

    def observe(self, timing) -> None:
        pass

    def observe_gain(self, *args) -> None:
        pass


def test_a_short_reply_to_a_long_prompt_leaves_the_draft_model_idle_and_a_long_one_drafts_exactly(make_pair):
    pair = make_pair(GPU, n_ctx=4096)
    pair.cost_correction = _Unlearning()
    prompt = _long_prompt()
    assert len(pair.target.tokenize(prompt)) > 1500
    short_plain = pair.generate(prompt, max_tokens=12, method="plain")
    short = pair.generate(prompt, max_tokens=12, method="auto", history=False)
    assert short.tokens == short_plain.tokens
    assert short.stats.auto.rounds["draft"] == 0 and pair.draft.n_past == 0  # it never read the prompt
    long_plain = pair.generate(prompt, max_tokens=200, method="plain")
    long = pair.generate(prompt, max_tokens=200, method="auto", history=False)
    assert long.tokens == long_plain.tokens
    assert long.stats.auto.rounds["draft"] > 0
    first = next(c for c in long.stats.auto.changes if c.method == "draft")
    assert first.round > 2  # only once the reply had run on (lookup's rounds give several tokens each)
