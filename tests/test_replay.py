"""The replay of recorded plain generations through the real drafters and auto, on any cost profile."""

from __future__ import annotations

import pytest

from localspec.costs import CostProfile
from localspec.replay import Recorded, bound, kept_prefix, replay_auto

FLAT = CostProfile.synthetic([1.0 + 0.04 * n for n in range(9)], 0.1, name="flat")  # a GPU-like curve
LINEAR = CostProfile.synthetic([float(n + 1) for n in range(9)], 0.5, name="linear")  # nothing can pay


@pytest.fixture(scope="module")
def recorded(tiny_pair):
    """Two requests whose plain replies repeat what their prompts (and the first reply) hold."""
    out = []
    for name, text in (("first", "the cat sat on the mat. the cat sat on the mat. the cat"),
                       ("second", "the cat sat on the mat. the dog sat on the mat. the cat")):
        tokens = tiny_pair.tokenize(text)
        tiny_pair.target.reset()
        reply = tiny_pair.generate(tokens, max_tokens=48, method="plain").tokens
        out.append(Recorded(name, text, tokens, reply))
    return out


def test_kept_prefix_is_greedy_acceptance():
    assert kept_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert kept_prefix([], [1]) == 0 and kept_prefix([1, 2], [1]) == 1


def test_the_bound_is_never_below_auto_and_a_flat_curve_lets_copying_pay(recorded):
    for profile in (FLAT, LINEAR):
        for shared in (False, True):
            auto = replay_auto(profile, recorded, shared_history=shared)
            best = bound(profile, recorded)
            assert all(b >= a - 1e-9 for a, b in zip(auto, best, strict=True)), (profile.source, auto, best)
    assert min(bound(FLAT, recorded)) > 1.3 and min(replay_auto(FLAT, recorded, True)) > 1.2
    # Where verifying n tokens costs n steps, no schedule gains, and auto stays near plain.
    assert max(bound(LINEAR, recorded)) <= 1.0 + 1e-9
    assert min(replay_auto(LINEAR, recorded, True)) > 0.9
