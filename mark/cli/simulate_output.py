"""What `mark simulate` prints: the table of policies, the notes under it (each bound,
each baseline's setting and ratios, what an ∞ means) and the CSV."""

from __future__ import annotations

import csv
import io
import math

from rich.table import Table

from mark.sim.bound import Bound
from mark.sim.results import PolicyResult


def results_table(results: list[PolicyResult], title: str) -> Table:
    t = Table(title=title)
    for col in (
        "policy",
        "total $",
        "on-demand $",
        "spot $",
        "standby $",
        "ebs $",
        "lambda $",
        "within RT_max",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "spilled",
        "declined",
        "failed",
        "bound $",
        "cost / bound",
        "instance-hours",
    ):
        t.add_column(col, justify="left" if col in ("policy", "instance-hours") else "right")
    for r in results:
        c = r.costs
        t.add_row(
            r.policy,
            f"{r.total_cost:.2f}",
            f"{c.get('on-demand', 0):.2f}",
            f"{c.get('spot', 0):.2f}",
            f"{c.get('standby', 0):.2f}",
            f"{c.get('ebs', 0):.2f}",
            f"{c.get('lambda', 0):.2f}",
            f"{r.within_slo:.2%}",
            _ms(r.p50_ms),
            _ms(r.p95_ms),
            _ms(r.p99_ms),
            str(r.spilled),
            str(r.extra.get("declined", 0)),
            str(r.failed),
            "–" if r.bound is None else f"{r.bound.value:.2f}",
            _ratio_cell(r),
            ", ".join(f"{k} {v:.1f}" for k, v in sorted(r.instance_hours.items())),
        )
    return t


def _ms(value: float) -> str:
    """A latency percentile; ∞ where that share of the requests had no answer at all."""
    return "∞" if math.isinf(value) else f"{value:.0f}"


def unanswered_note(results: list[PolicyResult]) -> list[str]:
    """What an ∞ in the table means, where there is one."""
    if not any(math.isinf(v) for r in results for v in (r.p50_ms, r.p95_ms, r.p99_ms)):
        return []
    return [
        "∞ ms: at that percentile requests had no answer (declined by the miss budget, or "
        "failed), which counts as later than any latency"
    ]


def _ratio_cell(r: PolicyResult) -> str:
    ratio = r.cost_over_bound
    if ratio is None:
        return "–"
    return f"{ratio:.2f}×" + (" †" if r.bound_own is not None else "")


def bound_notes(results: list[PolicyResult], sl_min: float) -> list[str]:
    """One line per distinct bound, then one per run that missed its SLO († in the table)."""
    lines = []
    for bound, names in distinct_bounds(results):
        b = bound
        head = (
            f"bound ${b.value:.2f} for {', '.join(names)} ({'+'.join(b.markets)}): no run in "
            f"these markets meeting SL_min {sl_min:.0%} can cost less; "
        )
        if b.floor_binds:
            lines.append(
                head + "Lambda cannot answer within RT_max, so an instance is there, billed, "
                "whenever a request is answered in time: that presence floor sets it "
                f"(the LP alone: ${b.lp_value or 0.0:.2f})"
            )
            continue
        lines.append(
            head + "the LP buys "
            f"{', '.join(f'{k} {v:.1f} h' for k, v in sorted(b.instance_hours.items())) or 'none'}"
            f", {b.lambda_requests:,.0f} on Lambda, misses {b.missed:,.0f} of "
            f"{b.miss_budget:,} allowed"
        )
    for r in results:
        if r.bound_own is not None and r.bound is not None:
            lines.append(
                f"† {r.policy} missed SL_min ({r.within_slo:.2%} within RT_max), so the "
                f"bound is not one for it; at its own {r.missed:,} misses it is "
                f"${r.bound_own.value:.2f}, cost / that = {r.cost_over_bound_own or 0:.2f}×"
            )
    return lines


def distinct_bounds(results: list[PolicyResult]) -> list[tuple[Bound, list[str]]]:
    """Each distinct bound object (shared by identity) with the policies it bounds."""
    out: list[tuple[Bound, list[str]]] = []
    for r in results:
        if r.bound is None:
            continue
        for bound, names in out:
            if bound is r.bound:
                names.append(r.policy)
                break
        else:
            out.append((r.bound, [r.policy]))
    return out


TARGET_TRACKING = ("sagemaker", "ec2-target-tracking")
EQUAL_SLO = tuple(f"{p}-equal-slo" for p in TARGET_TRACKING)


def baseline_notes(results: list[PolicyResult]) -> list[str]:
    """Each target-tracking baseline's type and price, and its cost over every other policy."""
    lines = []
    for base in (r for r in results if r.policy in TARGET_TRACKING or r.policy in EQUAL_SLO):
        x = base.extra
        if "equal_slo_met" in x:
            lines.append(
                f"{base.policy}: over-provisioned {x['over_provision']:g}× at "
                f"{x['target_capacity_rps']:g} r/s per instance, "
                + (
                    "the least that meets SL_min on this window"
                    if x["equal_slo_met"]
                    else "the most tried, and it still misses SL_min"
                )
                + f" ({x['equal_slo_runs']} runs)"
            )
        if "ml_price_per_hour" in x:
            lines.append(
                f"{base.policy} runs on {x['sagemaker_type']} at ${x['ml_price_per_hour']:g}/h "
                f"(ml.* hosting price, {x['ml_price_source']}); metric delay "
                f"{x['metric_delay_s']:g} s, invocation timeout {x['invocation_timeout_s']:g} s"
            )
        elif "sagemaker_type" in x:
            lines.append(f"{base.policy} runs on {x['sagemaker_type']} at its EC2 price")
        for r in results:
            if r.policy != base.policy and r.total_cost > 0:
                lines.append(
                    f"{base.policy} / {r.policy}: {base.total_cost / r.total_cost:.2f}× "
                    f"(within RT_max: {r.within_slo:.2%} vs {base.within_slo:.2%})"
                )
    return lines


def results_csv(results: list[PolicyResult]) -> str:
    rows = []
    for r in results:
        row = r.row()
        row["instance_hours"] = ";".join(f"{k}={v}" for k, v in row["instance_hours"].items())
        rows.append(row)
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k not in keys]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()
