"""Auto mode's acceptance estimates: each method's per-token acceptance learnt online, and the priors it starts from.

An estimate starts from a prior (for prompt lookup, from a look at the prompt) and follows the rounds with
exponential decay. Lookup has one per n-gram length of its match and where the match's source lies (the supplied
text, a long prompt's closing words, the reply), history one per length band of its match,
and history's outlive one generation (the pair keeps them). ``ALPHA_CEILING`` caps what auto takes any of them
for.
"""

from __future__ import annotations

import re

import numpy as np


class AcceptanceEstimate:
    """Per-token acceptance alpha from decayed counts of kept tokens and rejections.

    A round that drafts K tokens and keeps ``kept`` contributes ``kept``
    successes and one failure if kept < K: the maximum-likelihood estimate
    of a geometric acceptance truncated at K. Old evidence fades by
    ``decay`` per drafted token, so the estimate spans the last ~1/(1-decay)
    guesses whatever K was.
    """

    def __init__(self, prior_alpha: float, prior_weight: float = 2.0, decay: float = 0.95):
        self.kept = prior_alpha * prior_weight
        self.rejected = (1.0 - prior_alpha) * prior_weight
        self.decay = decay

    @property
    def alpha(self) -> float:
        total = self.kept + self.rejected
        return self.kept / total if total > 0 else 0.0

    def update(self, drafted: int, kept: int) -> None:
        fade = self.decay ** drafted
        self.kept = self.kept * fade + kept
        self.rejected = self.rejected * fade + (1.0 if kept < drafted else 0.0)

    def shrink(self, weight: float) -> None:
        """Keep alpha but count the evidence as at most ``weight`` guesses, so new evidence moves it fast."""
        total = self.kept + self.rejected
        if total > weight:
            self.kept *= weight / total
            self.rejected *= weight / total


#: A prompt longer than this many tokens supplies material of its own to copy from.
LONG_PROMPT = 120

_COPY_CUES = re.compile(
    r"\b(rewrite|rephrase|fix|correct|edit|modify|refactor|rename|update|change|quote|copy|repeat|"
    r"return the (full|whole|complete|modified|updated)|keep(ing)? (everything|the rest))\b",
    re.IGNORECASE,
)


#: The request is read for copy cues where an instruction stands: in lines this short, and in the first clause of
#: longer ones ("Rewrite this paragraph: ..."). A document's own words ("a configuration change", "the bug fix")
#: say nothing of what is asked about it. Lines, not paragraphs: chat templates join a system prompt and the
#: user's words with single line breaks.
INSTRUCTION_CHARS = 300
#: How far into a long line its first clause is read, and how long a lead before a colon is a label ("Task:",
#: "Note:") after which the clause goes on rather than ends.
FIRST_CLAUSE_CHARS = 150
LABEL_CHARS = 16
#: A clause ends at a sentence's end or a colon followed by space ("config.yaml" or "3.10" do not end it).
_CLAUSE_END = re.compile(r"[.!?;](?=\s|$)|:(?=\s)")


def _first_clause(line: str) -> str:
    line = line.lstrip()[:FIRST_CLAUSE_CHARS]
    for end in _CLAUSE_END.finditer(line):
        if end.group(0) != ":" or end.start() > LABEL_CHARS:
            return line[: end.start()]
    return line


def prompt_prior(text: str, prompt_tokens: np.ndarray) -> float:
    """Prior acceptance for prompt lookup from a cheap look at the prompt.

    Copy-heavy requests (rewrite, edit, quote...) over a long supplied text
    make the answer repeat the prompt; otherwise lookup mostly finds
    incidental matches.
    """
    copy_request = any(_COPY_CUES.search(line if len(line) <= INSTRUCTION_CHARS else _first_clause(line))
                       for line in text.splitlines())
    long_material = len(prompt_tokens) > LONG_PROMPT
    if copy_request and long_material:
        return 0.7
    if copy_request or long_material:
        return 0.45
    return 0.25


#: How many guessed tokens the prior of a lookup estimate counts for. The estimate is scored on every plain
#: round's unused guess, so a few lucky tokens could lift a lightly held prior past the bar, and the round
#: chosen on them then keeps less than it was chosen for (``benchmarks/results/2026-12-02-lookup-prior.md``, measured by
#: replaying recorded replies with ``benchmarks/auto_sweep.py``).
LOOKUP_PRIOR_WEIGHT = 8.0

#: Where a lookup match's source lies, each with its own estimates: in the supplied text, in the last
#: ``PROMPT_TAIL`` tokens of a prompt longer than ``LONG_PROMPT`` (where a question about the text stands: an answer
#: that echoes its words leaves them where the question goes on; in a shorter prompt the end is the text itself),
#: or in the reply itself. Their priors start this much below a match in the supplied text, where the real pair's
#: recorded replies keep the first guessed token less often (``benchmarks/lookup_sources.py``); kept apart, an
#: echo of the question that stops short no longer talks auto out of the copy of the document that follows it
#: (``benchmarks/results/2026-12-07-short-answers.md``).
LOOKUP_SOURCES = {"text": 0.0, "end": -0.1, "reply": -0.2}
PROMPT_TAIL = 32


def lookup_source(source: int, prompt_len: int) -> str:
    """Which of ``LOOKUP_SOURCES`` a lookup match ending at context position ``source`` lies in."""
    if source >= prompt_len:
        return "reply"
    return "end" if prompt_len > LONG_PROMPT and source >= prompt_len - PROMPT_TAIL else "text"


#: The most of its guessed tokens any drafter is taken to keep, whatever its estimate says. After a run of kept
#: guesses an estimate climbs toward 1, and the rounds chosen at the top of it keep less than promised (most
#: where only a near-perfect guess can pay, as on one CPU thread). Replaying the real pair's recordings, every
#: measured curve and two GPU-like ones gain or hold with a ceiling from 0.92 to 0.95
#: (``benchmarks/results/2026-12-02-quiet-2-core-alpha-ceiling.md``).
ALPHA_CEILING = 0.93

#: History matches are weighed by length band: 2-3, 4-7, 8-15 and 16 or more tokens.
HISTORY_BANDS = (2, 4, 8, 16)
#: Prior acceptance per band: a long match in earlier output is usually followed the same way. The priors
#: stay below what replaying the related-requests workload measured per band (``benchmarks/replay_related.py``),
#: since other workloads repeat less.
HISTORY_PRIORS = (0.45, 0.6, 0.75, 0.9)
#: What one generation carries over of the estimates the last ones learned, in guesses: a new request may
#: be about something else, and two or three wasted history rounds should be enough to notice.
HISTORY_CARRY_WEIGHT = 4.0


def history_band(match: int) -> int:
    """The length band of a history match (an index into HISTORY_BANDS)."""
    return sum(match >= lo for lo in HISTORY_BANDS[1:])


def history_estimates() -> dict[int, AcceptanceEstimate]:
    """Fresh acceptance estimates for history matches, one per band (a pair keeps them across generations)."""
    return {i: AcceptanceEstimate(p) for i, p in enumerate(HISTORY_PRIORS)}
