"""What one generation will do: its prompt, drafter, sampling and limits, fixed before it starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from ..drafting.drafters import Drafter
from ..errors import ConfigError, ContextOverflowError
from ..options import SamplingParams
from ..reasoning.template import TokenReader
from ..runtime.model import Model
from ..sampling.processors import Processing
from ..structured.grammar import GrammarState


def check_prompt(target: Model, n_tokens: int) -> None:
    """Raise unless a prompt of ``n_tokens`` leaves room in the target's context for a reply."""
    if n_tokens == 0:
        raise ConfigError("The prompt is empty; give at least one token of text.")
    if n_tokens >= target.n_ctx:
        raise ContextOverflowError(
            f"The prompt is {n_tokens} tokens but the context holds {target.n_ctx}; "
            "shorten the prompt or raise the context length (--ctx)."
        )


@dataclass(frozen=True)
class DecodingPlan:
    """One generation's prompt and settings, as ``engine.Generation`` runs them.

    The plan is fixed, but the drafter, matcher and reader it names keep state: a plan serves one generation.

    Attributes:
        prompt: prompt token ids; the cached prefix they share is reused.
        drafter: the drafter, or None for plain decoding.
        k: draft length per round (0 with a drafter also means plain decoding).
        params: sampling parameters for the target (and the draft model); default greedy.
        max_tokens: most tokens to generate.
        seed: the sampling seed (None: a fresh unseeded source).
        stop: strings that end the generation (the text stops before the first one); with ``reader``, looked
            for in the answer only, so a stop string the model writes while it reasons does not end it.
        method: the registered method the drafter stands for, named in the stats (default: the drafter's name).
        matcher: a grammar the output follows (``constraint.Matcher``, fresh for this generation).
        processing: the logit bias and penalties (``processors.Processing``), None for none.
        logprobs: give each event its log-probability and this many likeliest alternatives (None: none).
        boundaries: prompt positions worth a saved state of their own (where later prompts are likely to
            diverge: the end of a chat's system prompt, of each earlier turn), when there is a prompt cache.
        reader: a reasoning model's reader of this reply: each event's text is then the answer's and its
            ``reasoning`` the reasoning's, and the stats count drafting inside and outside the reasoning apart.

    Raises:
        ConfigError: bad max_tokens or k.
    """

    prompt: Sequence[int]
    drafter: Optional[Drafter] = None
    k: int = 0
    params: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = 256
    seed: Optional[int] = None
    stop: Sequence[str] = ()
    method: Optional[str] = None
    matcher: Optional[GrammarState] = None
    processing: Optional[Processing] = None
    logprobs: Optional[int] = None
    boundaries: Sequence[int] = ()
    reader: Optional[TokenReader] = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.k < 0:
            raise ConfigError(f"The draft length k must be >= 0, got {self.k}.")

    @property
    def speculates(self) -> bool:
        """Whether the rounds draft at all (a drafter and k > 0); otherwise this is plain decoding."""
        return self.drafter is not None and self.k > 0
