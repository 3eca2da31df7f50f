"""The drafting-method registry: a toy drafter registered here runs everywhere without touching another file."""

from __future__ import annotations

import pytest

import localspec
from localspec.bench import default_methods
from localspec.cli.chat_session import colours
from localspec.drafting.candidates import Candidate
from localspec.drafting.costs import CostProfile, round_cost
from localspec.drafting.drafters import EMPTY_DRAFT, Draft, Drafter
from localspec.drafting.estimates import AcceptanceEstimate
from localspec.errors import ConfigError
from localspec.methods import REGISTRY, Method, register, search_cost
from localspec.options import GenerationOptions

GPU = CostProfile.synthetic([1.0 + 0.02 * n for n in range(9)], 0.1, name="gpu-like")
PROMPT = "ab ab ab ab ab ab ab ab ab ab"


class RepeatDrafter(Drafter):
    """Guesses that the last token comes again, k times: right on repetitive text, wrong elsewhere."""

    name = "toy"

    def propose(self, context, k, rng):
        return Draft([int(context[-1])] * k, None, "toy") if k > 0 else EMPTY_DRAFT


@pytest.fixture
def toy():
    def candidate(ctx):  # what auto offers each round: the drafter and its (confident) estimate
        return Candidate(REGISTRY.get("toy"), RepeatDrafter(), {0: AcceptanceEstimate(0.95)})

    method = Method("toy", "repeat the last token", 3, search_cost, build=lambda ctx: RepeatDrafter(),
                    candidate=candidate, colour="red", bench_k=(2, 5), bench_k_quick=(2,))
    register(method)
    yield method
    REGISTRY.unregister("toy")


def test_a_registered_drafter_runs_through_generate_auto_stats_bench_and_chat(toy, tiny_pair, make_pair):
    plain = tiny_pair.generate(PROMPT, max_tokens=40, method="plain")
    r = tiny_pair.generate(PROMPT, max_tokens=40, method="toy")
    assert r.tokens == plain.tokens  # exact, whatever it guesses
    assert r.stats.method == "toy" and r.stats.k == 3 and r.stats.drafted_by["toy"] > 0
    assert r.stats.rounds_by_method == {"toy": r.stats.rounds}
    a = make_pair(GPU).generate(PROMPT, max_tokens=40, method="auto")  # where drafting pays, the toy's guesses
    assert a.tokens == plain.tokens and a.stats.auto.rounds["toy"] > 0 and "toy" in a.stats.auto.alpha
    assert a.stats.drafted_by.get("toy", 0) > 0
    assert round_cost(GPU, "toy", 2) == round_cost(GPU, "lookup", 2)  # its cost, from its registration
    labels = [m.label for m in default_methods(False, quick=True, peers=False)]
    assert labels == ["plain", "lookup k=2", "lookup k=4", "toy k=2", "auto"]
    assert [m.label for m in default_methods(False, quick=False, peers=False, auto=False)][-2:] == ["toy k=2",
                                                                                                 "toy k=5"]
    assert colours()["toy"] == "red"
    assert GenerationOptions(method="toy").draft_length() == 3


def test_an_unknown_or_duplicate_method_is_one_sentence(toy):
    with pytest.raises(ConfigError, match="already registered"):
        register(Method("toy", "again", 1, search_cost))
    with pytest.raises(ConfigError, match=r"Unknown method 'nope'; choose one of auto, plain, lookup, prediction, "
                                          r"history, draft, mtp, toy\."):
        GenerationOptions(method="nope")


def test_methods_that_cannot_run_say_why(tiny_dir):
    with localspec.load(tiny_dir / "target.gguf", n_ctx=256, history=False) as single:
        with pytest.raises(ConfigError, match="needs a draft model"):
            single.generate("hi", method="draft")
        with pytest.raises(ConfigError, match="needs the history store"):
            single.generate("hi", method="history")


def test_a_registered_method_is_checked_and_its_needs_are_enforced(tiny_dir):
    with pytest.raises(ConfigError, match="default draft length must be a whole number from 0 to 16"):
        Method("big", "too long", 40, search_cost)
    register(Method("needy", "a draft-model variant", 2, search_cost, build=lambda ctx: RepeatDrafter(),
                    needs_draft=True, bench_k=(3,)))
    try:
        with localspec.load(tiny_dir / "target.gguf", n_ctx=256, history=False) as single:
            with pytest.raises(ConfigError, match="Method 'needy' needs a draft model"):
                single.generate("hi", method="needy")
        assert [m.label for m in default_methods(True, quick=True, peers=False, auto=False)][-1] == "needy k=3"
    finally:
        REGISTRY.unregister("needy")
