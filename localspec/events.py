"""What a generation reports: each token as an event (and where it came from), and its counts and timings."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

from .drafting.drafters import AutoReport, Draft
from .reasoning.formats import ANSWER

#: Where an emitted token came from.
SOURCE_TARGET = "target"  # a plain step of the target (or the first token, from prefill)
SOURCE_DRAFT = "draft"  # a drafted token the target accepted
SOURCE_CORRECTION = "correction"  # the target's token where a drafted one was rejected
SOURCE_BONUS = "bonus"  # the target's extra token after a fully accepted draft
#: The drafter named for tokens the grammar forced (exactly one way on), drafted at no cost.
SOURCE_GRAMMAR = "grammar"


@dataclass
class TokenEvent:
    """One generated token.

    Attributes:
        token: the token id.
        text: text completed by this token (may be empty mid-character); from a reasoning model, the
            answer's text only.
        source: "draft", "target", "correction" or "bonus" (see the SOURCE_* names).
        drafter: for an accepted drafted token, which drafter guessed it
            ("draft" model, "lookup", "history", "prediction", "mtp", or "grammar" for a token the
            constraint forced); empty otherwise.
        logprob: with ``logprobs`` asked for, the token's log-probability under the processed logits it
            was chosen from (bias, penalties and grammar applied; temperature 1); else None.
        top_logprobs: the likeliest tokens there and their log-probabilities, likeliest first.
        reasoning: from a reasoning model, the reasoning text this token completed (empty in the answer).
            Text that may begin a marker waits for the next token, so a token can complete either, both or
            neither.
    """

    token: int
    text: str
    source: str
    drafter: str = ""
    logprob: Optional[float] = None
    top_logprobs: tuple[tuple[int, float], ...] = ()
    reasoning: str = ""

    @property
    def from_draft(self) -> bool:
        """True when the drafter guessed this token and the target agreed."""
        return self.source == SOURCE_DRAFT


@dataclass
class GenerationStats:
    """Counts and timings of one generation.

    Attributes:
        method: the method asked for ("auto", "lookup", ...).
        k: the most tokens drafted per round.
        prompt_tokens: tokens in the prompt.
        cached_prompt_tokens: prompt tokens not processed again: the live cache's shared prefix (an earlier
            turn's) or a saved state's.
        restored_prompt_tokens: of those, the tokens a saved state of the prompt cache gave (0: the live
            cache's own prefix, or none).
        generated_tokens: tokens generated.
        rounds: verified rounds (a plain step counts as a round that drafted nothing).
        drafted: tokens drafted.
        accepted: drafted tokens the target kept.
        draft_model_tokens: drafted tokens that came from the draft model (each one a draft-model step).
        drafted_by: drafted tokens by drafter (the names of ``TokenEvent.drafter``).
        accepted_by: accepted tokens by drafter.
        drafted_in: drafted tokens by where their round began: "reasoning" (inside a reasoning model's
            reasoning, its closing markers included) or "answer" (everything else, the whole reply of a model
            that does not reason), each present once a round began there; the values sum to ``drafted``.
        accepted_in: accepted tokens the same way; the values sum to ``accepted``.
        grammar_rounds: rounds whose draft was only tokens the grammar forced (see ``SOURCE_GRAMMAR``):
            nothing was guessed after them (auto chose no method, or could not).
        empty_rounds: rounds in which the drafter proposed nothing (plain steps).
        rejected_rounds: rounds with a rejected guess.
        proposed_at: ``proposed_at[i]``: drafted tokens at draft position i.
        accepted_at: ``accepted_at[i]``: how many of those were kept.
        prefill_seconds: time processing the prompt.
        decode_seconds: time generating.
        llama_seconds: the part of ``decode_seconds`` spent inside llama.cpp (target and draft decode calls).
        target_seconds: of that, the target's decode calls (verification, and replays after a rewind).
        draft_seconds: of that, the drafter's models'.
        rewinds: times a model's memory (a recurrent state) went back to a checkpoint or to the start (see
            ``Model.truncate``); 0 for attention caches.
        replayed_tokens: the tokens evaluated again for those rewinds.
        round_time_by: rounds by what drafted them ("plain" for a round that drafted nothing, "grammar" for
            forced tokens): how many, the tokens they decided (kept draft and the target's own, an end token
            included), and their time in seconds, whole and the parts the target's and the drafter's models
            spent in llama.cpp. A round is timed from the draft to the truncation; emitting its tokens is not
            in it (that costs all alike).
        auto: for method "auto": rounds per method, the choices it made and the estimates behind them.
        batch_width: the most generations whose tokens shared one of this generation's target decodes (1: it
            decoded alone; see ``Pair.generate_many``).
    """

    method: str
    k: int
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    restored_prompt_tokens: int = 0
    generated_tokens: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_model_tokens: int = 0
    drafted_by: dict[str, int] = field(default_factory=dict)
    accepted_by: dict[str, int] = field(default_factory=dict)
    drafted_in: dict[str, int] = field(default_factory=dict)
    accepted_in: dict[str, int] = field(default_factory=dict)
    grammar_rounds: int = 0
    empty_rounds: int = 0
    rejected_rounds: int = 0
    proposed_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    llama_seconds: float = 0.0
    target_seconds: float = 0.0
    draft_seconds: float = 0.0
    rewinds: int = 0
    replayed_tokens: int = 0
    round_time_by: dict[str, dict[str, float]] = field(default_factory=dict)
    auto: Optional[AutoReport] = None
    batch_width: int = 1

    def count_round(self, draft: Draft, kept: int, phase: str = ANSWER) -> None:
        """Count one verified round begun in ``phase`` ("reasoning" or "answer"); accepted tokens are counted when
        emitted (``count_accepted``), not here."""
        self.rounds += 1
        self.drafted += len(draft.tokens)
        self.drafted_in[phase] = self.drafted_in.get(phase, 0) + len(draft.tokens)
        self.empty_rounds += not draft.tokens
        self.rejected_rounds += kept < len(draft.tokens)
        self.draft_model_tokens += draft.model_steps
        self.grammar_rounds += bool(draft.tokens) and draft.forced == len(draft.tokens)
        for by, n in ((SOURCE_GRAMMAR, draft.forced), (draft.by, len(draft.tokens) - draft.forced)):
            if n:
                self.drafted_by[by] = self.drafted_by.get(by, 0) + n
        for i in range(len(draft.tokens)):
            self.proposed_at[i] += 1

    def count_accepted(self, position: int, by: str, phase: str = ANSWER) -> None:
        """Count one accepted drafted token: its place in the draft, its drafter, and its round's ``phase``."""
        self.accepted += 1
        self.accepted_at[position] += 1
        self.accepted_by[by] = self.accepted_by.get(by, 0) + 1
        self.accepted_in[phase] = self.accepted_in.get(phase, 0) + 1

    def time_round(self, by: str, tokens: int, seconds: float, target_seconds: float, draft_seconds: float) -> None:
        """Add one round, the ``tokens`` it added and its time to ``round_time_by`` under ``by``."""
        t = self.round_time_by.setdefault(by, {"rounds": 0, "tokens": 0, "seconds": 0.0, "target": 0.0,
                                               "draft": 0.0})
        t["rounds"] += 1
        t["tokens"] += tokens
        t["seconds"] += seconds
        t["target"] += target_seconds
        t["draft"] += draft_seconds

    @property
    def rounds_by_method(self) -> dict[str, int]:
        """Rounds per drafting method: auto's choices, or all rounds under the one method used (and the rounds
        of tokens a grammar forced, under "grammar")."""
        rounds = dict(self.auto.rounds) if self.auto is not None else {self.method: self.rounds - self.grammar_rounds}
        if self.grammar_rounds:
            rounds[SOURCE_GRAMMAR] = self.grammar_rounds
        return rounds

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafted tokens over drafted tokens."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        """Acceptance rate at each draft position."""
        return [a / p if p else 0.0 for a, p in zip(self.accepted_at, self.proposed_at, strict=True)]

    @property
    def tokens_per_round(self) -> float:
        """Mean tokens emitted per verification round."""
        return (self.generated_tokens - 1) / self.rounds if self.rounds else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        """Tokens after the first over the time spent producing them."""
        return (self.generated_tokens - 1) / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def overhead_ms_per_round(self) -> float:
        """Decode time outside llama.cpp per round, in milliseconds (Python and numpy)."""
        return 1000 * (self.decode_seconds - self.llama_seconds) / self.rounds if self.rounds else 0.0

    def to_dict(self) -> dict:
        """Plain dict for JSON, with the derived figures included."""
        d = asdict(self)
        for name in ("acceptance_rate", "acceptance_by_position", "tokens_per_round",
                     "decode_tokens_per_second", "overhead_ms_per_round"):
            d[name] = getattr(self, name)
        return d
