"""``GET /metrics`` for ``localspec serve --metrics``: the server's counters in Prometheus' text format.

What is counted: HTTP requests by route and status class; generations by outcome; prompt tokens, those
not processed again (the live cache's prefix or the prompt cache's saved states) and those the prompt
cache restored; generated tokens; drafted and accepted tokens by drafter; and, read when scraped, the
running and waiting generations. ``prometheus_client`` formats them (the ``server`` extra), from a
registry of this server's own, so two servers in one process never share a count.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..events import GenerationStats

#: The media type of Prometheus' text format, version 0.0.4.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class Totals:
    """Counts since the server started; updated from the event loop and the worker, read when scraped."""

    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    requests: Counter = field(default_factory=Counter)  # (route, status class) -> requests answered
    tokens: Counter = field(default_factory=Counter)  # kind -> tokens
    drafted: Counter = field(default_factory=Counter)  # drafter -> drafted tokens
    accepted: Counter = field(default_factory=Counter)  # drafter -> accepted tokens

    def answered(self, route: str, status: int) -> None:
        """Count one answered HTTP request."""
        with self.lock:
            self.requests[(route, f"{status // 100}xx")] += 1

    def generated(self, stats: GenerationStats) -> None:
        """Count one finished generation's tokens."""
        with self.lock:
            self.tokens["prompt"] += stats.prompt_tokens
            self.tokens["prompt_cached"] += stats.cached_prompt_tokens
            self.tokens["prompt_restored"] += stats.restored_prompt_tokens
            self.tokens["generated"] += stats.generated_tokens
            self.drafted.update(stats.drafted_by)
            self.accepted.update(stats.accepted_by)


class _Collector(Collector):
    """The metric families, built from ``Totals`` and the live gauges at each scrape."""

    def __init__(self, totals: Totals, outcomes: Callable[[], Mapping[str, int]],
                 gauges: Callable[[], tuple[int, int]], room: Callable[[], tuple[int, int]]):
        self.totals, self.outcomes, self.gauges, self.room = totals, outcomes, gauges, room

    def collect(self) -> Iterator[Any]:
        with self.totals.lock:
            requests = dict(self.totals.requests)
            tokens = dict(self.totals.tokens)
            drafted, accepted = dict(self.totals.drafted), dict(self.totals.accepted)
        family = CounterMetricFamily("localspec_requests", "HTTP requests answered, by route and status class.",
                                     labels=["route", "status"])
        for (route, status), n in sorted(requests.items()):
            family.add_metric([route, status], n)
        yield family
        family = CounterMetricFamily("localspec_generations", "Generations by outcome (refused: the request was "
                                     "at fault; failed: the server was).", labels=["outcome"])
        for outcome, n in self.outcomes().items():
            family.add_metric([outcome], n)
        yield family
        for kind, text in (("prompt", "Prompt tokens of finished generations."),
                           ("prompt_cached", "Prompt tokens not processed again (a cached prefix or saved state)."),
                           ("prompt_restored", "Prompt tokens restored from the prompt cache's saved states."),
                           ("generated", "Tokens generated.")):
            yield CounterMetricFamily(f"localspec_{kind}_tokens", text, value=tokens.get(kind, 0))
        for name, counts, text in (("drafted", drafted, "Tokens drafted, by drafter."),
                                   ("accepted", accepted, "Drafted tokens the target kept, by drafter.")):
            family = CounterMetricFamily(f"localspec_{name}_tokens", text, labels=["drafter"])
            for drafter, n in sorted(counts.items()):
                family.add_metric([drafter], n)
            yield family
        waits, aside = self.room()
        yield CounterMetricFamily("localspec_room_waits", "Requests that waited for room in the shared cells before "
                                  "they began.", value=waits)
        yield CounterMetricFamily("localspec_set_aside", "Generations set aside for want of cells (saved, then "
                                  "brought back when room came).", value=aside)
        running, waiting = self.gauges()
        yield GaugeMetricFamily("localspec_running", "Generations running now (at most the server's --parallel).",
                                value=running)
        yield GaugeMetricFamily("localspec_queued", "Requests waiting for the generation worker.", value=waiting)


def registry(totals: Totals, outcomes: Callable[[], Mapping[str, int]], gauges: Callable[[], tuple[int, int]],
             room: Callable[[], tuple[int, int]] = lambda: (0, 0)) -> CollectorRegistry:
    """A registry of one server's metrics: ``outcomes`` gives generations by outcome, ``gauges`` (running,
    waiting), ``room`` (requests that waited for room, generations set aside), all read at each scrape."""
    reg = CollectorRegistry(auto_describe=True)
    reg.register(_Collector(totals, outcomes, gauges, room))
    return reg


def render(reg: CollectorRegistry) -> bytes:
    """The registry in Prometheus' text format."""
    return generate_latest(reg)


class CountRequests:
    """ASGI middleware counting every answered HTTP request (the guards' refusals too) in ``totals``.

    Args:
        app: the application.
        totals: where the counts go.
        routes: the paths counted by name, or by template for a path with a parameter; any other path counts
            as ``other`` (so a scanner cannot grow the label set without bound).
    """

    def __init__(self, app: ASGIApp, *, totals: Totals, routes: frozenset[str]):
        self.app, self.totals, self.routes = app, totals, routes
        # a route with a parameter ("/v1/models/{name:path}") counts under its template, by the path before it
        self.templates = sorted(((r.split("{", 1)[0], r) for r in routes if "{" in r), reverse=True)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        route = path if path in self.routes else next(
            (template for prefix, template in self.templates if path.startswith(prefix) and len(path) > len(prefix)),
            "other")

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.totals.answered(route, message["status"])
            await send(message)

        await self.app(scope, receive, counted)
