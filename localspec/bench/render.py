"""Bench reports as terminal tables and JSON."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Optional

from ..methods import PLAIN, REGISTRY
from ..reasoning.formats import REASONING
from .exactness import TIE_MARGIN
from .peers import PEER_METHODS, PEER_PLAIN
from .records import BenchReport, RelatedReport, Row
from .summary import adaptive


def render_table(report: BenchReport) -> str:
    """The report as a terminal table, with the cost profile on top."""
    peers = any(r.speedup_peer is not None for r in report.rows)
    out = _preamble(report, peers)
    header = (f"{'prompt':<15} {'temp':>4} {'method':<15} {'tok/s':>6} {'vs lcp':>6} {'(range)':>11} "
              f"{'vs plain':>8} {'(range)':>11} {'pred':>5} {'accept':>6} {'tok/rnd':>7} {'round ms':>15} "
              f"{'split':>14}  exactness (vs plain / vs lcp)")
    out += [header, "-" * len(header)]
    last_prompt = None
    for row in report.rows:
        out.append(_row(row, row.prompt if row.prompt != last_prompt else "", peers))
        last_prompt = row.prompt
    out += _medians(report, peers)
    out += _against_best_peer(report)
    out += _round_kinds(report)
    if report.mismatches:
        out.append(f"\n{report.mismatches} MISMATCH(ES) against plain decoding: this is a bug, please report it.")
    return "\n".join(out)


def _preamble(report: BenchReport, peers: bool) -> list[str]:
    """The cost profile, the thread budget, and what the columns mean."""
    p = report.profile
    verify = "  ".join(f"{n + 1}:{v:.2f}" for n, v in enumerate(p.get("verify", [])))
    out = [f"cost profile ({p.get('source')}): target step {1000 * p.get('step_seconds', 0):.1f} ms; "
           f"draft step / target step: {p.get('draft_step', 0):.2f}",
           f"verify n tokens / 1: {verify}",
           *_what_the_curve_allows(p.get("verify", [])),
           *_budget(report),
           f"batch-shape logit noise of this build: {p.get('batch_noise', 0):.3f} "
           f"(divergences below a {p.get('tie_margin', TIE_MARGIN):.3f} top-two margin count as ties)", ""]
    out.append("round ms: mean decode time per round, measured/predicted by the cost profile from the rounds' "
               "draft lengths (in brackets: predicted with this run's plain step in place of the calibrated one); "
               "split: its target + draft model + Python parts.")
    out.append("Ratios are medians over repetitions; the ranges after them are 95% intervals of the (geometric) "
               "mean ratio (t on the log ratios of paired repetitions), or min-max with fewer than three.")
    if report.settings.get("lockstep"):
        out.append("In lockstep: each repetition ran its rows side by side, a token of each in turn, each on models "
                   "of its own and timing only its own steps.")
    if report.settings.get("constrained"):
        out.append("Under a constraint (" + ", ".join(report.settings["constrained"]) + ") every row decodes under "
                   "it: localspec's by llguidance, lcp's by its own GBNF of the same schema, whose tokens are not "
                   "compared (the two may lay out whitespace differently); 'forced drafts': the share of the "
                   "tokens drafted for free because the grammar forced them.")
    if any(r.acceptance_in is not None for r in report.rows):
        out.append("From a reasoning model: 'accepted reasoning a/d, answer a/d' counts the drafted tokens accepted "
                   "inside its reasoning and in its answer apart (a round counts where it began).")
    if peers:
        out.append("lcp = llama-cpp-python's own Llama (plain, and its prompt-lookup draft), same file and threads; "
                   "'vs lcp' is the headline speedup, 'vs plain' is against localspec's plain path.")
    return out


def _row(row: Row, name: str, peers: bool) -> str:
    """One method on one prompt: speed, ratios with their ranges, acceptance, round times, exactness."""
    vs_peer = f"{row.speedup_peer:.2f}x" if row.speedup_peer is not None else "-"
    spread = _range(row.speedup_peer_interval, row.speedup_peer_min, row.speedup_peer_max, row.method != PEER_PLAIN)
    spread_plain = _range(row.speedup_interval, row.speedup_min, row.speedup_max, row.method != PLAIN.name)
    split = ("+".join(f"{row.round_split_ms[part]:.1f}" for part in ("target", "draft", "python"))
             if row.round_split_ms else "-")
    pred = f"{row.predicted_speedup:.2f}" if row.predicted_speedup is not None else "-"
    acc = f"{100 * row.acceptance:.0f}%" if getattr(REGISTRY.find(row.method), "build", None) else "-"
    tpr = f"{row.tokens_per_round:.2f}" if row.method not in PEER_METHODS else "-"
    verdict = row.exactness + (f" / {row.exactness_peer}" if peers else "")
    rms = (f"{row.round_ms:.0f}/{row.round_ms_predicted:.0f}"
           if row.round_ms is not None and row.round_ms_predicted is not None else "-")
    if row.round_ms_predicted_here is not None:
        rms += f" ({row.round_ms_predicted_here:.0f})"
    if row.divergence:
        verdict += f" @{int(row.divergence['token'])} (margin {row.divergence['margin']:.3f})"
    if row.forced_share is not None:
        verdict += f"  forced drafts {row.forced_share:.0%}"
    if row.acceptance_in is not None and getattr(REGISTRY.find(row.method), "build", None):
        verdict += "  accepted " + ", ".join(f"{phase} {n['accepted']}/{n['drafted']}" for phase, n in
                                             sorted(row.acceptance_in.items(), key=lambda kv: kv[0] != REASONING))
    if row.auto_rounds:
        verdict += "  [" + " ".join(f"{m}:{n}" for m, n in row.auto_rounds.items() if n) + "]"
    return (f"{name:<15} {row.temperature:>4.1f} {row.label:<15} "
            f"{row.decode_tps:>6.1f} {vs_peer:>6} {spread:>11} {row.speedup:>7.2f}x {spread_plain:>11} "
            f"{pred:>5} {acc:>6} {tpr:>7} {rms:>15} {split:>14}  {verdict}")


def _medians(report: BenchReport, peers: bool) -> list[str]:
    """Each method's median speedup across prompts, over llama-cpp-python plain and over localspec plain."""
    out: list[str] = []
    for title, attr in ((("median speedup over llama-cpp-python plain across prompts:", "speedup_peer"),) if peers
                        else ()) + (("median speedup over localspec plain across prompts:", "speedup"),):
        out += ["", title]
        for label in report.settings.get("methods", [])[1:]:
            values = [getattr(r, attr) for r in report.rows if r.label == label and getattr(r, attr) is not None]
            if values:
                out.append(f"  {label:<15} {statistics.median(values):.2f}x  (worst {min(values):.2f}x, "
                           f"best {max(values):.2f}x)")
    return out


def _against_best_peer(report: BenchReport) -> list[str]:
    """Auto against the fastest llama-cpp-python row of each prompt: what auto promises never to lose to."""
    out: list[str] = []
    adaptive = [r for r in report.rows if r.vs_fastest_peer is not None]
    for label in dict.fromkeys(r.label for r in adaptive):
        mine = [r for r in adaptive if r.label == label]
        out += ["", f"{label} against the fastest llama-cpp-python row of each prompt (median of repetitions, "
                    "95% interval):"]
        out += [f"  {r.prompt:<15} {r.temperature:>4.1f} {r.vs_fastest_peer:.2f}x "
                f"{_range(r.vs_fastest_peer_interval, None, None):>11}  (fastest: {r.fastest_peer})"
                for r in mine]
        values = [r.vs_fastest_peer or 0.0 for r in mine]
        lows = [r.vs_fastest_peer_interval[0] for r in mine if r.vs_fastest_peer_interval]
        out.append(f"  median {statistics.median(values):.2f}x, worst {min(values):.2f}x"
                   + (f"; lowest interval bound {min(lows):.2f}x" if lows else ""))
    return out


def _round_kinds(report: BenchReport) -> list[str]:
    """Where an adaptive row's time goes, by kind of round, beside plain's rounds on the same prompt."""
    out: list[str] = []
    for row in report.rows:
        if not adaptive(row.method) or not row.round_time_by:
            continue
        plain = next((r for r in report.rows if r.method == PLAIN.name and r.prompt == row.prompt
                      and r.temperature == row.temperature), None)
        if not out:
            out += ["", "Rounds by kind: how many, tokens per round, ms per token, and ms per round (whole = target + "
                        "draft model + the rest, which is Python), beside localspec plain's rounds on the same prompt; "
                        "a drafting kind's gain is what plain rounds would have taken for its tokens, less what its "
                        "rounds took, over all repetitions:"]
        base = (plain.round_time_by or {}).get(PLAIN.name) if plain is not None else None
        kinds: list[tuple[str, dict[str, float], Optional[dict[str, float]]]] = \
            [("plain rounds", base, None)] if base else []
        kinds += [(f"{row.label}: {kind}", t, None if kind == PLAIN.name else base)
                  for kind, t in row.round_time_by.items()]
        out.append(f"  {row.prompt:<15} {row.temperature:>4.1f} "
                   + "; ".join(_round_kind(name, t, against) for name, t, against in kinds if t))
    return out


def _round_kind(name: str, t: dict[str, float], against: Optional[dict[str, float]] = None) -> str:
    """One kind of round: how many, tokens and ms per round and per token, and (``against``: plain's rounds on
    the same prompt) what its rounds gained over giving their tokens by plain rounds, per repetition."""
    rest = t["ms"] - t["target_ms"] - t["draft_ms"]
    text = (f"{name} x{t['rounds']:.0f}, {t['tokens_per_round']:.2f} tok, {t['ms'] / t['tokens_per_round']:.1f} "
            f"ms/tok: {t['ms']:.1f} = {t['target_ms']:.1f} + {t['draft_ms']:.1f} + {rest:.2f}")
    if against:  # the same tokens by plain rounds, less what these rounds took
        gained = t["rounds"] * (t["tokens_per_round"] * against["ms"] / against["tokens_per_round"] - t["ms"])
        text += f", gained {gained:+.0f} ms in all"
    return text


def _range(interval: Optional[tuple[float, float]], low: Optional[float], high: Optional[float],
           shown: bool = True) -> str:
    """A ratio's 95% interval, or its min-max where there are too few repetitions for one."""
    if not shown:
        return ""
    if interval is not None:
        return f"({interval[0]:.2f}-{interval[1]:.2f})"
    return f"({low:.2f}-{high:.2f})" if low is not None and high is not None else ""


def _what_the_curve_allows(verify: list[float]) -> list[str]:
    """One line on what this verification curve lets drafting gain at best (every guess right)."""
    if len(verify) < 4:
        return []
    best = max((n + 1) / v for n, v in enumerate(verify))
    return [f"verifying 4 tokens costs {verify[3]:.2f} steps here: a draft of 3 that is all accepted gains at most "
            f"{4 / verify[3]:.2f}x, and no draft length more than {best:.2f}x"]


def _budget(report: BenchReport) -> list[str]:
    m = report.machine
    if "threads" not in m:
        return []
    return [f"threads: {m['threads']} for steps, {m.get('threads_batch', m['threads'])} for batches, "
            "for localspec and llama-cpp-python alike"]


def write_json(report: BenchReport, path: Path) -> None:
    """The whole report as JSON."""
    Path(path).write_text(json.dumps(report.to_dict(), indent=1))


def render_related(report: RelatedReport) -> str:
    """The related-requests report as a terminal table."""
    out = ["Related requests, run in order. 'empty': auto with an empty history; 'earlier': auto with the history "
           "of the requests before it. Speedups are against llama-cpp-python plain (same file and threads), "
           "medians over repetitions.",
           f"{'request':<14} {'lcp tok/s':>9} {'empty':>6} {'earlier':>7} {'(min-max)':>11} "
           f"{'history accepted':>17}  exactness  rounds (earlier)"]
    out.append("-" * len(out[-1]))
    for row in report.rows:
        hist = f"{row.history_accepted}/{row.history_drafted}" if row.history_drafted else "-"
        out.append(f"{row.prompt:<14} {row.lcp_tps:>9.1f} {row.speedup_empty:>5.2f}x {row.speedup_earlier:>6.2f}x "
                   f"{f'({row.speedup_earlier_min:.2f}-{row.speedup_earlier_max:.2f})':>11} {hist:>17}  "
                   f"{row.exactness:<9}  " + " ".join(f"{m}:{n}" for m, n in row.rounds.items()))
    if report.rows:
        later = [r.speedup_earlier for r in report.rows]
        out += ["", f"with the earlier requests' history: median {statistics.median(later):.2f}x, worst "
                    f"{min(later):.2f}x; with an empty history: median "
                    f"{statistics.median(r.speedup_empty for r in report.rows):.2f}x"]
    c, st = report.costs, report.store
    if c:
        out.append(f"history lookup: median {c['lookup_us_median']:.0f} us, p99 {c['lookup_us_p99']:.0f} us per round; "
                   f"update: median {c['update_ms_median']:.1f} ms, max {c['update_ms_max']:.1f} ms per request; "
                   f"store after the workload: {st.get('records', 0)} records, {st.get('tokens', 0)} tokens, "
                   f"{st.get('bytes', 0) / 1e3:.1f} kB")
    if report.mismatches:
        out.append(f"\n{report.mismatches} MISMATCH(ES) against plain decoding: this is a bug, please report it.")
    return "\n".join(out)
