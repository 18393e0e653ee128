"""A cost report as a rich table, JSON, CSV or a PNG of cost over time."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from mark.billing import LAMBDA_COMPONENTS, LAMBDA_PC
from mark.report.aggregate import (
    ACCRUING,
    FROM_EVENTS,
    Charge,
    Row,
    Totals,
    aggregate,
    totals,
)
from mark.report.counterfactual import Counterfactual

ROW_FIELDS = (
    "day",
    "model",
    "instance_type",
    "component",
    "status",
    "charges",
    "seconds",
    "billed_seconds",
    "requests",
    "gb_seconds",
    "cost",
)
PROVISIONED_NOTE = (
    "lambda-pc is the spill function's provisioned concurrency for the time the daemon had "
    "it configured (each period rounded up to 5 minutes, split evenly over the models); "
    "lambda-on-pc is the invocations it served, counted as those within the configured "
    "concurrency in flight"
)
SAGEMAKER_NOTE = (
    "baseline priced at the SageMaker ml.* real-time hosting price of its type (cited, or "
    "derived from the family's markup over EC2: mark/catalog/data/README.md), scaled as "
    "SageMaker does (metric seen a minute late, cooldowns from completion)"
)


@dataclass(frozen=True)
class Report:
    since: float | None
    until: float
    charges: list[Charge]
    rows: list[Row]
    totals: Totals
    counterfactuals: list[Counterfactual] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def model_cost(self, model: str) -> float:
        return sum(r.cost for r in self.rows if r.model == model)


def build_report(
    charges: list[Charge],
    *,
    since: float | None,
    until: float,
    counterfactuals: Sequence[Counterfactual] = (),
    notes: Sequence[str] = (),
) -> Report:
    rows = aggregate(charges)
    said = list(notes)
    derived = [c for c in charges if c.source == FROM_EVENTS and c.status != ACCRUING]
    if derived:
        said.append(
            f"{len(derived)} EC2 run(s) the ledger does not hold (standby runs) priced from "
            "instance events"
        )
    accruing = [c for c in charges if c.status == ACCRUING]
    if accruing:
        said.append(
            f"{len(accruing)} run(s) still live in the store charged up to {iso(until)} (accruing)"
        )
    if any(c.entry.component == LAMBDA_PC for c in charges):
        said.append(PROVISIONED_NOTE)
    if counterfactuals:
        said.append(SAGEMAKER_NOTE)
    return Report(since, until, charges, rows, totals(rows), list(counterfactuals), said)


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _counterfactual_dict(report: Report, c: Counterfactual) -> dict[str, Any]:
    d = asdict(c)
    d.pop("runs")
    d["start"], d["end"] = iso(c.start), iso(c.end)
    mark = report.model_cost(c.model)
    d["mark_cost"] = mark
    d["saving_factor"] = c.cost / mark if mark > 0 else None
    return d


def as_dict(report: Report) -> dict[str, Any]:
    return {
        "since": None if report.since is None else iso(report.since),
        "until": iso(report.until),
        "rows": [asdict(r) for r in report.rows],
        "totals": asdict(report.totals),
        "counterfactual": [_counterfactual_dict(report, c) for c in report.counterfactuals],
        "notes": list(report.notes),
    }


def to_csv(report: Report) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=ROW_FIELDS)
    writer.writeheader()
    for r in report.rows:
        writer.writerow(asdict(r))
    return buf.getvalue()


def print_report(console: Console, report: Report) -> None:
    since = "the start" if report.since is None else iso(report.since)
    table = Table(title=f"cost from {since} to {iso(report.until)} (USD)")
    left = ("day", "model", "type", "component", "status")
    right = ("charges", "seconds", "billed s", "requests", "GB-s", "cost $")
    for col in left:
        table.add_column(col)
    for col in right:
        table.add_column(col, justify="right")
    for r in report.rows:
        lam = r.component in LAMBDA_COMPONENTS
        table.add_row(
            r.day,
            r.model,
            r.instance_type or "-",
            r.component,
            r.status,
            str(r.charges),
            f"{r.seconds:.1f}",
            f"{r.billed_seconds:.3f}" if lam else f"{r.billed_seconds:.0f}",
            str(r.requests) if lam and r.component != LAMBDA_PC else "",
            f"{r.gb_seconds:.3f}" if lam else "",
            f"{r.cost:.6f}",
        )
    t = report.totals
    table.add_section()
    table.add_row(
        "total", "", "", "", "", str(sum(r.charges for r in report.rows)), "", "",
        str(t.lambda_requests), f"{t.lambda_gb_seconds:.3f}", f"{t.cost:.6f}",
    )  # fmt: skip
    console.print(table)
    parts = ", ".join(f"{k} ${v:.6f}" for k, v in t.by_component.items()) or "nothing charged"
    console.print(
        f"total ${t.cost:.6f} (billed ${t.billed:.6f}, accruing ${t.accruing:.6f}): {parts}",
        highlight=False,
    )
    for c in report.counterfactuals:
        mark = report.model_cost(c.model)
        ratio = f" ({c.cost / mark:.2f}× mark's ${mark:.6f})" if mark > 0 else ""
        console.print(
            f"counterfactual {c.model}: SageMaker target tracking, "
            f"{c.over_provision:g}× over-provisioned on ml.{c.instance_type} "
            f"at ${c.price_per_hour:g}/h "
            f"({c.capacity_rps:.1f} r/s each, {c.capacity_source}; target "
            f"{c.target_per_instance_per_minute:.0f} invocations/instance/min), "
            f"{c.requests} requests from {iso(c.start)} to {iso(c.end)}: "
            f"peak {c.peak_instances} instance(s), ${c.cost:.6f}{ratio}",
            highlight=False,
        )
    for note in report.notes:
        console.print(f"note: {note}", highlight=False)


_BUCKETS_S = (1, 5, 15, 60, 300, 900, 3600, 6 * 3600, 86400)


def plot(report: Report, path: Path) -> Path:
    """PNG of cumulative cost over time, stacked by component, with the counterfactual
    dashed. Each charge is spread evenly over its billed time (a 30 s run billed 60 s
    counts over 60 s); Lambda charges over the interval they were flushed for."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    spans: list[tuple[str, float, float, float]] = []
    for c in report.charges:
        e = c.entry
        end = e.end if e.kind == "lambda" else e.start + max(e.billed_seconds, e.end - e.start)
        spans.append((e.component, e.start, end, e.cost))
    base: list[tuple[float, float, float]] = []
    for cf in report.counterfactuals:
        for s, end in cf.runs:
            billed = max(60.0, end - s)
            base.append((s, s + billed, billed * cf.price_per_hour / 3600.0))
    points = [t for _, s, e, _ in spans for t in (s, e)] + [t for s, e, _ in base for t in (s, e)]
    fig, ax = plt.subplots(figsize=(11, 5))
    if points:
        t0, t1 = min(points), max(points)
        step = next((b for b in _BUCKETS_S if (t1 - t0) / b <= 300), _BUCKETS_S[-1])
        grid = np.arange(t0, t1 + step, step, dtype=np.float64)

        def cumulative(items: Sequence[tuple[float, float, float]]) -> Any:
            out = np.zeros_like(grid)
            for s, e, cost in items:
                frac = np.ones_like(grid) * (grid >= s) if e <= s else (grid - s) / (e - s)
                out += cost * np.clip(frac, 0.0, 1.0)
            return out

        components = sorted({c for c, *_ in spans})
        stacks = [
            cumulative([(s, e, k) for c, s, e, k in spans if c == comp]) for comp in components
        ]
        x = (grid - t0) / 60.0
        if stacks:
            ax.stackplot(x, *stacks, labels=components, alpha=0.8)
        if base:
            ax.plot(x, cumulative(base), "k--", lw=1.2, label="SageMaker baseline (ml.* prices)")
        ax.set_xlabel(f"minutes since {iso(t0)}")
    else:
        ax.text(0.5, 0.5, "nothing charged in this period", ha="center", transform=ax.transAxes)
    ax.set_ylabel("cumulative cost (USD)")
    ax.set_title("mark cost by component")
    if points:
        ax.legend(loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
