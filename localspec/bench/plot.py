"""The bench's plot: speedup against K per category (needs matplotlib, the ``plot`` extra)."""

from __future__ import annotations

import statistics
from pathlib import Path

from ..errors import ConfigError
from ..methods import AUTO, PLAIN, REGISTRY
from .records import BenchReport, Row


def write_plot(report: BenchReport, path: Path) -> None:
    """Speedup against K per category for draft and lookup, with plain at 1.0 (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ConfigError("--plot needs matplotlib (the optional 'plot' extra): pip install matplotlib.") from exc
    methods = [m.name for m in REGISTRY if m.bench_k and any(r.method == m.name for r in report.rows)]
    vs_peer = any(r.speedup_peer is not None for r in report.rows)
    reference = "llama-cpp-python plain" if vs_peer else "localspec plain"

    def value(r: Row) -> float:
        return float(r.speedup_peer if vs_peer and r.speedup_peer is not None else r.speedup)

    fig, axes = plt.subplots(1, max(1, len(methods)), figsize=(6 * max(1, len(methods)), 4.5), squeeze=False)
    for ax, method in zip(axes[0], methods, strict=False):
        for category in sorted({r.category for r in report.rows}):
            pts = sorted((r.k, value(r)) for r in report.rows
                         if r.method == method and r.category == category and r.temperature == 0)
            if pts:
                ax.plot([k for k, _ in pts], [s for _, s in pts], marker="o", label=category)
        ax.set_xticks(sorted({r.k for r in report.rows if r.method == method}))
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label=reference)
        for label, style in ((PLAIN.name, ":"), (AUTO.name, "-.")):
            ours = [value(r) for r in report.rows if r.method == label and r.temperature == 0]
            if ours and vs_peer:
                ax.axhline(statistics.median(ours), color="grey", linestyle=style, linewidth=1,
                           label=f"localspec {label} (median)")
        ax.set_title(f"{method}: speedup over {reference}")
        ax.set_xlabel("K (tokens drafted per round)")
        ax.set_ylabel("decode speedup (x)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
