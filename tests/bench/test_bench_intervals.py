"""The bench's confidence intervals, and its mode that repeats until they are narrow enough."""

from __future__ import annotations

import math
import re
import time

import numpy as np
import pytest
from clirun import run_cli

import localspec.bench.runner as runner
from localspec.bench import BenchPrompt, MethodSpec, Precision, Run, render_table, run_bench
from localspec.bench.intervals import ratio_interval, t95
from localspec.bench.summary import summarise, widest_interval
from localspec.drafting.costs import CostProfile
from localspec.events import GenerationStats


def test_t_quantiles_match_the_tables_and_tend_to_the_normal():
    with pytest.raises(ValueError):
        t95(0)
    assert t95(1) == pytest.approx(12.706) and t95(4) == pytest.approx(2.776) and t95(30) == pytest.approx(2.042)
    assert t95(31) == pytest.approx(2.040, abs=2e-3) and t95(60) == pytest.approx(2.000, abs=2e-3)
    assert t95(10_000) == pytest.approx(1.960, abs=1e-3)
    assert all(t95(df) > t95(df + 1) for df in range(1, 200))


@pytest.mark.parametrize("n", [3, 5, 12, 40])
def test_the_interval_covers_the_true_ratio_95_times_in_100(n):
    # Paired repetitions whose speed ratio is 1.05 times log-normal noise: the interval must hold 1.05
    # in 95% of experiments (a normal quantile in place of t would hold it in about 81% at n = 3, 88% at 5).
    rng = np.random.default_rng(n)
    trials = 4000
    held = 0
    for _ in range(trials):
        ratios = 1.05 * np.exp(rng.normal(0.0, 0.04, n))
        iv = ratio_interval(list(ratios))
        assert iv is not None and iv.low < iv.mean < iv.high
        held += iv.low <= 1.05 <= iv.high
    # binomial sd at 95% over 4000 trials is 0.34%; 0.93-0.97 is about 6 sd either side
    assert 0.93 < held / trials < 0.97


def test_interval_width_and_edge_cases():
    assert ratio_interval([1.1]) is None and ratio_interval([]) is None
    same = ratio_interval([1.2, 1.2, 1.2])
    assert same is not None and same.low == pytest.approx(1.2) and same.high == pytest.approx(1.2)
    iv = ratio_interval([0.9, 1.0, 1.1, 1.0])
    assert iv is not None and iv.width == pytest.approx((iv.high - iv.low) / iv.mean)
    assert str(iv) == f"{iv.low:.2f}-{iv.high:.2f}"
    # the interval is of the geometric mean: ratio 2 and ratio 1/2 average to 1
    assert ratio_interval([2.0, 0.5]).mean == pytest.approx(1.0)  # type: ignore[union-attr]


def _runs(prompt: str, speeds: dict[str, list[float]]) -> list[Run]:
    """Runs of 97 tokens at the given decode speeds, one per repetition per method."""
    out = []
    for method, per_rep in speeds.items():
        k = 2 if method == "llama-cpp-python-lookup" else 8 if method == "auto" else 0
        for rep, tps in enumerate(per_rep):
            st = GenerationStats(method, k, generated_tokens=97, rounds=96, decode_seconds=96 / tps)
            out.append(Run(prompt, "c", method, k, rep, 0.7, [], st.to_dict()))
    return out


def test_auto_is_set_against_the_fastest_peer_row_repetition_by_repetition():
    # On prompt a, lcp lookup is the fastest peer row; auto is 0.96x of it in every repetition, though
    # machine speed drifts between repetitions. On b, lcp plain is the fastest, and auto 1.04x of it.
    drift = [1.0, 0.8, 1.1, 0.9]
    runs = _runs("a", {"plain": [10 * d for d in drift], "llama-cpp-python": [10 * d for d in drift],
                       "llama-cpp-python-lookup": [12.5 * d for d in drift], "auto": [12 * d for d in drift]})
    runs += _runs("b", {"plain": [10 * d for d in drift], "llama-cpp-python": [10 * d for d in drift],
                        "llama-cpp-python-lookup": [7 * d for d in drift], "auto": [10.4 * d for d in drift]})
    rows = summarise(None, {}, runs, CostProfile([0.1, 0.15, 0.2], 0.0, 0.0, "cache"), 0.5)  # type: ignore[arg-type]
    auto = {r.prompt: r for r in rows if r.method == "auto"}
    assert auto["a"].vs_fastest_peer == pytest.approx(0.96) and auto["a"].fastest_peer == "lcp lookup k=2"
    assert auto["b"].vs_fastest_peer == pytest.approx(1.04) and auto["b"].fastest_peer == "lcp plain"
    low, high = auto["a"].vs_fastest_peer_interval  # type: ignore[misc]
    assert low == pytest.approx(0.96) and high == pytest.approx(0.96)  # paired: the drift cancels
    from localspec.bench import BenchReport

    text = render_table(BenchReport(rows=rows, settings={"methods": ["plain", "lcp plain", "lcp lookup k=2",
                                                                     "auto"]}))
    part = text[text.index("auto against the fastest"):]
    assert "0.96x (0.96-0.96)  (fastest: lcp lookup k=2)" in part
    assert "1.04x (1.04-1.04)  (fastest: lcp plain)" in part
    assert "median 1.00x, worst 0.96x; lowest interval bound 0.96x" in part
    assert widest_interval([r for r in runs if r.prompt == "a"]) == pytest.approx(0.0, abs=1e-9)


class _NoisySpeeds:
    """Wraps the bench's generate: real tokens from the tiny pair, decode time drawn with known noise.

    Every method decodes at the same true speed; each run's speed is that times log-normal noise.
    """

    def __init__(self, sigma: float, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.sigma = sigma
        self.calls = 0
        self.real = runner.generate

    def __call__(self, *args, **kwargs):
        out, stats = self.real(*args, **kwargs)
        self.calls += 1
        speed = 100.0 * math.exp(self.rng.normal(0.0, self.sigma))
        stats.decode_seconds = max(1, stats.generated_tokens - 1) / speed
        return out, stats


PROMPTS = [BenchPrompt("free", text="The cat sat on the", name="free#1")]
METHODS = [MethodSpec("plain"), MethodSpec("lookup", 2)]


def test_precision_mode_repeats_until_every_interval_is_narrow(tiny_pair, monkeypatch):
    noisy = _NoisySpeeds(sigma=0.05)
    monkeypatch.setattr(runner, "generate", noisy)
    seen = []
    report = run_bench(tiny_pair, PROMPTS, METHODS, reps=3, max_tokens=6, checksums=False,
                       precision=Precision(width=0.08, budget_seconds=600, max_reps=60),
                       on_prompt=lambda name, n, widest: seen.append((name, n, widest)))
    # ratio noise sd is 0.05 * sqrt(2) = 0.07: an interval 8% wide needs about (2 * 1.96 * 0.07 / 0.08)^2 = 12
    (name, n, widest), = seen
    assert name == "free#1" and 6 <= n <= 30 and widest <= 0.08
    assert report.settings["precision"] == {"width": 0.08, "budget_seconds": 600, "max_reps": 60}
    row = next(r for r in report.rows if r.method == "lookup")
    assert row.speedup_interval is not None
    mid = math.sqrt(row.speedup_interval[0] * row.speedup_interval[1])  # the geometric mean's, in log space
    assert row.speedup_interval[0] < 1.0 < row.speedup_interval[1]  # both decode at one true speed
    assert (row.speedup_interval[1] - row.speedup_interval[0]) / mid <= 0.08


def test_precision_mode_stops_at_the_budget_or_the_most_repetitions(tiny_pair, monkeypatch):
    monkeypatch.setattr(runner, "generate", _NoisySpeeds(sigma=0.05))
    seen: list[int] = []
    run_bench(tiny_pair, PROMPTS, METHODS, reps=3, max_tokens=6, checksums=False,
              precision=Precision(width=0.001, budget_seconds=600, max_reps=6),
              on_prompt=lambda name, n, widest: seen.append(n))
    run_bench(tiny_pair, PROMPTS, METHODS, reps=3, max_tokens=6, checksums=False,  # the width is judged from 5 on
              precision=Precision(width=0.001, budget_seconds=0.0, max_reps=50),
              on_prompt=lambda name, n, widest: seen.append(n))
    run_bench(tiny_pair, PROMPTS, METHODS, reps=2, max_tokens=6, checksums=False,  # no precision: just reps
              on_prompt=lambda name, n, widest: seen.append(n))
    assert seen == [6, 5, 2]


def test_the_budget_is_for_the_repetitions_past_the_least_ones(tiny_pair, monkeypatch):
    """A budget shorter than the first five repetitions still buys repetitions after them (it used to run
    out during them, so a slow model got none)."""
    noisy = _NoisySpeeds(sigma=0.05)

    def slow(*args, **kwargs):
        time.sleep(0.02)  # two methods: a repetition takes at least 0.04 s, the least five 0.2 s
        return noisy(*args, **kwargs)

    monkeypatch.setattr(runner, "generate", slow)
    seen: list[int] = []
    run_bench(tiny_pair, PROMPTS, METHODS, reps=3, max_tokens=6, checksums=False,
              precision=Precision(width=0.001, budget_seconds=0.15, max_reps=50),
              on_prompt=lambda name, n, widest: seen.append(n))
    assert 6 <= seen[0] <= 10


def test_bench_width_option(tiny_dir, tmp_path):
    suite = tmp_path / "s.jsonl"
    suite.write_text('{"category": "free", "prompt": "The cat sat on the mat and the dog"}\n')
    base = ["bench", "-t", str(tiny_dir / "target.gguf"), "--suite", str(suite), "-n", "8", "--k-lookup", "2",
            "--no-auto", "--no-peers"]
    r = run_cli([*base, "--reps", "3", "--width", "0.5", "--budget", "0.5"])
    assert r.exit_code == 0, r.output
    assert "until every interval is narrower than 50%" in r.output
    assert "free#1:" in r.output and "widest 95% interval" in r.output
    lookup_row = next(line for line in r.output.splitlines() if " lookup k=2 " in line)
    assert re.search(r"x \(\d\.\d\d-\d\.\d\d\)", lookup_row)  # its ratio to plain, with the interval
    r = run_cli([*base, "--width", "0"])
    assert r.exit_code == 2 and "--width" in r.output
    r = run_cli([*base, "--budget", "5"])
    assert r.exit_code == 2 and "give --width too" in r.output
