"""The comparison's figures: cost bars (Table 5), latency CCDF (Fig. 8), fleet over time.

matplotlib with the Agg backend, imported only when a plot is asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mark.sim.results import PolicyResult

COMPONENTS = ("on-demand", "spot", "standby", "ebs", "lambda")
COLOURS = {
    "on-demand": "#4c72b0",
    "spot": "#55a868",
    "standby": "#c44e52",
    "ebs": "#8172b3",
    "lambda": "#dd8452",
}


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def cost_bars(results: Sequence[PolicyResult], path: Path, title: str = "") -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(1.4 * len(results) + 2.5, 4))
    names = [r.policy for r in results]
    bottom = [0.0] * len(results)
    for comp in COMPONENTS:
        vals = [r.costs.get(comp, 0.0) for r in results]
        if not any(vals):
            continue
        ax.bar(names, vals, bottom=bottom, label=comp, color=COLOURS[comp])
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    for x, (total, r) in enumerate(zip(bottom, results, strict=True)):
        ax.text(x, total, f"${total:.2f}\n{r.within_slo:.2%}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("cost ($)")
    ax.set_title(title or "cost by component (label: total, share within RT_max)")
    ax.set_ylim(0, max(bottom, default=1.0) * 1.25 or 1.0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def latency_ccdf(results: Sequence[PolicyResult], path: Path, title: str = "") -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        pts = [(ms, p) for ms, p in r.ccdf if p > 0]
        if pts:
            ax.step([x for x, _ in pts], [p for _, p in pts], where="post", label=r.policy)
    if results:
        ax.axvline(results[0].rt_max_ms, color="k", linestyle="--", linewidth=1, label="RT_max")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("P(latency > x)")
    ax.set_title(title or "latency CCDF")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def fleet_over_time(results: Sequence[PolicyResult], path: Path, title: str = "") -> Path:
    """Load (per-minute peak rate) against each policy's serving capacity under the SLO."""
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    if results:
        r0 = results[0]
        t0 = r0.timeline[0][0] if r0.timeline else r0.load_t0
        xs = [(r0.load_t0 + 60 * k - t0) / 3600 for k in range(len(r0.load))]
        keep = [(x, v) for x, v in zip(xs, r0.load, strict=True) if x >= 0]
        ax1.plot([x for x, _ in keep], [v for _, v in keep], color="k", lw=0.8, label="load")
        for r in results:
            ts = [(row[0] - t0) / 3600 for row in r.timeline]
            ax1.plot(ts, [row[2] for row in r.timeline], lw=1, label=f"{r.policy} capacity")
            ax2.plot(ts, [row[1] for row in r.timeline], lw=1, label=r.policy)
    ax1.set_ylabel("requests/s")
    ax1.legend(fontsize=7, ncol=2)
    ax2.set_ylabel("instances serving")
    ax2.set_xlabel("hours")
    ax2.legend(fontsize=7, ncol=2)
    ax1.set_title(title or "load and fleet")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def latency_over_time(
    results: Sequence[PolicyResult], path: Path, title: str = "", mark_at_min: float | None = None
) -> Path:
    """Per-minute p99 latency (log scale) with RT_max, like the paper's Fig. 9."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4))
    for r in results:
        if not r.per_minute:
            continue
        t0 = r.per_minute[0][0]
        ax.plot(
            [(m[0] - t0) / 60 for m in r.per_minute],
            [max(m[2], 1.0) for m in r.per_minute],
            lw=1,
            label=r.policy,
        )
    if results:
        ax.axhline(results[0].rt_max_ms, color="k", linestyle="--", lw=1, label="RT_max")
    if mark_at_min is not None:
        ax.axvline(mark_at_min, color="grey", linestyle=":", lw=1)
    ax.set_yscale("log")
    ax.set_xlabel("minutes")
    ax.set_ylabel("p99 latency (ms)")
    ax.set_title(title or "latency over time")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
