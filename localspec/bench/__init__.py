"""``localspec bench``: speculative methods against plain decoding and the peers, in one run.

Layer: an entry point, with ``cli`` and ``server``; only the command line imports it.

For every prompt of a suite and every method (plain; llama-cpp-python's own
``Llama``, plain and with its prompt-lookup draft, the "peers"; lookup and
draft at several K; auto), generations are repeated with the repetitions
interleaved across methods (plain, A, B, ..., plain, A, B, ...) so that drift
in machine speed hits all methods alike. Each run starts from empty caches,
so prefill is timed the same way for all, and decode is timed separately.
A method's speedup is a reference's decode time over the method's, per token,
taken from the same repetition: the headline reference is llama-cpp-python's
plain decoding (what a user would otherwise run), the second one localspec's
own plain path. The table shows medians and 95% intervals; a run given a
``Precision`` keeps adding repetitions until those intervals are narrow.
In lockstep (``run_bench(lockstep=True)``, ``--lockstep``) a repetition's
rows run side by side, a token of each in turn, each on models of its own
and timing only its own steps: load from other programs then slows every
row alike, and the intervals of their ratios narrow.

Greedy runs are also checked for exactness against both plain decodings:
identical tokens, a divergence where plain's own top-two logits were a
numeric tie, or a real mismatch (a bug; it makes the command fail).
"""

from __future__ import annotations

from .exactness import TIE_MARGIN, batch_noise, classify, margin_at
from .machine import machine_info
from .plot import write_plot
from .records import BenchReport, RelatedReport, RelatedRow, Row, Run
from .related import run_related
from .render import render_related, render_table, write_json
from .runner import Precision, run_bench
from .suite import BenchPrompt, MethodSpec, default_methods, load_related, load_suite, schedule

__all__ = ["TIE_MARGIN", "BenchPrompt", "BenchReport", "MethodSpec", "Precision", "RelatedReport", "RelatedRow", "Row",
           "Run", "batch_noise", "classify", "default_methods", "load_related", "load_suite", "machine_info",
           "margin_at", "render_related", "render_table", "run_bench", "run_related", "schedule", "write_json",
           "write_plot"]
