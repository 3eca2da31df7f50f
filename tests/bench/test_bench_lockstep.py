"""The bench's lockstep mode: a repetition's rows side by side, a token of each in turn, each timing its own steps."""

from __future__ import annotations

import time

import pytest
from clirun import run_cli

import localspec.bench.runner as runner
from localspec.bench import BenchPrompt, MethodSpec, run_bench
from localspec.bench.structured import prepare
from localspec.errors import ConfigError
from localspec.events import GenerationStats

PROMPTS = [BenchPrompt("free", text="The cat sat on the mat and the dog sat on the", name="free#1")]
ROWS = [MethodSpec("plain"), MethodSpec("auto", 8), MethodSpec("llama-cpp-python"),
        MethodSpec("llama-cpp-python-lookup", 2)]


class _Fake:
    """A run of ``n`` tokens that notes each step in a shared log, and sleeps ``seconds`` in each."""

    def __init__(self, name: str, n: int, log: list[str], seconds: float = 0.0):
        self.name, self.left, self.log, self.seconds = name, n, log, seconds

    def advance(self) -> bool:
        assert self.left > 0, "advanced after it ended"
        self.log.append(self.name)
        time.sleep(self.seconds)
        self.left -= 1
        return self.left > 0

    def outcome(self) -> tuple[list[int], GenerationStats]:
        return [], GenerationStats("plain", 0)


def test_lockstep_takes_a_token_of_each_run_in_turn_until_each_has_ended():
    log: list[str] = []
    runner.lockstep([_Fake("a", 3, log), _Fake("b", 1, log), _Fake("c", 2, log)])
    assert log == ["a", "b", "c", "a", "c", "a"]


def test_a_run_in_lockstep_times_its_own_steps_and_not_the_others(tiny_pair):
    """localspec's and llama-cpp-python's runs, each beside a run that takes 100 ms a step, keep their own speed."""
    from localspec.bench.peers import PeerRunner

    prompt = prepare(tiny_pair, PROMPTS[0], peers=True)
    peers = PeerRunner(tiny_pair.target)
    try:
        for spec in (ROWS[0], ROWS[2]):
            alone = runner.generate(tiny_pair, peers, prompt, spec, 0.0, 0, 12, 1.0)
            ours = runner.start(tiny_pair, peers, prompt, spec, 0.0, 0, 12, 1.0)
            runner.lockstep([ours, _Fake("slow", 12, [], seconds=0.1)])
            tokens, stats = ours.outcome()
            assert tokens == alone[0] and len(tokens) == 12
            # 11 steps of a tiny model beside the slow run's 12 x 100 ms: none of its time is counted as this run's
            assert stats.decode_seconds < 0.5 and stats.generated_tokens == 12
            assert stats.prefill_seconds > 0
    finally:
        peers.close()


def test_a_lockstep_bench_runs_every_row_on_models_of_its_own_with_the_same_tokens(tiny_pair):
    report = run_bench(tiny_pair, PROMPTS, ROWS, reps=2, max_tokens=16, checksums=False, lockstep=True)
    assert report.settings["lockstep"] is True and report.mismatches == 0
    assert {r.method for r in report.rows} == {s.method for s in ROWS}
    for row in report.rows:  # exact against both plain decodings, and every ratio measured
        assert row.exactness in ("reference", "identical", "tie")
        assert row.exactness_peer in ("reference", "identical", "tie") and row.speedup_peer > 0
    assert tiny_pair.generate("The cat", max_tokens=4, method="plain").tokens  # the pair is whole afterwards
    sequential = run_bench(tiny_pair, PROMPTS, ROWS, reps=1, max_tokens=16, checksums=False)
    assert sequential.settings["lockstep"] is False and sequential.mismatches == 0


def test_lockstep_runs_two_lengths_of_llama_cpp_pythons_lookup_side_by_side_and_refuses_a_row_twice(tiny_pair):
    rows = [*ROWS, MethodSpec("llama-cpp-python-lookup", 10)]
    report = run_bench(tiny_pair, PROMPTS, rows, reps=1, max_tokens=8, checksums=False, lockstep=True)
    assert report.mismatches == 0 and len(report.rows) == len(rows)
    with pytest.raises(ConfigError, match="each row once"):
        run_bench(tiny_pair, PROMPTS, [*ROWS, ROWS[1]], reps=1, max_tokens=4, checksums=False, lockstep=True)


def test_a_row_that_fails_in_lockstep_ends_the_others_before_their_models_close(tiny_pair, monkeypatch):
    started = []
    real = runner.start

    class Failing:
        def __init__(self, run, fails):
            self.run, self.fails, self.steps, self.closed = run, fails, 0, False
            started.append(self)

        def advance(self):
            self.steps += 1
            if self.fails and self.steps == 3:
                raise RuntimeError("a row failed")
            return self.run.advance()

        def outcome(self):
            return self.run.outcome()

        def close(self):
            self.closed = True
            self.run.close()

    def starting(pair, peers, prompt, spec, temperature, seed, max_tokens, top_p):
        run = real(pair, peers, prompt, spec, temperature, seed, max_tokens, top_p)
        return run if max_tokens < 24 else Failing(run, spec.method == "auto")  # the warm-ups go through

    monkeypatch.setattr(runner, "start", starting)
    with pytest.raises(RuntimeError, match="a row failed"):
        run_bench(tiny_pair, PROMPTS, ROWS, reps=1, max_tokens=24, checksums=False, lockstep=True)
    assert len(started) == len(ROWS) and all(run.closed for run in started)
    assert all(run.steps >= 3 for run in started[:2])  # they were under way, side by side
    assert tiny_pair.generate("The cat", max_tokens=4, method="auto").tokens  # the pair is whole afterwards


def test_one_after_another_each_row_is_warmed_up_just_before_it_runs(tiny_pair, monkeypatch):
    calls = []
    real = runner.generate

    def noting(pair, peers, prompt, spec, temperature, seed, max_tokens, top_p):
        calls.append((spec.method, "warm-up" if max_tokens < 24 else "run"))
        return real(pair, peers, prompt, spec, temperature, seed, max_tokens, top_p)

    monkeypatch.setattr(runner, "generate", noting)
    run_bench(tiny_pair, PROMPTS, [MethodSpec("plain"), MethodSpec("lookup", 2)], reps=1, max_tokens=24,
              checksums=False)
    assert calls == [("plain", "warm-up"), ("plain", "run"), ("lookup", "warm-up"), ("lookup", "run")]


def test_the_lockstep_option(tiny_dir, tmp_path):
    suite = tmp_path / "s.jsonl"
    suite.write_text('{"category": "free", "prompt": "The cat sat on the mat and the dog"}\n')
    base = ["bench", "-t", str(tiny_dir / "target.gguf"), "--suite", str(suite), "-n", "8", "--k-lookup", "none",
            "--k-lcp-lookup", "2", "--lockstep"]
    r = run_cli([*base, "--reps", "2"])
    assert r.exit_code == 0, r.output
    assert "in lockstep" in r.output and "lcp lookup k=2" in r.output and "auto" in r.output
    assert "In lockstep: each repetition ran its rows side by side" in r.output  # the table says so too
    r = run_cli([*base, "--related"])
    assert r.exit_code == 2 and "--related" in r.output and "--lockstep" in r.output
