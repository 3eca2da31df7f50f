"""Auto with the batch in view: a round in a decode shared with other sequences is weighed by the whole step."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.drafting.auto import AutoDrafter
from localspec.drafting.candidates import Candidate
from localspec.drafting.costs import ALONE, Beside, CostProfile, RoundTiming, best_k, round_cost
from localspec.drafting.drafters import Draft, Drafter
from localspec.drafting.estimates import AcceptanceEstimate
from localspec.methods import LOOKUP

# The 2-core test machine's curve (2 threads): verifying 4 tokens costs about 2 steps, 9 about 4.2.
CPU = CostProfile.synthetic([1.0, 1.39, 1.82, 2.06, 2.34, 2.92, 3.07, 3.85, 4.18], 0.57, name="2-core")
GPU = CostProfile.synthetic([1.0 + 0.01 * n for n in range(9)], 0.1, name="gpu-like")
CONTEXT = np.array(([5, 6, 7, 8, 9, 10, 11, 12, 13, 14] * 6)[:-3], dtype=np.int32)


class _Always(Drafter):
    name = "lookup"

    def propose(self, context, k, rng):
        return Draft([7] * k, None, "lookup")


def _auto(profile: CostProfile, alpha: float) -> AutoDrafter:
    estimate = AcceptanceEstimate(alpha, 10_000)  # held firm: the test is about costs, not estimates
    return AutoDrafter(profile, [Candidate(LOOKUP, _Always(), {0: estimate})], kmax=8)


def test_alone_the_beside_argument_changes_nothing():
    for alpha in (0.3, 0.6, 0.9):
        assert best_k(CPU, LOOKUP, alpha, 8) == best_k(CPU, LOOKUP, alpha, 8, beside=ALONE)


def test_on_a_cpu_a_guess_that_pays_alone_does_not_pay_beside_three_decoding_streams():
    assert best_k(CPU, LOOKUP, 0.8, 8)[0] > 0
    k, speed = best_k(CPU, LOOKUP, 0.8, 8, beside=Beside(tokens=3, streams=3, sequences=3))
    assert k == 0 and speed == 1.0
    # a near-copy still pays in the batch, with a shorter draft than alone
    alone, shared = best_k(CPU, LOOKUP, 0.93, 8), best_k(CPU, LOOKUP, 0.93, 8, beside=Beside(3, 3, 3))
    assert 0 < shared[0] and shared[1] < alone[1]


def test_on_a_gpu_a_full_batch_still_drafts_long():
    k, speed = best_k(GPU, LOOKUP, 0.7, 8, beside=Beside(tokens=7, streams=7, sequences=7))
    assert k >= 4 and speed > 1.1


def test_beside_a_prompt_being_read_a_guess_is_almost_free():
    # a 400-token prompt chunk gives no token this step: this round's guess rides on its cost
    k, speed = best_k(CPU, LOOKUP, 0.5, 8, beside=Beside(tokens=400, streams=0, sequences=1))
    assert k >= 6 and speed > 1.8  # the 8th token adds about as much to the tokens as to the cost
    assert best_k(CPU, LOOKUP, 0.5, 8)[0] <= 2


def test_the_round_cost_beside_others_is_the_whole_step():
    profile = CostProfile.synthetic([1.0, 2.0, 3.0, 4.0, 5.0], 0.5, step=1.0)
    assert round_cost(profile, "plain", 0, beside=Beside(2, 2, 2)) == pytest.approx(3.0)
    assert round_cost(profile, LOOKUP, 1, beside=Beside(2, 2, 2)) == pytest.approx(4.0 + profile.lookup)


def test_the_multi_sequence_curve_makes_several_sequences_dearer_than_one_of_as_many_tokens():
    profile = CostProfile.synthetic([1.0, 1.5, 2.0, 2.5], 0.5, step=1.0)
    assert profile.step_seconds(4, 4) == pytest.approx(2.5)  # not measured: as one sequence
    profile.together = [1.0, 1.8, 2.4, 3.0]
    assert profile.step_seconds(4, 4) == pytest.approx(2.5 * 3.0 / 2.5)
    assert profile.step_seconds(4, 1) == pytest.approx(2.5)
    profile.together = [1.35, 1.35 * 1.8, 1.35 * 2.4, 1.35 * 3.0]  # timed slower on another thread: the shape counts
    assert profile.step_seconds(4, 4) == pytest.approx(2.5 * 3.0 / 2.5)
    assert profile.relative()["together"] == [1.0, 1.8, 2.4, 3.0]
    profile.together = [1.0, 1.2]  # cheaper than one sequence of as many tokens: never below that
    assert profile.step_seconds(2, 2) == pytest.approx(1.5)


def test_auto_takes_the_last_decode_for_what_the_next_will_hold():
    rng = np.random.default_rng(0)
    auto = _auto(CPU, 0.8)
    auto.prefill(CONTEXT)
    assert auto.propose(CONTEXT, 8, rng).tokens  # alone, the guess pays
    auto.observe(4, 4)
    auto.observe_timing(RoundTiming(5, 0.2, beside=Beside(3, 3, 3)))  # that round shared a step with 3 streams
    assert auto.propose(CONTEXT, 8, rng).tokens == []  # beside them, it does not
    auto.observe_timing(RoundTiming(1, 0.2, beside=Beside(400, 0, 1)))  # next to a prompt being read
    assert len(auto.propose(CONTEXT, 8, rng).tokens) == 8
    auto.observe(8, 8)
    auto.observe_timing(RoundTiming(9, 0.5))  # alone again
    assert 0 < len(auto.propose(CONTEXT, 8, rng).tokens) < 8


def test_a_prompt_beside_streams_is_read_in_chunks_sized_from_the_curve():
    from localspec.drafting.costs import MIN_PROMPT_CHUNK, STREAM_STEP_BUDGET, prompt_chunk

    chunk = prompt_chunk(CPU)
    # the curve's mean slope (0.4 steps a token) continued: a step of it costs about the budget, not a whole
    # 512-token batch's 200 steps
    slope = (CPU.verify[-1] - CPU.verify[0]) / 8
    assert CPU.verify[-1] + (chunk - 9) * slope <= STREAM_STEP_BUDGET * CPU.verify[0]
    assert CPU.verify[-1] + (chunk - 8) * slope > STREAM_STEP_BUDGET * CPU.verify[0]
    assert MIN_PROMPT_CHUNK <= chunk < 100
    assert prompt_chunk(GPU) >= 2048  # a flat curve: the whole batch
    steep = CostProfile.synthetic([1.0, 3.0, 6.0, 10.0, 15.0], 0.5)
    assert prompt_chunk(steep) == MIN_PROMPT_CHUNK
