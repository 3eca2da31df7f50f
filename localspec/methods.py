"""Drafting methods: one registered object per method, from which everything else derives.

A ``Method`` says what the rest of localspec needs to know about a way of
drafting: its name and default draft length, how people see it (a label, a
colour in ``localspec chat``), what a round of it costs under a cost profile,
how its drafter is built for a generation, how auto mode offers it each round,
and which draft lengths the bench measures. The options' allowed values, the
pair's drafter, auto's candidates, the stats' per-method counts, the bench's
rows and chat's colours all read the registry, so adding a drafter is one
module (the drafter and its builders) and one ``register`` call.

This is the bottom of the drafting layers: it imports nothing of localspec
but its errors, so the options can check a method's name and the command
line can list the methods at start-up without loading numpy or llama.cpp.
The built-in methods are declared here; the modules that define their
drafters (``drafters``, ``history.drafter``, ``auto``) attach the builders and
auto's candidates when they are imported (``Registry.attach``), as a
plugin's module registers its own method.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Protocol

from .errors import ConfigError

#: The most tokens drafted per round that auto considers (and calibrates for).
AUTO_KMAX = 8
#: Bounds of the draft length everywhere (API, CLI, chat, bench, models.toml, a method's default).
K_LIMIT = 16


class Profile(Protocol):
    """What a method's round cost reads from a cost profile (``costs.CostProfile`` has it), in seconds."""

    verify: list[float]
    draft_step: float
    lookup: float
    mtp_step: float


def plain_cost(profile: Profile, k: int) -> float:
    """One target step."""
    return profile.verify[0]


def search_cost(profile: Profile, k: int) -> float:
    """Verifying k guessed tokens after a search (prompt lookup, history): no model runs to guess."""
    return profile.verify[k] + profile.lookup if k else profile.verify[0]


def model_cost(profile: Profile, k: int) -> float:
    """Verifying k tokens that a draft model produced in k steps."""
    return profile.verify[k] + k * profile.draft_step if k else profile.verify[0]


def head_cost(profile: Profile, k: int) -> float:
    """Verifying k tokens that the target's MTP head produced in k steps of its one layer."""
    return profile.verify[k] + k * profile.mtp_step if k else profile.verify[0]


@dataclass(frozen=True)
class Method:
    """A drafting method.

    Attributes:
        name: what users type (``--method NAME``, ``"method": NAME``).
        label: a few words for people.
        default_k: the draft length when none is given (0 for plain decoding).
        round_cost: seconds for one round with draft length k under a profile (``plain_cost``,
            ``search_cost``, ``model_cost`` or your own).
        build: makes the drafter for a generation from a ``drafters.DraftingContext`` (None: plain
            decoding, or not attached yet); raises ConfigError when the method cannot run (no draft
            model, history off).
        candidate: makes what auto offers each round (a ``candidates.Candidate``) from a
            ``DraftingContext``, or None when the method cannot take part this time; absent for
            methods auto does not choose.
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
    round_cost: Callable[[Profile, int], float]
    build: Optional[Callable[[Any], Any]] = None
    candidate: Optional[Callable[[Any], Any]] = None
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

    def attach(self, name: str, build: Optional[Callable[[Any], Any]] = None,
               candidate: Optional[Callable[[Any], Any]] = None) -> None:
        """Give a declared method its builder and auto candidate (the module that defines them calls this).

        The declared object itself gains them, so every module holding it sees the same method.
        """
        method = self.get(name)
        for attr, value in (("build", build), ("candidate", candidate)):
            if value is not None:
                object.__setattr__(method, attr, value)  # frozen for everyone else: set once, here

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


AUTO = Method("auto", "lookup, a prediction, history, the draft model, the MTP head or plain, and K, chosen each round",
              AUTO_KMAX,
              plain_cost,  # never charged itself: each of its rounds costs what the method it chose costs
              uses_history=True, adaptive=True)
PLAIN = Method("plain", "plain decoding", 0, plain_cost)
LOOKUP = Method("lookup", "prompt lookup", 8, search_cost, colour="cyan", bench_k=(2, 4, 8), bench_k_quick=(2, 4))
HISTORY = Method("history", "earlier generations", 8, search_cost, colour="blue", uses_history=True)
PREDICTION = Method("prediction", "the request's predicted output", 8, search_cost, colour="bright_yellow")
DRAFT = Method("draft", "the draft model", 4, model_cost, colour="green", needs_draft=True, bench_k=(1, 2, 4, 8),
               bench_k_quick=(1, 2))
MTP = Method("mtp", "the model's own MTP head", 3, head_cost, colour="magenta", needs_head=True, bench_k=(1, 2, 3),
             bench_k_quick=(2,))

#: Every drafting method localspec knows. ``register`` adds one (a plugin's): the one deliberate piece of
#: module-level state, as a plugin registry must be.
REGISTRY = Registry({m.name: m for m in (AUTO, PLAIN, LOOKUP, PREDICTION, HISTORY, DRAFT, MTP)})


def register(method: Method, replace: bool = False) -> Method:
    """Register a drafting method everywhere: options, ``Pair``, auto, stats, the bench and chat."""
    return REGISTRY.register(method, replace)


def get_method(name: str) -> Method:
    """The registered method called ``name`` (ConfigError if there is none)."""
    return REGISTRY.get(name)
