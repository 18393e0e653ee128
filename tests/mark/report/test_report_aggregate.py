"""The report's arithmetic on hand-made records, every total worked out by hand.

Prices are chosen so the per-second rates are round: 0.36 $/h is 0.0001 $/s,
0.072 $/h is 0.00002 $/s. T0 is 2023-11-14T22:13:20Z.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import pytest
from rich.console import Console

from mark.report.aggregate import (
    ACCRUING,
    BILLED,
    FROM_EVENTS,
    Run,
    aggregate,
    collect_charges,
    instance_runs,
    totals,
)
from mark.report.counterfactual import per_minute_invocations, target_tracking_cost
from mark.report.render import as_dict, build_report, plot, print_report, to_csv
from mark.state.records import ArrivalWindow, InstanceEvent, InstanceRecord, LedgerEntry

T0 = 1_700_000_000.0
GB_S = 1.66667e-05  # Lambda x86 $/GB-s, us-east-1 (mark/catalog/data)
PER_REQUEST = 0.2 / 1_000_000


def inst(
    iid: str, itype: str, market: str, role: str, price: float, launched: float, state: str
) -> InstanceRecord:
    return InstanceRecord(iid, "digits", itype, market, role, state, price, launched, launched)


def ev(iid: str, state: str, at: float) -> InstanceEvent:
    return InstanceEvent(iid, state, at)


# i-a: serving on-demand, 30 s then retired: the ledger bills the 60 s minimum.
# i-b: standby, runs 100 s, stopped, started again for 20 s (another 60 s minimum):
#      not in the ledger, priced from its events.
# i-c: spot, still live: accruing from T0+200 to until = T0+1000.
# i-d: standby the ledger did bill (as "on-demand"): relabelled, not counted twice.
INSTANCES = [
    inst("i-a", "c5.large", "on-demand", "serving", 0.36, T0, "terminated"),
    inst("i-b", "t3.large", "on-demand", "standby", 0.072, T0, "stopped"),
    inst("i-c", "c5.xlarge", "spot", "serving", 0.072, T0 + 200, "pending"),
    inst("i-d", "t3.large", "on-demand", "standby", 0.36, T0 + 10, "terminated"),
]
EVENTS = {
    "i-a": [ev("i-a", "pending", T0), ev("i-a", "terminated", T0 + 30)],
    "i-b": [
        ev("i-b", "pending", T0),
        ev("i-b", "stopped", T0 + 100),
        ev("i-b", "pending", T0 + 500),
        ev("i-b", "stopped", T0 + 520),
    ],
    "i-c": [ev("i-c", "pending", T0 + 200)],
    "i-d": [ev("i-d", "pending", T0 + 10), ev("i-d", "terminated", T0 + 3610)],
}
LEDGER = [
    LedgerEntry("ec2", "digits", T0, T0 + 30, "on-demand", 0.36, 0.006, "i-a", "c5.large", 30, 60),
    LedgerEntry(
        "ec2", "digits", T0 + 10, T0 + 3610, "on-demand", 0.36, 0.36, "i-d", "t3.large", 3600, 3600
    ),
    # 1000 requests that ran 250 s in all at 2048 MB: 250 × 2 = 500 GB-s
    LedgerEntry(
        "lambda",
        "digits",
        T0 + 50,
        T0 + 60,
        "lambda",
        GB_S,
        500 * GB_S + 1000 * PER_REQUEST,
        seconds=249.5,
        billed_seconds=250.0,
        requests=1000,
        gb_seconds=500.0,
    ),
]
UNTIL = T0 + 1000


def test_runs_start_at_launch_or_restart_and_end_at_stop_or_termination() -> None:
    assert instance_runs(INSTANCES[1], EVENTS["i-b"]) == [
        Run(T0, T0 + 100),
        Run(T0 + 500, T0 + 520),
    ]
    assert instance_runs(INSTANCES[2], EVENTS["i-c"]) == [Run(T0 + 200, None)]
    # first seen only at its termination (adopted): the run still starts at launch
    assert instance_runs(INSTANCES[0], [ev("i-a", "terminated", T0 + 30)]) == [Run(T0, T0 + 30)]


def test_charges_fill_in_what_the_ledger_lacks_and_relabel_standbys() -> None:
    charges = collect_charges(LEDGER, INSTANCES, EVENTS, since=None, until=UNTIL)
    got = {(c.entry.instance_id, c.entry.start): c for c in charges}
    assert len(charges) == 6  # 3 ledger entries + 2 standby runs + 1 accruing run
    b1, b2 = got[("i-b", T0)], got[("i-b", T0 + 500)]
    assert (b1.status, b1.source, b1.entry.component) == (BILLED, FROM_EVENTS, "standby")
    assert math.isclose(b1.entry.cost, 100 * 0.00002)  # 0.002
    assert b2.entry.billed_seconds == 60.0 and math.isclose(b2.entry.cost, 60 * 0.00002)
    c = got[("i-c", T0 + 200)]
    assert (c.status, c.entry.component, c.entry.end) == (ACCRUING, "spot", UNTIL)
    assert math.isclose(c.entry.cost, 800 * 0.00002)  # 0.016
    d = got[("i-d", T0 + 10)]
    assert (d.entry.component, d.entry.cost) == ("standby", 0.36)


def test_rows_and_totals_equal_the_hand_sums() -> None:
    charges = collect_charges(LEDGER, INSTANCES, EVENTS, since=None, until=UNTIL)
    rows = aggregate(charges)
    keys = [(r.instance_type, r.component, r.status, r.charges) for r in rows]
    assert keys == [
        (None, "lambda", BILLED, 1),
        ("c5.large", "on-demand", BILLED, 1),
        ("c5.xlarge", "spot", ACCRUING, 1),
        ("t3.large", "standby", BILLED, 3),
    ]
    assert {r.day for r in rows} == {"2023-11-14"}
    t = totals(rows)
    lam = 500 * 1.66667e-05 + 1000 * 0.2 / 1e6  # 0.00833335 + 0.0002
    standby = 0.002 + 0.0012 + 0.36
    assert t.by_component == pytest.approx(
        {"lambda": lam, "on-demand": 0.006, "spot": 0.016, "standby": standby}
    )
    assert t.cost == pytest.approx(lam + 0.006 + 0.016 + standby)
    assert t.accruing == pytest.approx(0.016)
    assert t.billed == pytest.approx(t.cost - 0.016)
    assert t.ec2_billed_seconds == 60 + 100 + 60 + 3600 + 800
    assert (t.lambda_requests, t.lambda_gb_seconds) == (1000, 500.0)


def test_the_period_keeps_runs_that_start_in_it() -> None:
    # [T0+100, T0+600): i-b's restart (T0+500) and i-c (T0+200); no ledger entry
    # starts in it (i-a and i-d start before, Lambda at T0+50).
    charges = collect_charges(LEDGER, INSTANCES, EVENTS, since=T0 + 100, until=T0 + 600)
    assert sorted((c.entry.instance_id, c.entry.start) for c in charges) == [
        ("i-b", T0 + 500),
        ("i-c", T0 + 200),
    ]
    accruing = next(c for c in charges if c.entry.instance_id == "i-c")
    assert accruing.entry.end == T0 + 600


def test_a_day_is_the_utc_day_the_run_starts() -> None:
    midnight = 1_700_006_400.0  # 2023-11-15T00:00:00Z
    late = inst("i-e", "c5.large", "on-demand", "serving", 0.36, midnight - 10, "terminated")
    charges = collect_charges(
        [], [late], {"i-e": [ev("i-e", "terminated", midnight + 50)]}, since=None, until=2e9
    )
    (row,) = aggregate(charges)
    assert row.day == "2023-11-14" and row.billed_seconds == 60.0


def windows(per_minute: list[int], start: float = T0) -> list[ArrivalWindow]:
    """Each minute's requests spread over twelve 5 s windows."""
    out = []
    for k, n in enumerate(per_minute):
        for j in range(12):
            out.append(ArrivalWindow("digits", start + 60 * k + 5 * j, 5.0, n // 12))
    return out


def test_counterfactual_prices_target_tracking_over_the_served_period() -> None:
    # 600 requests a minute for 3 minutes; 10 r/s per instance, 2× over-provisioned:
    # target 300 per instance per minute, so 2 instances from the start, metric 300
    # (not above target): 2 × 180 s at 0.085 $/h = 0.0085 $.
    w = windows([600, 600, 600])
    assert per_minute_invocations(w, T0, T0 + 180) == [600.0, 600.0, 600.0]
    cf = target_tracking_cost(
        "digits",
        w,
        instance_type="c5.large",
        price_per_hour=0.085,
        capacity_rps=10.0,
        capacity_source="test",
        boot_s=5.0,
    )
    assert cf is not None
    assert cf.target_per_instance_per_minute == 300.0
    assert cf.runs == ((T0, T0 + 180), (T0, T0 + 180))
    assert cf.cost == pytest.approx(2 * 180 * 0.085 / 3600)
    assert (cf.requests, cf.peak_instances) == (1800, 2)
    # a 30 s run of the baseline still bills 60 s
    short = target_tracking_cost(
        "digits",
        [ArrivalWindow("digits", T0 + 5 * j, 5.0, 1) for j in range(6)],
        instance_type="c5.large",
        price_per_hour=0.36,
        capacity_rps=10.0,
        capacity_source="test",
        boot_s=5.0,
    )
    assert short is not None and short.cost == pytest.approx(60 * 0.0001)
    assert (
        target_tracking_cost(
            "digits",
            [],
            instance_type="c5.large",
            price_per_hour=0.36,
            capacity_rps=1.0,
            capacity_source="test",
            boot_s=5.0,
        )
        is None
    )


def test_json_and_csv_carry_the_same_rows_and_totals() -> None:
    charges = collect_charges(LEDGER, INSTANCES, EVENTS, since=None, until=UNTIL)
    report = build_report(charges, since=None, until=UNTIL)
    doc = as_dict(report)
    assert doc["until"] == "2023-11-14T22:30:00Z" and doc["since"] is None
    assert sum(r["cost"] for r in doc["rows"]) == pytest.approx(doc["totals"]["cost"])
    assert any("accruing" in n for n in doc["notes"])
    assert any("standby runs" in n for n in doc["notes"])
    lines = to_csv(report).splitlines()
    assert lines[0].startswith("day,model,instance_type,component,status")
    assert len(lines) == 1 + len(doc["rows"])


# The spill function with provisioned concurrency: 2 × 2048 MB configured from T0 for
# 1000 s (billed 1200 s, four 5-minute steps), as AwsLambda writes it (two flushes);
# 400 requests of 100 ms served on it, 20 of 500 ms spilling over on demand.
PC_RATE, ON_PC_RATE = 0.0000041667, 0.0000097222  # us-east-1 x86 (mark/catalog/data)
PC_LEDGER = [
    LedgerEntry(
        "lambda", "digits", T0, T0 + 600, "lambda-pc", PC_RATE, 2 * 2 * 600 * PC_RATE,
        seconds=600, billed_seconds=600, gb_seconds=2400.0,
    ),
    LedgerEntry(
        "lambda", "digits", T0 + 600, T0 + 1000, "lambda-pc", PC_RATE, 2 * 2 * 600 * PC_RATE,
        seconds=400, billed_seconds=600, gb_seconds=2400.0,
    ),
    LedgerEntry(
        "lambda", "digits", T0 + 5, T0 + 900, "lambda-on-pc", ON_PC_RATE,
        80 * ON_PC_RATE + 400 * PER_REQUEST,
        seconds=40.0, billed_seconds=40.0, requests=400, gb_seconds=80.0,
    ),
    LedgerEntry(
        "lambda", "digits", T0 + 5, T0 + 900, "lambda", GB_S, 20 * GB_S + 20 * PER_REQUEST,
        seconds=10.0, billed_seconds=10.0, requests=20, gb_seconds=20.0,
    ),
]  # fmt: skip


def test_provisioned_concurrency_is_its_own_component_at_the_hand_computed_cost(
    tmp_path: Path,
) -> None:
    report = build_report(
        collect_charges(PC_LEDGER, [], {}, since=None, until=UNTIL), since=None, until=UNTIL
    )
    pc = 2 * 2.0 * 1200 * 0.0000041667  # 4800 GB-s configured: 0.02000016 $
    on_pc = 400 * 0.1 * 2.0 * 0.0000097222 + 400 * 0.2e-6  # 0.000777776 + 0.00008
    on_demand = 20 * 0.5 * 2.0 * 0.0000166667 + 20 * 0.2e-6  # 0.000333334 + 0.000004
    t = report.totals
    assert t.by_component == pytest.approx(
        {"lambda": on_demand, "lambda-on-pc": on_pc, "lambda-pc": pc}
    )
    assert t.cost == pytest.approx(pc + on_pc + on_demand)
    assert (t.lambda_requests, t.lambda_gb_seconds, t.provisioned_gb_seconds) == (420, 100, 4800)
    assert t.ec2_billed_seconds == 0
    assert any(
        "lambda-pc is the spill function's provisioned concurrency" in n for n in report.notes
    )

    doc = as_dict(report)
    assert {r["component"]: r["cost"] for r in doc["rows"]} == pytest.approx(t.by_component)
    rows = list(csv.DictReader(io.StringIO(to_csv(report))))
    (pc_row,) = [r for r in rows if r["component"] == "lambda-pc"]
    assert (float(pc_row["billed_seconds"]), float(pc_row["gb_seconds"])) == (1200.0, 4800.0)
    assert float(pc_row["cost"]) == pytest.approx(pc)

    out = Console(file=io.StringIO(), width=200, record=True)
    print_report(out, report)
    text = out.export_text()
    line = next(x for x in text.splitlines() if "lambda-pc" in x and "billed" in x)
    assert "4800.000" in line and f"{pc:.6f}" in line
    assert f"lambda-pc ${pc:.6f}" in text

    png = plot(report, tmp_path / "cost.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_stopped_volumes_are_billed_from_each_stop_to_the_next_start_or_until() -> None:
    # i-b lay stopped from T0+100 to T0+500 (started again), and from T0+520 on.
    gb, price = 8.0, 0.08
    per_s = gb * price / (730 * 3600)  # $ per second of an 8 GB gp3 volume
    charges = collect_charges(
        LEDGER, INSTANCES, EVENTS, since=None, until=UNTIL, volume_gb=gb, gb_month=price
    )
    ebs = sorted(
        (c.entry.start, c.entry.end, c.status, c.entry.cost)
        for c in charges
        if c.entry.component == "ebs"
    )
    assert [(s, e, st) for s, e, st, _ in ebs] == [
        (T0 + 100, T0 + 500, BILLED),
        (T0 + 520, UNTIL, ACCRUING),
    ]
    assert [cost for *_, cost in ebs] == pytest.approx([400 * per_s, 480 * per_s])
    # Nothing else moves: the EC2 charges are those without volumes, and the totals add
    # the volumes' cost but no EC2 second.
    without = collect_charges(LEDGER, INSTANCES, EVENTS, since=None, until=UNTIL)
    assert [c for c in charges if c.entry.component != "ebs"] == without
    t, t0 = totals(aggregate(charges)), totals(aggregate(without))
    assert t.cost == pytest.approx(t0.cost + 880 * per_s)
    assert t.ec2_billed_seconds == t0.ec2_billed_seconds
    assert t.by_component["ebs"] == pytest.approx(880 * per_s)
