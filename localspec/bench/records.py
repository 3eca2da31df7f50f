"""What a bench measures and reports: one generation (``Run``), summarised rows, and the reports."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from .suite import MethodSpec


@dataclass
class Run:
    """One measured generation."""

    prompt: str
    category: str
    method: str
    k: int
    rep: int
    temperature: float
    tokens: list[int]
    stats: dict[str, Any]
    history: bool = True


@dataclass
class Row:
    """One prompt x method x temperature, summarised over repetitions."""

    prompt: str
    category: str
    method: str
    k: int
    temperature: float
    decode_tps: float
    prefill_seconds: float
    speedup: float
    speedup_min: float
    speedup_max: float
    acceptance: float
    tokens_per_round: float
    acceptance_by_position: list[float]
    predicted_speedup: Optional[float]
    exactness: str  # identical / tie / MISMATCH / "reference" for plain / "-" when sampled
    #: Against llama-cpp-python's plain decoding (the headline), when the peers ran.
    speedup_peer: Optional[float] = None
    speedup_peer_min: Optional[float] = None
    speedup_peer_max: Optional[float] = None
    exactness_peer: str = "-"
    #: Decode time outside llama.cpp per round (Python and numpy), median over repetitions.
    overhead_ms_per_round: float = 0.0
    #: Round statistics summed over repetitions (what predictions are made from).
    round_stats: Optional[dict[str, int]] = None
    divergence: Optional[dict[str, float]] = None
    auto_rounds: Optional[dict[str, int]] = None
    #: Mean decode time per round, measured and as the cost profile predicts it from the rounds' draft
    #: lengths (how well calibration describes real rounds); None for the peers.
    round_ms: Optional[float] = None
    round_ms_predicted: Optional[float] = None
    #: The same prediction with one target step taken from this run's plain rounds on the same prompt
    #: instead of the calibration: what is left is the error in the relative costs auto decides by, not
    #: how much busier the shared machine is now than when it was calibrated. None for plain and the peers.
    round_ms_predicted_here: Optional[float] = None
    #: False for the "auto -history" row (auto without a history store).
    history: bool = True
    #: 95% intervals of the geometric mean ratio over repetitions (see ``intervals``), against localspec plain
    #: and against llama-cpp-python plain; None for the reference itself or with fewer than three repetitions.
    speedup_interval: Optional[tuple[float, float]] = None
    speedup_peer_interval: Optional[tuple[float, float]] = None
    #: Adaptive rows: against the fastest llama-cpp-python row on the same prompt (median of repetitions,
    #: its interval, and which row that was).
    vs_fastest_peer: Optional[float] = None
    vs_fastest_peer_interval: Optional[tuple[float, float]] = None
    fastest_peer: Optional[str] = None
    #: Mean decode time per round in ms, split into the target's llama.cpp calls, the drafter's models'
    #: and the rest (Python and numpy), over all repetitions; None for the peers.
    round_split_ms: Optional[dict[str, float]] = None
    #: Per kind of round (what drafted it, or "plain"), over all repetitions: rounds, and ms per round
    #: whole and in the target's and the drafter's llama.cpp calls (see ``GenerationStats.round_time_by``).
    round_time_by: Optional[dict[str, dict[str, float]]] = None
    #: Under a constraint: the share of the generated tokens drafted for free because the grammar forced
    #: them (a drafting row's; plain decoding drafts nothing); None for the peers and where there were none.
    forced_share: Optional[float] = None
    #: From a reasoning model: drafted and accepted tokens inside its reasoning and in its answer, apart
    #: (``{"reasoning": {"drafted": n, "accepted": n}, "answer": {...}}``, over all repetitions; see
    #: ``GenerationStats.drafted_in``); None for the peers and for replies without reasoning.
    acceptance_in: Optional[dict[str, dict[str, int]]] = None

    @property
    def label(self) -> str:
        return MethodSpec(self.method, self.k, self.history).label


@dataclass
class Report:
    """What every bench report has: how it ran, on what machine, and how many runs were not exact."""

    settings: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    mismatches: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class BenchReport(Report):
    """Everything a suite run measured."""

    rows: list[Row] = field(default_factory=list)
    profile: dict[str, Any] = field(default_factory=dict)


@dataclass
class RelatedRow:
    """One request of the workload: speed with an empty history and with the earlier requests' history."""

    prompt: str
    category: str
    lcp_tps: float
    empty_tps: float
    earlier_tps: float
    #: Against llama-cpp-python plain, medians over repetitions (and the spread of the second).
    speedup_empty: float
    speedup_earlier: float
    speedup_earlier_min: float
    speedup_earlier_max: float
    #: Tokens drafted from history and accepted, with the earlier requests' history (summed over repetitions).
    history_drafted: int
    history_accepted: int
    rounds: dict[str, int]
    exactness: str  # worst over both localspec rows against llama-cpp-python's plain tokens


@dataclass
class RelatedReport(Report):
    """What ``run_related`` measured."""

    rows: list[RelatedRow] = field(default_factory=list)
    costs: dict[str, float] = field(default_factory=dict)
    store: dict[str, int] = field(default_factory=dict)


def tps(run: Run) -> float:
    return float(run.stats["decode_tokens_per_second"])
