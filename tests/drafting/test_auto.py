"""Auto mode: the cost model, its decisions, calibration caching, and exactness."""

from __future__ import annotations

import functools
import json
import os
import time

import numpy as np
import pytest
from clirun import run_cli
from helpers import same_distribution, token_counts

import localspec
from localspec.drafting.auto import AutoDrafter
from localspec.drafting.calibration import calibrate, calibration_key, others_running
from localspec.drafting.candidates import history_candidate, lookup_candidate, model_candidate
from localspec.drafting.costs import CostProfile, best_k, expected_tokens
from localspec.drafting.drafters import DraftingContext
from localspec.drafting.estimates import AcceptanceEstimate, prompt_prior
from localspec.options import GenerationOptions
from localspec.runtime.model import Model
from localspec.runtime.process import default_threads

REAL_OTHERS_RUNNING = others_running  # conftest's autouse fixture stands in for it in every test

# Memory-bound (laptop GPU): verifying up to 9 tokens costs one step; a draft step 0.1 of one.
GPU = CostProfile.synthetic([1.0] * 9, 0.1, name="gpu-like")
# Compute-bound (this 2-core CPU): verifying n tokens costs nearly n steps; a draft step 0.55.
CPU = CostProfile.synthetic([1.0, 1.7, 2.35, 3.0, 3.6, 4.2, 4.8, 5.4, 6.0], 0.55, name="cpu-like")


def test_expected_tokens_per_round():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert expected_tokens(0.9, 0) == 1.0


def test_memory_bound_profile_chooses_long_drafts():
    k, speed = best_k(GPU, "draft", 0.8, 8)
    assert k >= 6 and speed > 2.0
    k, _ = best_k(GPU, "lookup", 0.6, 8)
    assert k >= 4


def test_compute_bound_profile_chooses_plain_or_short_lookup():
    for alpha in (0.5, 0.8, 0.95):
        assert best_k(CPU, "draft", alpha, 8)[0] == 0  # a draft model never pays here
    assert best_k(CPU, "lookup", 0.3, 8)[0] == 0
    k, speed = best_k(CPU, "lookup", 0.9, 8)
    assert 1 <= k <= 3 and speed > 1.0


def test_a_guess_after_forced_tokens_is_weighed_by_what_it_adds_to_their_batch():
    # memory-bound: after 4 forced tokens a good guess still rides along almost free, judged against the
    # 5 tokens the forced round gives alone
    k, speed = best_k(GPU, "lookup", 0.8, 4, forced=4)
    assert k == 4 and speed == pytest.approx((4 + expected_tokens(0.8, 4)) / 5, rel=1e-2)
    assert best_k(GPU, "draft", 0.95, 4, forced=4)[0] == 4
    assert best_k(GPU, "draft", 0.8, 4, forced=4)[0] == 0  # 0.4 steps of drafting for 2.4 more tokens: too little
    # compute-bound: the same guess would pay alone, but not after 4 forced tokens, whose batch it makes dearer
    assert best_k(CPU, "lookup", 0.9, 4)[0] > 0
    assert best_k(CPU, "lookup", 0.9, 4, forced=4)[0] == 0
    assert best_k(CPU, "lookup", 0.9, 4, forced=0) == best_k(CPU, "lookup", 0.9, 4)


def test_acceptance_estimate_follows_recent_rounds():
    est = AcceptanceEstimate(0.5)
    for _ in range(30):
        est.update(4, 4)
    assert est.alpha > 0.95
    for _ in range(60):
        est.update(4, 0)
    assert est.alpha < 0.2


def test_prompt_prior_reads_copy_requests():
    long = np.zeros(300, dtype=np.int32)
    short = np.zeros(20, dtype=np.int32)
    assert prompt_prior("Rewrite this paragraph, fixing the spelling: ...", long) > 0.6
    assert prompt_prior("Write a poem about the sea.", short) < 0.3
    report = ("Incident report. A configuration change lowered the pool from 200 to 20 connections; a second "
              "reviewer must now approve every change, and the on-call engineer will rewrite the runbook. " * 3)
    # words of the supplied document are not what is asked of it: a question about it is not a copy request
    assert prompt_prior(f"Here is a document:\n\n{report}\n\nQuestion: how long did the outage last?", long) < 0.5
    assert prompt_prior(f"Here is a document:\n\n{report}\n\nQuote every sentence about the pool.", long) > 0.6
    assert prompt_prior(f"Fix the spelling in this report and return the whole text: {report}", long) > 0.6
    # as a chat template renders it: a long system prompt on the lines before the user's, joined by single breaks
    system = ("You are a careful assistant for a software team. Answer precisely, keep the user's formatting, never "
              "invent facts, and say when something is not in the text; prefer short answers unless asked for more.")
    for ask in (f"Rewrite this report in plain English: {report}", f"Task: rewrite the report below. {report}",
                f"In config.yaml, change the pool size as this report says. {report}",
                f"{report}\r\n\r\nFix the spelling in the report above."):
        chat = f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{ask}<|im_end|>\n<|im_start|>assistant\n"
        assert prompt_prior(chat, long) > 0.6, ask[:40]


def test_lookup_learns_apart_what_it_copies_from_the_document_from_the_question_and_from_the_reply():
    """An answer that echoes its question's words stops where the question goes on: that failure is learnt
    apart from the matches in the document, so it does not talk auto out of the copy of the document that
    follows; a match in the reply itself starts lower than both. In a prompt too short to hold a document
    and a question about it, its end is the material itself."""
    from localspec.drafting.estimates import LONG_PROMPT, PROMPT_TAIL, lookup_source

    document = list(range(1000, 1000 + LONG_PROMPT))
    question = list(range(2000, 2012))  # the prompt's closing words
    prompt = np.asarray(document + question, dtype=np.int32)
    ctx = DraftingContext(GenerationOptions(), 8, prompt, lambda: "", profile=CPU)
    lookup = lookup_candidate(ctx, prior=0.45)
    rng = np.random.default_rng(0)

    def offer(reply):
        est, guess = lookup.offer(np.concatenate([prompt, np.asarray(reply, dtype=np.int32)]), 4, rng)
        return est, list(guess.tokens), lookup.key()

    echo, guess, key = offer([2003, 2004, 2005])  # the reply repeats the question's words...
    assert guess == [2006, 2007, 2008, 2009] and key == (3, "end") and len(question) <= PROMPT_TAIL
    text, guess, key = offer([1020, 1021, 1022])  # ... or quotes the document
    assert guess == [1023, 1024, 1025, 1026] and key == (3, "text")
    before = text.alpha
    for _ in range(3):  # the echo keeps stopping short
        echo.update(4, 0)
    assert echo.alpha < 0.4 and text.alpha == before and echo is lookup.estimates[(3, "end")]
    mine, guess, key = offer([3000, 3001, 3002, 3003, 3000, 3001, 3002])  # the reply repeats itself
    assert guess == [3003, 3000, 3001, 3002] and key == (3, "reply") and mine.alpha < before
    # a short prompt (an extraction from a few lines) ends with its material, not a question
    assert lookup_source(LONG_PROMPT - 2, LONG_PROMPT) == "text" and lookup_source(LONG_PROMPT, LONG_PROMPT) == "reply"


def _auto(profile, model=None, explore_every=32, prior=0.45):
    """Auto over lookup (with the given prior) and, if given, the draft model, as a pair builds it."""
    ctx = DraftingContext(GenerationOptions(), 8, np.zeros(0, dtype=np.int32), lambda: "", draft=model,
                          profile=profile)
    candidates = [c for c in (lookup_candidate(ctx, prior=prior), model_candidate(ctx)) if c is not None]
    return AutoDrafter(profile, candidates, kmax=8, explore_every=explore_every)


def _replay(auto, context, trace):
    """Feed ``trace`` (fraction of each draft kept) to auto; return the (method, k) of each round."""
    rng = np.random.default_rng(0)
    chosen = []
    for frac in trace:
        draft = auto.propose(context, 8, rng)
        method = draft.by or "plain"
        chosen.append((method, len(draft.tokens)))
        auto.observe(len(draft.tokens), int(round(frac * len(draft.tokens))))
    return chosen


def test_decisions_on_a_replayed_trace_switch_when_acceptance_collapses():
    context = np.array(([5, 6, 7, 8, 9, 10, 11, 12, 13, 14] * 6)[:-3], dtype=np.int32)  # lookup always matches
    # a realistic GPU: verification grows slightly with batch size
    auto = _auto(CostProfile.synthetic([1.0 + 0.04 * n for n in range(9)], 0.1))
    good = _replay(auto, context, [1.0] * 20)
    assert all(m == "lookup" for m, _ in good[2:]) and good[-1][1] >= 4  # long drafts while all are kept
    bad = _replay(auto, context, [0.0] * 60)
    # guesses cost little there, so lookup may stay, but only with short drafts
    assert all(k <= 1 for _, k in bad[-20:])
    # On a compute-bound machine a collapsed lookup gives way to plain decoding, and
    # exploration afterwards is bounded.
    auto = _auto(CPU, explore_every=32)
    _replay(auto, context, [1.0] * 10)
    after = _replay(auto, context, [0.0] * 128)
    tried = [c for c in after[10:] if c[0] != "plain"]
    assert after[-1][0] == "plain"
    assert len(tried) <= 128 // 32 + 1
    assert all(k == 1 for _, k in tried)  # exploration is the cheapest round


def test_draft_model_that_cannot_pay_is_never_run(tiny_dir):
    with Model(tiny_dir / "draft.gguf", n_ctx=256) as d:
        auto = _auto(CPU, d)
        assert [c.name for c in auto.candidates] == ["lookup"] and auto.models == ()
        auto = _auto(GPU, d)
        assert [c.name for c in auto.candidates] == ["lookup", "draft"] and auto.models == (d,)


def test_calibration_is_cached_per_settings_and_refreshable(tiny_dir, tmp_path):
    cache = tmp_path / "cal.json"
    with Model(tiny_dir / "target.gguf", n_ctx=512, n_threads=1) as t, \
            Model(tiny_dir / "draft.gguf", n_ctx=512, n_threads=1) as d:
        first = calibrate(t, d, cache_file=cache)
        assert first.source == "measured" and len(first.verify) == 9 and first.draft_step > 0
        assert first.verify == sorted(first.verify)
        again = calibrate(t, d, cache_file=cache)
        assert again.source == "cache" and again.verify == first.verify
        assert calibrate(t, d, cache_file=cache, refresh=True).source == "measured"
        key = calibration_key(t, d, 8)
        assert key in json.loads(cache.read_text())
    with Model(tiny_dir / "target.gguf", n_ctx=512, n_threads=2) as t2, \
            Model(tiny_dir / "draft.gguf", n_ctx=512, n_threads=2) as d2:
        assert calibration_key(t2, d2, 8) != key  # other thread count, other profile
    os.utime(tiny_dir / "draft.gguf")  # a changed model file invalidates it too
    with Model(tiny_dir / "target.gguf", n_ctx=512, n_threads=1) as t, \
            Model(tiny_dir / "draft.gguf", n_ctx=512, n_threads=1) as d:
        assert calibration_key(t, d, 8) != key
    cache.write_text("{not json")
    with Model(tiny_dir / "target.gguf", n_ctx=512, n_threads=1) as t:
        assert calibrate(t, None, cache_file=cache).source == "measured"  # a damaged cache is re-measured


def test_a_recurrent_target_s_costs_are_kept_apart_for_one_sequence_and_several(tiny_dir, tmp_path):
    from tinyarch import write_tiny_qwen35

    write_tiny_qwen35(tmp_path / "hybrid.gguf", seed=0)
    # one sequence rolls back, several checkpoint: a round's cut back costs differ, so do the profiles
    with Model(tmp_path / "hybrid.gguf", n_ctx=512, n_threads=1) as one, \
            Model(tmp_path / "hybrid.gguf", n_ctx=512, n_threads=1, n_seq=4) as four:
        assert calibration_key(one, None, 8) != calibration_key(four, None, 8)
    # an attention cache cuts back the same way either way: one profile serves both
    with Model(tiny_dir / "target.gguf", n_ctx=512, n_threads=1) as one, \
            Model(tiny_dir / "target.gguf", n_ctx=512, n_threads=1, n_seq=4) as four:
        assert calibration_key(one, None, 8) == calibration_key(four, None, 8)

def test_the_thread_count_is_measured_once_and_the_fastest_is_used(tiny_dir, tmp_path, monkeypatch):
    from localspec.drafting import calibration

    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    calls = []
    real = calibration.measure_threads

    def counted(target, max_threads, steps=7):
        calls.append(max_threads)
        return real(target, max_threads, steps)

    monkeypatch.setattr(calibration, "measure_threads", counted)
    notices: list[str] = []
    with localspec.load(tiny_dir / "target.gguf", tiny_dir / "draft.gguf", n_ctx=512) as pair:
        pair.notify = notices.append
        sweep = pair.choose_threads()
        assert sorted(sweep) == list(range(1, default_threads() + 1)) and all(t > 0 for t in sweep.values())
        best = min(sweep, key=lambda n: sweep[n])
        assert pair.target.n_threads == pair.draft.n_threads == best
        assert any("thread count" in n for n in notices)
        pair.generate("hello", max_tokens=3, method="plain")  # decodes at the chosen count
    with localspec.load(tiny_dir / "target.gguf", tiny_dir / "draft.gguf", n_ctx=512) as pair:
        pair.generate("hello", max_tokens=3, method="plain")  # a new process-like pair: from the cache
        assert pair.target.n_threads == best and calls == [default_threads()]
    with localspec.load(tiny_dir / "target.gguf", n_ctx=512) as pair:  # the sweep runs the target only,
        assert pair.choose_threads() == sweep and pair.target.n_threads == best  # so no draft: same answer
    with localspec.load(tiny_dir / "target.gguf", n_ctx=512, n_threads=1) as pair:
        assert pair.choose_threads() == {} and pair.target.n_threads == 1  # --threads wins, nothing measured
    assert calls == [default_threads()]
    # Loading with both caches warm confirms them with one short run of steps at the chosen count (and one at
    # each rival count, which the thread cache alone needs), not one per cache.
    checks = []
    real_steps = calibration.step_seconds
    monkeypatch.setattr(calibration, "step_seconds", lambda *a, **k: checks.append(1) or real_steps(*a, **k))
    looks = 1 + len(calibration.rivals(sweep, best, default_threads()))
    with localspec.load(tiny_dir / "target.gguf", tiny_dir / "draft.gguf", n_ctx=512) as pair:
        assert pair.calibrate().source == "measured" and len(checks) == looks  # threads confirmed; costs measured
    with localspec.load(tiny_dir / "target.gguf", tiny_dir / "draft.gguf", n_ctx=512) as pair:
        assert pair.calibrate().source == "cache" and len(checks) == 2 * looks  # one check confirmed both caches


PROMPTS = ["The cat sat on the mat and the dog sat on the", "in the end, in the end, in the end, in the",
           "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n"]


@pytest.mark.parametrize("profile", [GPU, CPU, None], ids=["gpu-like", "cpu-like", "measured"])
def test_auto_greedy_is_exact(make_pair, profile):
    pair = make_pair(profile)
    for prompt in PROMPTS:
        plain = pair.generate(prompt, max_tokens=80, method="plain")
        r = pair.generate(prompt, max_tokens=80, method="auto")
        assert r.tokens == plain.tokens
        assert r.stats.method == "auto" and r.stats.auto is not None
        assert sum(r.stats.auto.rounds.values()) == r.stats.rounds


def test_auto_uses_the_draft_model_where_it_pays(make_pair):
    r = make_pair(GPU).generate(PROMPTS[0], max_tokens=80, method="auto")
    assert r.stats.auto.rounds["draft"] > 0
    assert r.stats.auto.changes[0].predicted_speedup > 1.0
    assert r.stats.accepted > 0


def test_auto_sampled_keeps_the_distribution(make_pair):
    pair = make_pair(GPU)
    prompt = PROMPTS[1]
    for position in (1, 3):
        plain = token_counts(pair, prompt, 2000, position, method="plain")
        auto = token_counts(pair, prompt, 2000, position, method="auto")
        assert same_distribution(plain, auto) > 1e-3


def test_calibrate_command_prints_the_profile(tiny_dir):
    r = run_cli(["calibrate", "-t", str(tiny_dir / "target.gguf"), "-d", str(tiny_dir / "draft.gguf")])
    assert r.exit_code == 0, r.output
    assert "verify n tokens" in r.output and "draft step" in r.output
    r = run_cli(["calibrate", "-t", str(tiny_dir / "target.gguf"), "--json"])
    data = json.loads(r.stdout)
    assert len(data["verify_seconds"]) == 9


def test_stream_events_name_the_drafter(tiny_pair, make_pair):
    events = list(make_pair(GPU).stream(PROMPTS[1], max_tokens=60, method="auto"))
    drafted = {ev.drafter for ev in events if ev.from_draft}
    assert drafted and drafted <= {"lookup", "draft"}
    assert all(ev.drafter == "" for ev in events if not ev.from_draft)
    with localspec.load(tiny_pair.target.path) as single:  # no draft model: lookup or plain only
        single.set_profile(GPU)
        r = single.generate(PROMPTS[1], max_tokens=40, method="auto")
        assert r.stats.auto.rounds["draft"] == 0


def test_history_estimates_carry_over_to_the_next_generation_but_yield_to_new_evidence():
    from localspec.drafting.estimates import history_estimates
    from localspec.drafting.history import HistoryIndex

    est = history_estimates()
    for _ in range(50):
        est[3].update(3, 3)  # a request whose history matched perfectly
    high = est[3].alpha
    history_candidate(DraftingContext(GenerationOptions(), 8, np.zeros(0, dtype=np.int32), lambda: "",
                                      history=HistoryIndex(), history_alpha=est, profile=lambda: GPU))
    assert est[3].alpha == pytest.approx(high) and high > 0.95  # the next generation starts from it...
    est[3].update(3, 0)
    est[3].update(3, 0)
    assert est[3].alpha < 0.7  # ...and two wasted rounds on an unrelated request bring it down (0.88 unshrunk)


LINEAR = CostProfile.synthetic([float(n + 1) for n in range(9)], 0.5, name="linear")  # verify(n) = n steps
FLAT = CostProfile.synthetic([1.0 + 0.02 * n for n in range(9)], 0.1, name="flat")  # verify(n) ~ one step


def _timed_replay(auto, machine: CostProfile, context, frac: float, rounds: int):
    """Rounds where each draft keeps ``frac`` of its tokens and costs what ``machine`` says; (method, k) each."""
    from localspec.drafting.costs import RoundTiming

    rng = np.random.default_rng(0)
    chosen = []
    for _ in range(rounds):
        draft = auto.propose(context, 8, rng)
        n = len(draft.tokens)
        auto.observe(n, int(round(frac * n)))
        auto.observe_timing(RoundTiming(n + 1, machine.verify_seconds(n + 1)))
        chosen.append((draft.by or "plain", n))
    return chosen


def _corrected_auto(profile):
    from localspec.drafting.costs import CostCorrection

    ctx = DraftingContext(GenerationOptions(), 8, np.zeros(0, dtype=np.int32), lambda: "", profile=profile,
                          correction=CostCorrection())
    return AutoDrafter(profile, [lookup_candidate(ctx, prior=0.6)], kmax=8, correction=ctx.correction)


CONTEXT = np.array(([5, 6, 7, 8, 9, 10, 11, 12, 13, 14] * 6)[:-3], dtype=np.int32)  # lookup always matches


def test_a_profile_that_says_drafting_is_cheap_is_corrected_on_a_machine_where_it_is_not():
    # Uncorrected, auto believes the flat profile and drafts all along, losing on the linear machine.
    rounds = _timed_replay(AutoDrafter(FLAT, _corrected_auto(FLAT).candidates, kmax=8), LINEAR, CONTEXT, 0.5, 120)
    assert sum(m == "lookup" for m, _ in rounds[-60:]) > 50
    auto = _corrected_auto(FLAT)
    rounds = _timed_replay(auto, LINEAR, CONTEXT, 0.5, 120)
    first_plain = next(i for i, (m, _) in enumerate(rounds) if m == "plain")
    assert first_plain <= 10  # a handful of dear rounds are enough
    assert sum(m != "plain" for m, _ in rounds[30:]) <= 4  # then plain, but for a rare K=1 look
    assert auto.profile.verify[4] / auto.profile.verify[0] > 3  # the profile decided by is near the machine's


def test_a_profile_that_says_drafting_is_dear_is_corrected_on_a_machine_where_it_pays():
    auto = _corrected_auto(LINEAR)
    rounds = _timed_replay(auto, FLAT, CONTEXT, 1.0, 160)
    assert rounds[0] == ("plain", 0)  # the profile says nothing can pay
    assert all(m == "lookup" and k >= 4 for m, k in rounds[-40:])  # until real rounds show otherwise
    first_lookup = next(i for i, (m, _) in enumerate(rounds) if m == "lookup")
    assert first_lookup <= 40  # an exploratory round, at most one per explore_every = 32


def test_the_correction_is_kept_by_the_pair_across_generations_and_forgotten_with_its_profile(make_pair):
    pair = make_pair(FLAT)
    pair.generate(PROMPTS[1], max_tokens=40, method="auto")
    seen = pair.cost_correction.evidence(1) + sum(pair.cost_correction.evidence(n) for n in range(2, 10))
    assert seen > 0  # the generation's rounds were timed
    pair.generate(PROMPTS[1], max_tokens=40, method="auto")
    assert pair.cost_correction.evidence(1) + sum(pair.cost_correction.evidence(n) for n in range(2, 10)) > seen
    pair.set_profile(LINEAR)
    assert pair.cost_correction.evidence(1) == 0


def test_batches_get_their_own_measured_thread_count_and_the_peers_the_same_budget(tiny_dir, tmp_path, monkeypatch):
    from localspec.bench.peers import PeerRunner

    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    with localspec.load(tiny_dir / "target.gguf", n_ctx=512) as pair:
        pair.choose_threads()
        choice = pair.thread_choice
        assert sorted(choice.batch_seconds) == list(range(1, default_threads() + 1))
        assert choice.batch_threads == min(choice.batch_seconds, key=lambda n: choice.batch_seconds[n])
        assert (pair.target.n_threads, pair.target.n_threads_batch) == (choice.threads, choice.batch_threads)
    with localspec.load(tiny_dir / "target.gguf", n_ctx=512, n_threads=2, n_threads_batch=1) as pair:
        assert pair.choose_threads() == {} and (pair.target.n_threads, pair.target.n_threads_batch) == (2, 1)
        peers = PeerRunner(pair.target)
        try:
            assert (peers.settings["n_threads"], peers.settings["n_threads_batch"]) == (2, 1)  # the same budget
        finally:
            peers.close()
    r = run_cli(["calibrate", "-t", str(tiny_dir / "target.gguf"), "--threads", "2",
                                 "--threads-batch", "1", "--json"])
    data = json.loads(r.stdout)
    assert (data["threads"], data["threads_batch"]) == (2, 1)
    r = run_cli(["calibrate", "-t", str(tiny_dir / "target.gguf")])
    assert "threads for steps:" in r.output and "threads for batches of 9:" in r.output


def test_a_cache_that_no_longer_holds_is_measured_again_and_a_busy_measurement_is_kept_with_its_mark(
        tiny_dir, tmp_path, monkeypatch):
    from localspec.drafting import calibration

    cache = tmp_path / "cal.json"
    notices: list[str] = []
    with Model(tiny_dir / "target.gguf", n_ctx=512) as t:
        choice = calibration.choose_threads(t, cache_file=cache, notify=notices.append)
        profile = calibrate(t, None, cache_file=cache, notify=notices.append)
        assert calibrate(t, None, cache_file=cache).source == "cache"  # a few steps confirm it
        store = json.loads(cache.read_text())
        for rec in store.values():  # as if measured on a machine ten times slower (or while it was busy)
            if "step_seconds" in rec:
                rec["step_seconds"] = {n: 10 * s + 0.01 for n, s in rec["step_seconds"].items()}
            else:
                rec["verify"] = [10 * v + 0.01 for v in rec["verify"]]
        cache.write_text(json.dumps(store))
        notices.clear()
        again = calibration.choose_threads(t, cache_file=cache, notify=notices.append)
        assert any("no longer holds" in n for n in notices) and again.step_seconds != choice.step_seconds
        fresh = calibrate(t, None, cache_file=cache, notify=notices.append)
        assert fresh.source == "measured" and any("cost profile no longer holds" in n for n in notices)
        assert fresh.verify[0] < profile.verify[0] + 0.01
        # A measurement whose repetitions disagree is used, said, and cached with its mark (measuring again at
        # every start would cost more than it saves; a start that finds steps faster measures again, above).
        monkeypatch.setattr(calibration, "busy", lambda times: True)
        busy_cache = tmp_path / "busy.json"
        notices.clear()
        calibration.choose_threads(t, cache_file=busy_cache, notify=notices.append)
        assert calibrate(t, None, cache_file=busy_cache, notify=notices.append).source == "measured, busy"
        assert sum("looked busy" in n for n in notices) == 2
        assert [rec["busy"] for rec in json.loads(busy_cache.read_text()).values()] == [True, True]
        assert calibrate(t, None, cache_file=busy_cache).source == "cache"  # the next start does not measure


class _Machine:
    """Stand-in timings for the thread sweep and its checks: seconds per step and per batch at each count."""

    def __init__(self, steps: dict[int, float], batches: dict[int, float], busy: bool):
        self.steps, self.batches, self.busy, self.sweeps, self.checked = steps, batches, busy, 0, []

    def measure_threads(self, target, max_threads, steps=7):
        self.sweeps += 1
        return dict(self.steps), dict(self.batches), self.busy

    def step_seconds(self, target, threads=None, reps=3):
        self.checked.append(("step", threads))
        return self.steps[threads]

    def batch_seconds(self, target, threads=None, reps=3):
        self.checked.append(("batch", threads))
        return self.batches[threads]


def _stand_in(monkeypatch, machine: _Machine) -> None:
    from localspec.drafting import calibration

    for name in ("measure_threads", "step_seconds", "batch_seconds"):
        monkeypatch.setattr(calibration, name, getattr(machine, name))


@pytest.mark.skipif(default_threads() < 2, reason="one core: there is no other thread count to prefer")
def test_a_busy_first_thread_measurement_is_not_kept_once_a_quiet_start_finds_another_count_faster(
        tiny_dir, tmp_path, monkeypatch):
    """The first sweep ran beside a program busy on one core: one thread looked four times faster than all
    cores. A later, quiet start re-times the chosen count (faster than then, within the tolerance) and its
    rivals, finds all cores twice as fast, and measures again."""
    from localspec.drafting import calibration

    cores = default_threads()
    cache = tmp_path / "cal.json"
    notices: list[str] = []
    busy_first = _Machine({n: 0.1005 if n == 1 else 0.3904 for n in range(1, cores + 1)},
                          {n: 0.30 if n == 1 else 0.90 for n in range(1, cores + 1)}, busy=True)
    quiet = _Machine({n: 0.079 if n == 1 else 0.040 for n in range(1, cores + 1)},
                     {n: 0.25 if n == 1 else 0.14 for n in range(1, cores + 1)}, busy=False)
    with Model(tiny_dir / "target.gguf", n_ctx=512) as t:
        _stand_in(monkeypatch, busy_first)
        assert calibration.choose_threads(t, cache_file=cache, notify=notices.append).threads == 1
        _stand_in(monkeypatch, quiet)
        again = calibration.choose_threads(t, cache_file=cache, notify=notices.append)
        assert (again.threads, again.batch_threads, quiet.sweeps) == (cores, cores, 1)
        assert any(f"at {cores} threads" in n and "no longer holds" in n for n in notices)
        quiet.checked.clear()
        # The quiet choice is confirmed by a few steps at its rivals, and kept.
        assert calibration.choose_threads(t, cache_file=cache).threads == cores and quiet.sweeps == 1
        assert ("step", cores) in quiet.checked and ("step", 1) in quiet.checked
        assert not any(kind == "batch" for kind, _ in quiet.checked)  # batches only rechecked after a busy sweep


@pytest.mark.skipif(default_threads() < 2, reason="one core: there is no other thread count to prefer")
def test_a_busy_choice_whose_steps_hold_is_still_measured_again_when_its_batch_count_is_beaten(
        tiny_dir, tmp_path, monkeypatch):
    from localspec.drafting import calibration

    cores = default_threads()
    cache = tmp_path / "cal.json"
    steps = {n: 0.05 if n == cores else 0.08 for n in range(1, cores + 1)}
    first = _Machine(steps, {n: 0.2 if n == 1 else 0.6 for n in range(1, cores + 1)}, busy=True)
    later = _Machine(steps, {n: 0.2 if n == 1 else 0.1 for n in range(1, cores + 1)}, busy=False)
    with Model(tiny_dir / "target.gguf", n_ctx=512) as t:
        _stand_in(monkeypatch, first)
        assert calibration.choose_threads(t, cache_file=cache).batch_threads == 1
        _stand_in(monkeypatch, later)
        assert calibration.choose_threads(t, cache_file=cache).batch_threads == cores and later.sweeps == 1
        later.sweeps = 0
        # Not busy any more and the steps hold: the next start does not time batches, nor sweep.
        assert calibration.choose_threads(t, cache_file=cache).batch_threads == cores and later.sweeps == 0


def test_a_measurement_while_other_programs_keep_the_cores_busy_is_used_and_marked(tiny_dir, tmp_path,
                                                                                  monkeypatch):
    """Steady contention slows every repetition alike, so only a look at what else runs can tell."""
    import subprocess
    import sys

    from localspec.drafting import calibration

    loadavg = tmp_path / "loadavg"
    loadavg.write_text("0.10 0.20 0.30 1/90 1234\n")  # only the reader runs
    assert calibration.others_running.__module__ == "conftest"  # the autouse stand-in
    monkeypatch.setattr(calibration, "others_running", functools.partial(REAL_OTHERS_RUNNING, loadavg))
    assert not calibration.contended(1)
    loadavg.write_text("0.10 0.20 0.30 3/90 1234\n")  # two others
    assert calibration.contended(os.cpu_count() - 1) and not calibration.contended(os.cpu_count() - 2)
    assert REAL_OTHERS_RUNNING(tmp_path / "missing") is None  # not Linux: no judgement
    monkeypatch.setattr(calibration, "others_running", REAL_OTHERS_RUNNING)
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(0.5)
        cache = tmp_path / "cal.json"
        notices: list[str] = []
        with Model(tiny_dir / "target.gguf", n_ctx=512) as t:
            calibration.choose_threads(t, cache_file=cache, notify=notices.append)
            assert calibrate(t, None, cache_file=cache, notify=notices.append).source == "measured, busy"
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    assert sum("looked busy" in n for n in notices) == 2
    assert all(rec["busy"] for rec in json.loads(cache.read_text()).values())


def test_rounds_that_contradict_a_cached_profile_drop_it_for_the_next_load(tiny_dir, tmp_path, monkeypatch):
    from localspec.drafting.calibration import calibration_key
    from localspec.drafting.costs import CostCorrection, RoundTiming

    correction = CostCorrection()
    for _ in range(10):
        correction.observe(RoundTiming(1, 0.03))  # the machine is 1.5x slower than FLAT says, uniformly...
        correction.observe(RoundTiming(3, 1.5 * FLAT.verify_seconds(3)))
    assert correction.disagreement(FLAT) is None  # ...which changes no choice
    for _ in range(20):
        correction.observe(RoundTiming(5, 5 * 0.03))  # but verifying 5 tokens costs 5 steps, not 1.08
    n, shape = correction.disagreement(FLAT)
    assert n == 5 and shape > 4
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    with localspec.load(tiny_dir / "target.gguf", n_ctx=512, n_threads=1) as pair:
        pair.calibrate()  # measured and cached
    cache = tmp_path / "cache" / "calibration.json"
    notices: list[str] = []
    with localspec.load(tiny_dir / "target.gguf", n_ctx=512, n_threads=1) as pair:
        pair.notify = notices.append
        assert pair.calibrate().source == "cache"
        key = calibration_key(pair.target, None, 8)
        assert key in json.loads(cache.read_text())
        monkeypatch.setattr(CostCorrection, "disagreement", lambda self, profile: (5, 4.6))
    assert key not in json.loads(cache.read_text()) and any("measured again next time" in n for n in notices)


def test_a_seeded_sample_repeats_whatever_the_rounds_cost(make_pair):
    pair = make_pair(FLAT)
    first = pair.generate(PROMPTS[0], max_tokens=40, method="auto", temperature=1.0, seed=7).tokens
    for _ in range(20):  # real rounds' costs pile up in the pair's correction meanwhile
        pair.cost_correction.observe(localspec.drafting.costs.RoundTiming(9, 1.0))
    assert pair.generate(PROMPTS[0], max_tokens=40, method="auto", temperature=1.0, seed=7).tokens == first


def test_a_greedy_reply_with_a_seed_still_learns_from_real_costs(make_pair):
    # The bench seeds every run by its repetition, greedy ones too: a seed that draws nothing must not turn
    # the correction off, or the bench would measure an auto that never learns what rounds really cost.
    pair = make_pair(FLAT)
    pair.generate(PROMPTS[0], max_tokens=40, method="auto", temperature=0.0, seed=3)
    assert pair.cost_correction.evidence(1) + sum(pair.cost_correction.evidence(n) for n in range(2, 10)) > 0
    seen = pair.cost_correction.evidence(1)
    pair.generate(PROMPTS[0], max_tokens=40, method="auto", temperature=1.0, seed=3)
    assert pair.cost_correction.evidence(1) == seen  # a seeded sample decides by the profile alone


class _StuckEstimate(AcceptanceEstimate):
    """An acceptance estimate that never learns: a drafter whose guesses auto keeps over-rating (as when
    the first guessed token is scored right in plain rounds but the tokens after it are wrong)."""

    def update(self, drafted: int, kept: int) -> None:
        pass


class _Always(localspec.drafting.drafters.Drafter):
    name = "lookup"

    def propose(self, context, k, rng):
        return localspec.drafting.drafters.Draft([7] * k, None, "lookup")


def _overrated_auto(correction):
    from localspec.drafting.candidates import Candidate
    from localspec.methods import LOOKUP

    auto = AutoDrafter(MODEST, [Candidate(LOOKUP, _Always(), {0: _StuckEstimate(0.9)})], kmax=8,
                       correction=correction)
    auto.prefill(CONTEXT)  # a generation starts
    return auto


def _kept_replay(auto, kept_of, rounds, rng):
    """Rounds on a machine that costs what MODEST says, keeping ``kept_of(k, rng)`` of each k-token draft."""
    from localspec.drafting.costs import RoundTiming

    chosen = []
    for _ in range(rounds):
        n = len(auto.propose(CONTEXT, 8, rng).tokens)
        auto.observe(n, kept_of(n, rng))
        auto.observe_timing(RoundTiming(n + 1, MODEST.verify_seconds(n + 1)))
        chosen.append(n)
    return chosen


# Verification cheap enough that an acceptance of 0.9 predicts a gain of about 1.8x.
MODEST = CostProfile.synthetic([1.0, 1.3, 1.6, 1.9, 2.2, 2.5, 2.8, 3.1, 3.4], 0.5, name="modest")


def test_a_method_that_keeps_delivering_less_than_it_was_chosen_for_is_held_to_a_higher_bar():
    from localspec.drafting.costs import CostCorrection

    rng = np.random.default_rng(0)
    never = lambda n, rng: 0  # noqa: E731  # every guess wrong, though the estimate says 0.9
    # Without the realized gain, the over-rated drafter is chosen in every round.
    blind = _kept_replay(_overrated_auto(None), never, 60, rng)
    assert all(n > 0 for n in blind)
    correction = CostCorrection()
    seen = _kept_replay(_overrated_auto(correction), never, 60, rng)
    assert sum(n > 0 for n in seen[:12]) >= 2
    assert [n for n in seen[20:] if n] in ([], [1])  # but for one exploratory K=1 look
    assert correction.gain_factor("lookup") < 0.65
    # The next generation starts from half the evidence and tries again before long; evidence fades.
    again = _kept_replay(_overrated_auto(correction), never, 30, rng)
    assert 0 < sum(n > 0 for n in again) <= 6


def test_a_method_that_delivers_what_it_was_chosen_for_keeps_its_bar():
    from localspec.drafting.costs import CostCorrection

    rng = np.random.default_rng(1)

    def geometric(n, rng):  # acceptance really is 0.9 per token
        kept = 0
        while kept < n and rng.random() < 0.9:
            kept += 1
        return kept

    correction = CostCorrection()
    for _ in range(5):  # generations that share the pair's correction
        rounds = _kept_replay(_overrated_auto(correction), geometric, 40, rng)
        assert sum(n > 0 for n in rounds) >= 38
    assert correction.gain_factor("lookup") > 0.95


def test_the_gain_factor_ignores_a_few_unlucky_rounds():
    from localspec.drafting.costs import CostCorrection

    c = CostCorrection()
    assert c.gain_factor("lookup") == 1.0
    c.observe_gain("lookup", 3.0, 2.0, 4, 2.0)
    c.observe_gain("lookup", 3.0, 2.0, 1, 2.0)  # two rounds of four at a third of their prediction
    c.observe_gain("lookup", 3.0, 2.0, 4, 2.0)
    c.observe_gain("lookup", 3.0, 2.0, 1, 2.0)
    assert c.gain_factor("lookup") == 1.0
    for _ in range(20):  # then twenty rounds that give half what they were chosen for
        c.observe_gain("lookup", 3.0, 2.0, 1, 1.3)
    assert 0.5 < c.gain_factor("lookup") < 0.75
    assert c.gain_factor("draft") == 1.0  # methods are judged apart


def test_the_gain_factor_leaves_a_method_near_the_margin_alone():
    # A real acceptance estimate, chosen when it is high: the rounds auto picks deliver a little less than
    # predicted (it picks on lucky estimates), which must not rule out a method that pays.
    from localspec.drafting.candidates import Candidate
    from localspec.drafting.costs import CostCorrection
    from localspec.methods import LOOKUP

    def geometric(alpha):
        def kept_of(n, rng):
            kept = 0
            while kept < n and rng.random() < alpha:
                kept += 1
            return kept
        return kept_of

    for alpha in (0.5, 0.6):
        drafted = {}
        for correction in (None, CostCorrection()):
            rng = np.random.default_rng(3)
            total = 0
            for _ in range(6):
                auto = AutoDrafter(MODEST, [Candidate(LOOKUP, _Always(), {0: AcceptanceEstimate(0.6)})], kmax=8,
                                   correction=correction)
                auto.prefill(CONTEXT)
                total += sum(n > 0 for n in _kept_replay(auto, geometric(alpha), 150, rng))
            drafted[correction is None] = total
        assert drafted[False] >= 0.85 * drafted[True], (alpha, drafted)


class _Oracle(localspec.drafting.drafters.Drafter):
    """Guesses ``right`` tokens of what the output will be, then wrong ones."""

    name = "lookup"

    def __init__(self, output, right):
        self.output, self.right = output, right

    def propose(self, context, k, rng):
        at = len(context) - len(CONTEXT)
        guess = [int(t) for t in self.output[at: at + k]]
        wrong = [t if i < self.right else t + 1 for i, t in enumerate(guess)]
        return localspec.drafting.drafters.Draft(wrong, None, "lookup")


def test_guesses_sat_out_are_scored_as_the_round_would_have_scored_them():
    # On a dear machine auto decodes plainly and scores lookup's unused guesses. A guesser whose first
    # token is always right and the next always wrong keeps one of every draft: its estimate must say
    # about 0.5, not the 1.0 that scoring the first token alone would give; one that copies keeps all.
    from localspec.drafting.candidates import Candidate
    from localspec.methods import LOOKUP

    output = np.arange(100, 200, dtype=np.int32)
    for right, low, high in ((1, 0.35, 0.6), (8, 0.95, 1.0)):
        est = AcceptanceEstimate(0.6)
        auto = AutoDrafter(CPU, [Candidate(LOOKUP, _Oracle(output, right), {0: est})], kmax=8)
        context = CONTEXT.copy()
        rng = np.random.default_rng(0)
        while len(context) - len(CONTEXT) < 60:
            at = len(context) - len(CONTEXT)
            draft = auto.propose(context, 8, rng)
            kept = next((j for j, t in enumerate(draft.tokens) if t != output[at + j]), len(draft.tokens))
            auto.observe(len(draft.tokens), kept)
            context = np.concatenate([context, output[at: at + kept + 1]])
        assert low <= est.alpha <= high, (right, est.alpha)


class _Grammar:
    """Stands in for a grammar's state: allows the first ``allowed`` tokens of any guess."""

    def __init__(self, allowed):
        self.allowed = allowed

    def valid_prefix(self, tokens):
        return min(self.allowed, len(tokens))


def test_auto_under_a_grammar_weighs_the_allowed_part_of_a_guess_and_the_forced_tokens_before_it():
    from localspec.drafting.candidates import Candidate
    from localspec.drafting.drafters import DraftGuide
    from localspec.methods import LOOKUP

    rng = np.random.default_rng(0)

    def auto(profile):
        return AutoDrafter(profile, [Candidate(LOOKUP, _Always(), {0: AcceptanceEstimate(0.9, 1000)})], kmax=8)

    a = auto(GPU)
    assert len(a.propose(CONTEXT, 8, rng).tokens) == 8
    assert a.propose_guided(CONTEXT, 8, rng, DraftGuide(_Grammar(3))).tokens == [7, 7, 7]  # the part allowed
    assert a.propose_guided(CONTEXT, 8, rng, DraftGuide(_Grammar(0))).tokens == []  # nothing allowed: plain
    assert a.report().rounds["lookup"] == 2 and a.report().rounds["plain"] == 1
    # compute-bound: the guess pays alone, not after 6 forced tokens; that round is the grammar's, not plain's
    a = auto(CPU)
    assert a.propose_guided(CONTEXT, 8, rng, DraftGuide(_Grammar(8))).tokens
    assert a.propose_guided(CONTEXT[:-6], 2, rng, DraftGuide(_Grammar(8), forced=6)).tokens == []
    assert a.report().rounds["plain"] == 0 and sum(a.report().rounds.values()) == 1


# One CPU thread of the 2-core test machine: only a guess kept almost whole could pay.
ONE_THREAD = CostProfile.synthetic([1.0, 1.99, 2.96, 3.69, 4.41, 5.29, 6.38, 8.29, 8.94], 0.55, name="one-thread")


def test_no_estimate_is_trusted_beyond_the_acceptance_ceiling():
    from localspec.drafting.candidates import Candidate
    from localspec.drafting.estimates import ALPHA_CEILING
    from localspec.methods import LOOKUP

    def auto(profile):
        a = AutoDrafter(profile, [Candidate(LOOKUP, _Always(), {0: _StuckEstimate(0.99)})], kmax=8)
        a.prefill(CONTEXT)
        return a

    rng = np.random.default_rng(0)
    # 0.99 would promise 4.9 tokens for 4.41 steps here, past the bar; at the ceiling no draft pays
    assert best_k(ONE_THREAD, "lookup", 0.99, 8)[0] > 0 and best_k(ONE_THREAD, "lookup", ALPHA_CEILING, 8)[0] == 0
    assert not any(auto(ONE_THREAD).propose(CONTEXT, 8, rng).tokens for _ in range(20))
    # where the ceiling still pays, the same guesser drafts, and the choice reports what it was decided by
    modest = auto(MODEST)
    assert len(modest.propose(CONTEXT, 8, rng).tokens) > 0
    assert all(change.alpha <= ALPHA_CEILING for change in modest.report().changes)


def test_a_draft_one_longer_is_tried_until_its_cost_is_known_where_it_pays_anyway():
    from localspec.drafting.candidates import Candidate
    from localspec.drafting.costs import CostCorrection, RoundTiming
    from localspec.methods import LOOKUP

    # K = 1 is best here (1.61x at the ceiling), K = 2 pays too (1.40x), K = 3 barely (1.20x)
    steep = CostProfile.synthetic([1.0, 1.2, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], 0.5, name="steep")

    def ks(correction, rounds=12):
        auto = AutoDrafter(steep, [Candidate(LOOKUP, _Always(), {0: _StuckEstimate(0.99)})], kmax=8,
                           correction=correction)
        auto.prefill(CONTEXT)
        rng, out = np.random.default_rng(0), []
        for _ in range(rounds):
            n = len(auto.propose(CONTEXT, 8, rng).tokens)
            auto.observe(n, n)
            auto.observe_timing(RoundTiming(n + 1, steep.verify_seconds(n + 1)))
            out.append(n)
        return out

    learning = ks(CostCorrection())
    assert learning[0] == 2 and learning[-4:] == [1, 1, 1, 1]  # timed a few times, then the best K again
    assert sum(k == 2 for k in learning) <= 5 and 3 not in learning  # one longer, not more
    assert ks(None) == [1] * 12  # without a correction there is nothing to learn
