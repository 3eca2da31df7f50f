"""localspec bench: suite loading, run order, exactness verdicts, JSON and plot output."""

from __future__ import annotations

import json

import pytest
from clirun import run_cli

import localspec.decoding.rounds
from localspec.bench import (
    BenchPrompt,
    MethodSpec,
    Run,
    classify,
    default_methods,
    load_suite,
    run_bench,
    schedule,
)
from localspec.bench.summary import summarise
from localspec.drafting.costs import CostProfile
from localspec.drafting.drafters import Draft
from localspec.errors import ConfigError
from localspec.events import GenerationStats


def test_builtin_suite_covers_the_kinds_of_text_speculation_depends_on():
    cats = {p.category for p in load_suite()}
    assert {"code-write", "code-edit", "rewrite", "doc-qa", "summarize", "json-extract", "prose",
            "explain"} <= cats
    quick = load_suite(quick=True)
    assert 3 <= len(quick) <= 5 and {"code-edit", "rewrite"} <= {p.category for p in quick}
    # a copy-heavy rewrite (fix the spelling) and a free one (reword), a quoting and a short-answer doc-qa
    assert [p.name for p in load_suite(categories=["rewrite", "doc-qa"])] == ["rewrite#1", "rewrite#2", "doc-qa#1",
                                                                           "doc-qa#2"]


def test_user_suite_and_its_errors_name_file_and_line(tmp_path):
    good = tmp_path / "s.jsonl"
    good.write_text('{"category": "a", "prompt": "x"}\n\n{"category": "b", "messages": '
                    '[{"role": "user", "content": "y"}]}\n{"category": "a", "prompt": "z"}\n')
    suite = load_suite(good)
    assert [p.name for p in suite] == ["a#1", "b#1", "a#2"]
    assert [p.name for p in load_suite(good, quick=True)] == ["a#1", "b#1"]  # first per category
    for text, needle in [('{"category": "a"}', "exactly one of"), ("{oops", "not valid JSON"),
                         ('{"prompt": "x"}', "category"), ('{"category": "a", "messages": "hi"}', "messages")]:
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"category": "a", "prompt": "x"}\n' + text + "\n")
        with pytest.raises(ConfigError, match="bad.jsonl, line 2") as err:
            load_suite(bad)
        assert needle in str(err.value)
    with pytest.raises(ConfigError, match="No prompts"):
        load_suite(good, categories=["nope"])


def test_repetitions_are_interleaved_and_no_method_always_follows_the_same_one():
    specs = [MethodSpec("plain"), MethodSpec("lcp-plain"), MethodSpec("lookup", 2), MethodSpec("draft", 1),
             MethodSpec("auto", 8)]
    for m in (1, 2, 3, 4, 5):
        methods = specs[:m]
        order = schedule(2, methods, reps=2 * m)
        assert [(p, r) for p, r, _ in order] == [(p, r) for p in range(2) for r in range(2 * m) for _ in range(m)]
        assert order[: 2 * m * m] == [(0, r, s) for _, r, s in order[2 * m * m:]]  # each prompt alike
        rows = [[s for _, r, s in order[: 2 * m * m] if r == rep] for rep in range(2 * m)]
        assert rows[0][0] == methods[0]  # the reference first
        for row in rows:  # every repetition runs every method once
            assert sorted(map(id, row)) == sorted(map(id, methods))
        for place in range(m):  # over m repetitions, each method once in each place
            assert sorted(id(row[place]) for row in rows[:m]) == sorted(map(id, methods))
        before: dict[int, set[int]] = {id(s): set() for s in methods}
        for row in rows:
            for a, b in zip(row, row[1:], strict=False):
                before[id(b)].add(id(a))
        # every method but one per repetition follows something, and none always the same one
        assert all(len(prev) >= min(2, m - 1) for prev in before.values())


def test_classify_identical_tie_and_mismatch():
    assert classify([1, 2, 3], [1, 2, 3], lambda i: 9.0) == ("identical", None)
    assert classify([1, 2, 3], [1, 5, 6], lambda i: 0.01) == ("tie", {"token": 1.0, "margin": 0.01})
    verdict, info = classify([1, 2, 3], [1, 2, 4], lambda i: 3.0)
    assert verdict == "MISMATCH" and info == {"token": 2.0, "margin": 3.0}
    assert classify([1, 2, 3], [1, 2], lambda i: 3.0)[0] == "MISMATCH"  # stopped early for no reason


QUICK = [BenchPrompt("copy", text="in the end, in the end, in the end, in the", name="copy#1"),
         BenchPrompt("free", text="The cat sat on the", name="free#1")]


def test_round_time_is_predicted_from_the_profile_and_from_this_runs_plain_step():
    # Calibrated: one step 100 ms, verifying 3 tokens 200 ms. This run's plain steps took 200 ms
    # (a busier machine), and a lookup run's 5 rounds, each verifying 3 tokens, took 450 ms each.
    profile = CostProfile([0.1, 0.15, 0.2], 0.0, 0.0, "cache")

    def stats(method: str, rounds: int, drafted: int, seconds: float) -> dict:
        st = GenerationStats(method, drafted, generated_tokens=rounds * (drafted + 1) + 1,
                             proposed_at=[0] * max(1, drafted), accepted_at=[0] * max(1, drafted),
                             decode_seconds=seconds)
        for _ in range(rounds):
            st.count_round(Draft([1] * drafted, None, method if drafted else ""), drafted)
        st.accepted = rounds * drafted
        return st.to_dict()

    runs = [Run("p", "code", "plain", 0, 0, 0.7, [], stats("plain", 10, 0, 2.0)),
            Run("p", "code", "lookup", 2, 0, 0.7, [], stats("lookup", 5, 2, 2.25))]
    plain, lookup = summarise(None, {}, runs, profile, 0.5)  # type: ignore[arg-type]  # sampled: no exactness
    assert (plain.round_ms, plain.round_ms_predicted, plain.round_ms_predicted_here) == (
        pytest.approx(200), pytest.approx(100), None)
    # From the profile: verify(3) = 200 ms. From this run's plain step: 200 ms x verify(3)/verify(1) = 400 ms.
    assert (lookup.round_ms, lookup.round_ms_predicted, lookup.round_ms_predicted_here) == (
        pytest.approx(450), pytest.approx(200), pytest.approx(400))


def test_run_bench_reports_every_method_and_exactness(tiny_pair):
    methods = default_methods(True, quick=True)
    report = run_bench(tiny_pair, QUICK, methods, reps=2, max_tokens=24, checksums=False)
    assert len(report.rows) == len(QUICK) * len(methods)
    assert report.mismatches == 0
    assert {"llama-cpp-python", "llama-cpp-python-lookup"} <= {m.method for m in methods}  # the peers run by default
    for row in report.rows:
        if row.method == "plain":
            assert row.exactness == "reference" and row.speedup == pytest.approx(1.0)
        else:
            assert row.exactness in ("identical", "tie")
            assert row.speedup_min <= row.speedup <= row.speedup_max
        if row.method == "llama-cpp-python":
            assert row.exactness_peer == "reference" and row.speedup_peer == pytest.approx(1.0)
        else:  # every row is also checked and timed against llama-cpp-python's own plain decoding
            assert row.exactness_peer in ("identical", "tie") and row.speedup_peer > 0
            assert row.speedup_peer_min <= row.speedup_peer <= row.speedup_peer_max
    assert report.settings["peer"]["n_threads"] == tiny_pair.target.n_threads
    assert report.machine["threads"] == tiny_pair.target.n_threads
    assert len(report.profile["verify"]) == 9
    for row in report.rows:  # every localspec method but plain gets both round-time predictions
        ours = row.method in ("lookup", "draft", "auto")
        assert (row.round_ms_predicted_here is not None) == ours
        assert (row.round_ms_predicted is not None) == (ours or row.method == "plain")


def test_a_broken_acceptance_rule_is_reported_as_a_mismatch(tiny_dir, monkeypatch, tmp_path):
    real = localspec.decoding.rounds.accept_greedy

    def sloppy(draft, rows):  # keeps one wrong drafted token now and then
        kept, nxt = real(draft, rows)
        return (kept + 1, int(rows[kept + 1].argmax())) if kept < len(draft) - 1 else (kept, nxt)

    monkeypatch.setattr(localspec.decoding.rounds, "accept_greedy", sloppy)
    suite = tmp_path / "s.jsonl"
    suite.write_text('{"category": "free", "prompt": "The cat sat on the mat and the dog"}\n')
    r = run_cli(["bench", "-t", str(tiny_dir / "target.gguf"), "-d", str(tiny_dir / "draft.gguf"),
                                 "--suite", str(suite), "--reps", "1", "-n", "40", "--k-lookup", "2",
                                 "--k-draft", "4", "--no-auto"])
    assert r.exit_code == 1
    assert "MISMATCH" in r.output and "bug" in r.output


def test_quick_bench_writes_table_json_and_png(tiny_dir, tmp_path):
    out_json, out_png = tmp_path / "b.json", tmp_path / "b.png"
    r = run_cli(["bench", "-t", str(tiny_dir / "target.gguf"), "-d", str(tiny_dir / "draft.gguf"),
                                 "--quick", "-n", "16", "--json", str(out_json), "--plot", str(out_png)])
    assert r.exit_code == 0, r.output
    assert "speedup" in r.output and "lookup k=2" in r.output and "auto" in r.output
    assert "lcp lookup k=10" in r.output and "over llama-cpp-python plain" in r.output
    assert "auto against the fastest llama-cpp-python row of each prompt" in r.output
    data = json.loads(out_json.read_text())
    assert {"rows", "profile", "machine", "settings", "mismatches"} <= set(data)
    row = data["rows"][1]
    for key in ("decode_tps", "speedup", "speedup_min", "speedup_max", "acceptance", "tokens_per_round",
                "acceptance_by_position", "predicted_speedup", "exactness", "prefill_seconds", "speedup_peer",
                "exactness_peer"):
        assert key in row
    m = data["machine"]
    for key in ("cpu", "threads", "gpu_layers", "llama_cpp_python", "models"):
        assert key in m
    assert len(m["models"]["target"]["sha256"]) == 64
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sampled_bench_has_no_exactness_verdict(tiny_pair):
    report = run_bench(tiny_pair, QUICK[:1], [MethodSpec("plain"), MethodSpec("lookup", 2)], reps=2,
                       max_tokens=16, temperatures=(0.0, 0.8), checksums=False)
    sampled = [r for r in report.rows if r.temperature == 0.8]
    assert len(sampled) == 2 and sampled[1].exactness == "-"


def test_the_suite_bench_neither_uses_nor_changes_the_users_history(make_pair):
    from localspec.drafting.history import HistoryStore

    pair = make_pair(CostProfile.synthetic([1.0 + 0.02 * n for n in range(9)], 0.1), history=True)  # drafting pays
    store = pair.history
    store.add(pair.tokenize(QUICK[0].text) + [5, 6, 7])  # something a run could draft from
    before = store.counts.records
    methods = default_methods(True, quick=True, peers=False, history_check=True)
    assert [m.label for m in methods][-2:] == ["auto -history", "auto"]
    report = run_bench(pair, QUICK, methods, reps=2, max_tokens=16, checksums=False)
    assert pair.history is store and HistoryStore(pair.target.path).counts.records == before
    assert {r.label for r in report.rows} >= {"auto", "auto -history"} and report.mismatches == 0
    for row in report.rows:  # an empty store per run: no repetition drafts from another's output
        assert not (row.auto_rounds or {}).get("history")


def test_related_bench_runs_requests_in_order_with_the_earlier_ones_history(make_pair, tmp_path):
    from localspec.bench import load_related, render_related, run_related

    builtin = load_related()
    assert {p.category for p in builtin} == {"reworded", "extract", "one-change"} and len(builtin) == 9
    # the same request twice: the second one can copy the first one's reply from history
    workload = [BenchPrompt("same", text="The cat sat on the", name="same#1"),
                BenchPrompt("same", text="The cat sat on the", name="same#2")]
    pair = make_pair(CostProfile.synthetic([1.0 + 0.02 * n for n in range(9)], 0.1))
    report = run_related(pair, workload, reps=2, max_tokens=40, checksums=False)
    first, second = report.rows
    assert first.history_drafted == 0 and second.history_accepted > 30
    assert first.exactness in ("identical", "tie") and second.exactness in ("identical", "tie")
    assert report.store["records"] == 2 and report.costs["lookup_us_median"] > 0
    table = render_related(report)
    assert "same#2" in table and "history lookup" in table
    assert pair.history is None  # the pair's own setting is back


def test_the_peer_lookup_rows_can_be_chosen_or_left_out(tiny_dir, tmp_path):
    suite = tmp_path / "s.jsonl"
    suite.write_text('{"category": "free", "prompt": "The cat sat on the mat and the dog"}\n')
    base = ["bench", "-t", str(tiny_dir / "target.gguf"), "--suite", str(suite), "--reps", "1", "-n", "8",
            "--k-lookup", "none", "--no-auto"]
    r = run_cli([*base, "--k-lcp-lookup", "3"])
    assert r.exit_code == 0, r.output
    assert "lcp lookup k=3" in r.output and "k=10" not in r.output and "lcp plain" in r.output
    r = run_cli([*base, "--k-lcp-lookup", "none"])
    assert r.exit_code == 0, r.output
    assert "lcp lookup" not in r.output and "lcp plain" in r.output
    r = run_cli([*base, "--k-lcp-lookup", "0"])
    assert r.exit_code == 2 and "--k-lcp-lookup" in r.output
    r = run_cli([*base, "--k-lcp-lookup", "3", "--no-peers"])  # refused, not ignored
    assert r.exit_code == 2 and "--no-peers" in r.output


def test_a_reasoning_models_rows_count_acceptance_inside_and_outside_the_reasoning(tmp_path):
    from chatdefs import OPENS, THINK_TOKENS
    from tinymodel import write_tiny_model

    from localspec import load
    from localspec.bench.render import render_table

    for name, noise in (("t.gguf", 0.0), ("d.gguf", 0.35)):
        write_tiny_model(tmp_path / name, seed=0, noise=noise, user_tokens=THINK_TOKENS, chat_template=OPENS)
    ask = BenchPrompt("chat", messages=[{"role": "user", "content": "in the end, in the end, in the"}], name="chat#1")
    methods = [MethodSpec("plain"), MethodSpec("lookup", 3), MethodSpec("draft", 4)]
    with load(tmp_path / "t.gguf", tmp_path / "d.gguf", n_ctx=1024, history=False) as pair:
        report = run_bench(pair, [ask, QUICK[0]], methods, reps=2, max_tokens=24, checksums=False)
    assert report.mismatches == 0
    for row in report.rows:
        if row.prompt == "copy#1":  # a raw prompt opens no reasoning: the split stays out of the row
            assert row.acceptance_in is None
            continue
        split = row.acceptance_in
        assert split is not None and "reasoning" in split, row.label
        totals = row.round_stats
        assert sum(n["drafted"] for n in split.values()) == totals["drafted"]
        assert sum(n["accepted"] for n in split.values()) == totals["accepted"]
        if row.method == "draft":
            assert split["reasoning"]["drafted"] > 0
    table = render_table(report)
    draft = next(r for r in report.rows if r.method == "draft" and r.prompt == "chat#1")
    inside = draft.acceptance_in["reasoning"]
    assert f"accepted reasoning {inside['accepted']}/{inside['drafted']}" in table
    assert "inside its reasoning and in its answer apart" in table


def test_a_drafting_kind_of_round_says_what_it_gained_over_plain_rounds():
    """Ten lookup rounds of 3 tokens at 80 ms gave what plain rounds of 40 ms a token would have given in 1.2 s:
    a gain of 400 ms; ten of 1.2 tokens at 80 ms lost 320 ms. A kind with nothing to compare says no gain."""
    from localspec.bench.render import _round_kind

    plain = {"rounds": 50, "tokens_per_round": 1.0, "ms": 40.0, "target_ms": 39.0, "draft_ms": 0.0}
    good = {"rounds": 10, "tokens_per_round": 3.0, "ms": 80.0, "target_ms": 78.0, "draft_ms": 0.0}
    bad = dict(good, tokens_per_round=1.2)
    assert _round_kind("auto: lookup", good, plain).endswith("gained +400 ms in all")
    assert _round_kind("auto: lookup", bad, plain).endswith("gained -320 ms in all")
    assert "gained" not in _round_kind("plain rounds", plain)
