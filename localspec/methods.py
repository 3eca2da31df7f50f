"""Drafting methods: one registered object per method, from which everything else derives.

A ``Method`` says what the rest of localspec needs to know about a way of
drafting: its name and default draft length, how people see it (a label, a
colour in ``localspec chat``), what a round of it costs under a cost profile,
how its drafter is built for a generation, how auto mode offers it each round,
and which draft lengths the bench measures. The options' allowed values, the
pair's drafter, auto's candidates, the stats' per-method counts, the bench's
rows and chat's colours all read the registry, so adding a drafter is one
module (the drafter and its builders) and one ``register`` call.

This module imports nothing heavy (builders are named by module and attribute
and imported when first called), so the command line can list the methods at
start-up.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

from .errors import ConfigError

if TYPE_CHECKING:
    import numpy as np

    from .backend import Model
    from .costs import CostCorrection, CostProfile
    from .history import HistoryIndex
    from .options import GenerationOptions

#: The most tokens drafted per round that auto considers (and calibrates for).
AUTO_KMAX = 8
#: Bounds of the draft length everywhere (API, CLI, chat, bench, models.toml, a method's default).
K_LIMIT = 16


def plain_cost(profile: CostProfile, k: int) -> float:
    """One target step."""
    return profile.verify[0]


def search_cost(profile: CostProfile, k: int) -> float:
    """Verifying k guessed tokens after a search (prompt lookup, history): no model runs to guess."""
    return profile.verify[k] + profile.lookup if k else profile.verify[0]


def model_cost(profile: CostProfile, k: int) -> float:
    """Verifying k tokens that a draft model produced in k steps."""
    return profile.verify[k] + k * profile.draft_step if k else profile.verify[0]


def head_cost(profile: CostProfile, k: int) -> float:
    """Verifying k tokens that the target's MTP head produced in k steps of its one layer."""
    return profile.verify[k] + k * profile.mtp_step if k else profile.verify[0]


@dataclass
class DraftingContext:
    """What a method's builders may use for one generation.

    Attributes:
        options: the generation's options (sampling, n-gram range...).
        k: the draft length for this generation (the most, for auto).
        prompt_tokens: the prompt's token ids.
        prompt_text: the prompt as text, computed when asked for (auto reads it for its priors).
        draft: the draft model, if the pair has one.
        history: the history index to draft from (None: history is off for this call).
        history_alpha: auto's estimates of history's acceptance, kept by the pair across generations.
        profile: the machine's cost profile, measured on first use (what auto decides by).
        correction: what real rounds have shown about that profile, kept by the pair across generations.
    """

    options: GenerationOptions
    k: int
    prompt_tokens: np.ndarray
    prompt_text: Callable[[], str]
    draft: Optional[Model] = None
    history: Optional[HistoryIndex] = None
    history_alpha: Optional[dict[Any, Any]] = None
    profile: Optional[Callable[[], CostProfile]] = None
    correction: Optional[CostCorrection] = None
    #: The target's MTP head, opened on first call (None: the target has none).
    head: Optional[Callable[[], Any]] = None


def lazy(module: str, attr: str) -> Callable[..., Any]:
    """``module.attr``, imported when first called: the registry stays light."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), attr)(*args, **kwargs)

    call.__qualname__ = f"{module}.{attr}"
    return call


@dataclass(frozen=True)
class Method:
    """A drafting method.

    Attributes:
        name: what users type (``--method NAME``, ``"method": NAME``).
        label: a few words for people.
        default_k: the draft length when none is given (0 for plain decoding).
        round_cost: seconds for one round with draft length k under a profile (``plain_cost``,
            ``search_cost``, ``model_cost`` or your own).
        build: makes the drafter for a generation from a ``DraftingContext`` (None: plain decoding);
            raises ConfigError when the method cannot run (no draft model, history off).
        candidate: makes what auto offers each round from a ``DraftingContext``, or None when the
            method cannot take part this time; absent for methods auto does not choose.
        colour: the colour of its accepted tokens in ``localspec chat --show-drafts``.
        needs_draft: it runs the draft model, so a pair without one cannot use it.
        needs_head: it runs the target's MTP head, so a target without one cannot use it.
        uses_history: it drafts from the history store (so a run of it may record into one).
        bench_k: the draft lengths ``localspec bench`` measures it at (empty: no row of its own);
            ``bench_k_quick`` for ``--quick`` (default: ``bench_k``).
        adaptive: it chooses among other methods each round (auto), so its rounds are the others'.
    """

    name: str
    label: str
    default_k: int
    round_cost: Callable[[CostProfile, int], float]
    build: Optional[Callable[[DraftingContext], Any]] = None
    candidate: Optional[Callable[[DraftingContext], Any]] = None
    colour: Optional[str] = None
    needs_draft: bool = False
    needs_head: bool = False
    uses_history: bool = False
    bench_k: tuple[int, ...] = ()
    bench_k_quick: tuple[int, ...] = ()
    adaptive: bool = False

    def __post_init__(self) -> None:
        if not (isinstance(self.default_k, int) and 0 <= self.default_k <= K_LIMIT):
            raise ConfigError(f"Method {self.name!r}: the default draft length must be a whole number from 0 to "
                              f"{K_LIMIT}, got {self.default_k!r}.")


@dataclass
class Registry:
    """The drafting methods, in the order they are offered (auto's candidates take this order too)."""

    methods: dict[str, Method] = field(default_factory=dict)

    def register(self, method: Method, replace: bool = False) -> Method:
        """Add ``method`` (or, with ``replace``, put it in place of the one of the same name)."""
        if method.name in self.methods and not replace:
            raise ConfigError(f"A drafting method named {method.name!r} is already registered.")
        self.methods[method.name] = method
        return method

    def unregister(self, name: str) -> None:
        """Remove a method (a plugin's, or a test's)."""
        self.methods.pop(name, None)

    def get(self, name: str) -> Method:
        """The method called ``name``.

        Raises:
            ConfigError: no such method.
        """
        method = self.methods.get(name) if isinstance(name, str) else None
        if method is None:
            raise ConfigError(f"Unknown method {name!r}; choose one of {', '.join(self.methods)}.")
        return method

    def find(self, name: str) -> Optional[Method]:
        """The method called ``name``, or None (e.g. for the bench's llama-cpp-python rows)."""
        return self.methods.get(name)

    def names(self) -> tuple[str, ...]:
        return tuple(self.methods)

    def __iter__(self) -> Iterator[Method]:
        return iter(list(self.methods.values()))


AUTO = Method("auto", "lookup, history, the draft model, the MTP head or plain, and K, chosen each round", AUTO_KMAX,
              plain_cost,  # never charged itself: each of its rounds costs what the method it chose costs
              build=lazy("localspec.auto", "build_auto"), uses_history=True, adaptive=True)
PLAIN = Method("plain", "plain decoding", 0, plain_cost)
LOOKUP = Method("lookup", "prompt lookup", 8, search_cost, build=lazy("localspec.drafters", "build_lookup"),
                candidate=lazy("localspec.auto", "lookup_candidate"), colour="cyan", bench_k=(2, 4, 8),
                bench_k_quick=(2, 4))
HISTORY = Method("history", "earlier generations", 8, search_cost, build=lazy("localspec.history", "build_history"),
                 candidate=lazy("localspec.auto", "history_candidate"), colour="blue", uses_history=True)
DRAFT = Method("draft", "the draft model", 4, model_cost, build=lazy("localspec.drafters", "build_model_drafter"),
               candidate=lazy("localspec.auto", "model_candidate"), colour="green", needs_draft=True,
               bench_k=(1, 2, 4, 8), bench_k_quick=(1, 2))

MTP = Method("mtp", "the model's own MTP head", 3, head_cost, build=lazy("localspec.drafters", "build_mtp"),
             candidate=lazy("localspec.auto", "mtp_candidate"), colour="magenta", needs_head=True, bench_k=(1, 2, 3),
             bench_k_quick=(2,))

#: Every drafting method localspec knows. ``register`` adds one (a plugin's): the one deliberate piece of
#: module-level state, as a plugin registry must be.
REGISTRY = Registry({m.name: m for m in (AUTO, PLAIN, LOOKUP, HISTORY, DRAFT, MTP)})


def register(method: Method, replace: bool = False) -> Method:
    """Register a drafting method everywhere: options, ``Pair``, auto, stats, the bench and chat."""
    return REGISTRY.register(method, replace)


def get_method(name: str) -> Method:
    """The registered method called ``name`` (ConfigError if there is none)."""
    return REGISTRY.get(name)
