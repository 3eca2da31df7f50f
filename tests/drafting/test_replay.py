"""The replay of recorded plain generations through the real drafters and auto, on any cost profile."""

from __future__ import annotations

import pytest

from localspec.drafting.costs import CostProfile
from localspec.drafting.drafters import PromptLookupDrafter
from localspec.drafting.replay import Recorded, bound, kept_prefix, replay_auto

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


@pytest.mark.parametrize("method, k", [("draft", 3), ("draft", 1), ("lookup", 4)])
def test_the_recorded_rounds_are_the_rounds_the_engine_runs(tiny_pair, tmp_path, method, k):
    """One teacher-forced pass of the draft tells how much of every draft the target keeps: the replay's
    rounds of a fixed method are the engine's, round for round in total."""
    from localspec.bench import BenchPrompt
    from localspec.bench.traces import load, record, save
    from localspec.drafting.replay import RecordedDraft, replay_rounds

    prompts = [BenchPrompt("code", text="def add(a, b):\n    return a + b\n\ndef", name="a"),
               BenchPrompt("copy", text="the cat sat on the mat. the dog sat on the mat. the", name="b")]
    recorded = record(tiny_pair, prompts, max_tokens=40)
    save(tmp_path / "t.json", recorded, {"n": 40})
    assert load(tmp_path / "t.json", {"n": 40}) == recorded and load(tmp_path / "t.json", {"n": 41}) is None
    for req in recorded:
        assert req.draft_next is not None and len(req.draft_next) == len(req.reply)
        tiny_pair.reset()
        real = tiny_pair.generate(req.prompt, max_tokens=40, method=method, k=k, history=False)
        assert real.tokens == req.reply
        drafter = RecordedDraft(req) if method == "draft" else PromptLookupDrafter()
        rounds = replay_rounds(req, drafter, k)
        s = real.stats
        assert (len(rounds), sum(r.drafted for r in rounds), sum(r.kept for r in rounds)) == (
            s.rounds, s.drafted, s.accepted), (method, k, req.name)


def test_auto_in_the_replay_uses_the_recorded_draft_where_it_pays(tiny_dir):
    import localspec
    from localspec.bench import BenchPrompt
    from localspec.bench.traces import record
    from localspec.drafting.replay import replay_method

    # The target as its own draft: every guess is kept, so only the costs decide.
    with localspec.load(tiny_dir / "target.gguf", tiny_dir / "target.gguf", n_ctx=512, history=False) as pair:
        recorded = record(pair, [BenchPrompt("prose", text="Once upon a time", name="p")], max_tokens=40)
    assert recorded[0].draft_next == recorded[0].reply
    cheap_draft = CostProfile.synthetic([1.0 + 0.04 * n for n in range(9)], 0.05, name="flat, cheap draft")
    fixed = replay_method(cheap_draft, recorded, "draft", 4)[0]
    auto = replay_auto(cheap_draft, recorded, shared_history=False)[0]
    assert fixed > 2.5 and auto > 2.5
    assert replay_method(LINEAR, recorded, "draft", 4)[0] < 1.0  # drafting cannot pay here
    assert 0.9 < replay_auto(LINEAR, recorded, shared_history=False)[0] <= 1.0 + 1e-9  # and auto does not draft
    with pytest.raises(ValueError, match="no draft-model guesses"):
        replay_method(FLAT, [Recorded("x", "", [1, 2], [3, 4])], "draft", 2)


def test_on_the_real_pairs_recordings_auto_keeps_up_with_the_better_fixed_row_on_every_measured_curve():
    """The recorded replies of the real pair (the suite and the related workload, ``benchmarks/traces``), replayed
    through auto with one cost correction kept across them, as a pair keeps it: on each curve measured on the
    2-core machines, auto's geometric mean is at least the better of plain decoding and localspec's lookup with
    K = 2 (standing in for llama-cpp-python's fastest row on the same plain path), no request loses much to plain,
    and where verifying is nearly free auto gains."""
    import json
    import math
    import statistics
    from pathlib import Path

    from localspec.drafting.costs import CostCorrection
    from localspec.drafting.replay import replay_method

    traces = Path(__file__).resolve().parents[2] / "benchmarks" / "traces"
    requests = [Recorded(**r) for name in ("traces-suite-96.json", "traces-related.json")
                for r in json.loads((traces / name).read_text())["requests"]]

    def geomean(xs: list[float]) -> float:
        return math.exp(statistics.fmean(math.log(x) for x in xs))

    measured = [c for c in json.loads((traces / "curves.json").read_text())["curves"] if c["measured"]]
    assert len(measured) >= 7
    for curve in measured:
        name = curve["name"]
        profile = CostProfile.synthetic([float(v) for v in curve["verify"]], float(curve["draft_step"]), name=name)
        correction = CostCorrection()
        auto = [replay_auto(profile, requests, False, correction=correction) for _ in range(2)][-1]  # warm
        better = [max(1.0, x) for x in replay_method(profile, requests, "lookup", 2)]
        assert geomean([a / b for a, b in zip(auto, better, strict=True)]) >= 1.0 - 1e-9, name
        assert min(auto) > 0.9, name
    assert geomean(replay_auto(FLAT, requests, False, correction=CostCorrection())) > 2.0


SHORT_REPLY_GAP = ("not met on every curve: on a short reply auto's first bets, made on its priors, decide its speed "
                   "against lookup with K = 2 on the same plain path (benchmarks/results/"
                   "2026-12-03-auto-short-reply-replay.md, 2026-12-04-short-answer-three-calibrations.md, "
                   "2026-12-07-short-answers.md)")


def _median_over_passes(profile: CostProfile, requests: list[Recorded]) -> tuple[list[float], list[float]]:
    """Auto's speedup per request, the median of three passes with one cost correction kept across them (as
    ``benchmarks/auto_sweep.py`` replays them), and the better of plain decoding and lookup with K = 2."""
    from localspec.drafting.replay import replay_auto_median, replay_method

    better = [max(1.0, x) for x in replay_method(profile, requests, "lookup", 2)]
    return replay_auto_median(profile, requests), better


def test_on_short_answers_about_documents_auto_keeps_up_with_plain_and_lookup_on_every_curve():
    """Fifteen short answers about a document (6 to 78 tokens: the suite's doc-qa#2, the related workload's two
    extracts and ``traces-short-answers.json``), replayed on every curve: auto's geometric mean over them is at
    least 0.98 of the better of plain decoding and lookup with K = 2, and of plain decoding alone, so that a
    steep curve, where only a near-certain guess pays, does not make auto slower than not drafting; and on the
    steep curve an answer that first echoes its question, then quotes the document, keeps up with plain
    decoding (the echo's failed guess is learnt apart from the document's matches)."""
    import json
    import math
    import statistics
    from pathlib import Path

    traces = Path(__file__).resolve().parents[2] / "benchmarks" / "traces"
    recorded = {name: [Recorded(**r) for r in json.loads((traces / name).read_text())["requests"]]
                for name in ("traces-suite-96.json", "traces-related.json", "traces-short-answers.json")}
    requests = [r for name in ("traces-suite-96.json", "traces-related.json") for r in recorded[name]
                if r.name in {"doc-qa#2", "extract#1", "extract#2"}] + recorded["traces-short-answers.json"]
    assert len(requests) == 15 and max(len(r.reply) for r in requests) <= 80

    def geomean(xs: list[float]) -> float:
        return math.exp(statistics.fmean(math.log(x) for x in xs))

    low = []
    for curve in json.loads((traces / "curves.json").read_text())["curves"]:
        profile = CostProfile.synthetic([float(v) for v in curve["verify"]], float(curve["draft_step"]))
        auto, better = _median_over_passes(profile, requests)
        against_better, against_plain = geomean([a / b for a, b in zip(auto, better, strict=True)]), geomean(auto)
        if min(against_better, against_plain) < 0.98:
            low.append(f"{curve['name']}: {against_better:.3f} of the better row, {against_plain:.3f} of plain")
        if "steep" in curve["name"]:  # an answer that echoes its question, then quotes the document
            echo = next(i for i, r in enumerate(requests) if r.text.endswith("data? Answer in one sentence."
                                                                               "<|im_end|>\n<|im_start|>assistant\n"))
            if auto[echo] < 0.98:
                low.append(f"{curve['name']}: {requests[echo].name} {auto[echo]:.3f} of plain")
    assert not low, low


@pytest.mark.xfail(strict=True, reason=SHORT_REPLY_GAP)
def test_on_a_short_answer_about_a_document_auto_keeps_up_with_the_better_fixed_row_on_every_curve():
    """The suite's short answer about a paragraph and the related workload's short extracts, replayed as
    ``benchmarks/auto_sweep.py`` replays them (three passes, one cost correction kept across them, the median):
    on every curve auto is at least 0.98 of the better of plain decoding and lookup with K = 2. A reply of a
    few dozen tokens leaves auto no rounds to make up for a long first draft that fails, or for a copy it
    noticed late. (Over fifteen short answers the category keeps up: the test above.)"""
    import json
    from pathlib import Path

    traces = Path(__file__).resolve().parents[2] / "benchmarks" / "traces"
    requests = [Recorded(**r) for name in ("traces-suite-96.json", "traces-related.json")
                for r in json.loads((traces / name).read_text())["requests"]]
    short = {"doc-qa#2", "extract#1", "extract#2"}
    low = []
    for curve in json.loads((traces / "curves.json").read_text())["curves"]:
        profile = CostProfile.synthetic([float(v) for v in curve["verify"]], float(curve["draft_step"]))
        auto, better = _median_over_passes(profile, requests)
        for req, a, b in zip(requests, auto, better, strict=True):
            if req.name in short and a / b < 0.98:
                low.append(f"{curve['name']}: {req.name} {a / b:.3f}")
    assert not low, low
