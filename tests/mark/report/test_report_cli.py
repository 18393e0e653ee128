"""`mark report` as a user runs it, over a real store (SQLite and PostgreSQL) written the
way the controller and the daemon write it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mark.state import open_store
from mark.state.records import ArrivalWindow, InstanceRecord, LedgerEntry

MARK = [sys.executable, "-m", "mark.cli.main"]
T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z
UNTIL = "2023-11-14T22:30:00Z"  # T0 + 1000


def mark(*args: str, db_url: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MARK, "--set", f"database_url={db_url}", "report", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MARK_DATA_DIR": str(data_dir)},
    )


async def seed(db_url: str) -> None:
    """A retired on-demand instance (ledger), a standby started twice (events only),
    a spot instance still live (accruing), Lambda spill, 3 minutes of arrivals."""
    store = await open_store(db_url, upgrade=True)
    try:

        async def launch(
            iid: str, itype: str, market: str, role: str, price: float, at: float
        ) -> None:
            rec = InstanceRecord(iid, "digits", itype, market, role, "pending", price, at, at)
            await store.upsert_instance(rec, reason="planner")

        await launch("i-a", "c5.large", "on-demand", "serving", 0.085, T0)
        await store.set_instance_state("i-a", "terminated", T0 + 30, reason="retired")
        await launch("i-b", "t3.large", "on-demand", "standby", 0.0832, T0)
        await store.set_instance_state("i-b", "stopped", T0 + 100)
        await store.set_instance_state("i-b", "pending", T0 + 500)
        await store.set_instance_state("i-b", "stopped", T0 + 520)
        await launch("i-c", "c5.large", "spot", "serving", 0.0286, T0 + 200)
        await store.add_charges(
            [
                LedgerEntry(
                    "ec2", "digits", T0, T0 + 30, "on-demand", 0.085, 60 * 0.085 / 3600,
                    "i-a", "c5.large", 30.0, 60.0,
                ),
                LedgerEntry(
                    "lambda", "digits", T0 + 40, T0 + 60, "lambda", 1.66667e-05,
                    500 * 1.66667e-05 + 1000 * 0.2e-6,
                    seconds=249.5, billed_seconds=250.0, requests=1000, gb_seconds=500.0,
                ),
            ]
        )  # fmt: skip
        await store.add_arrivals(
            [
                ArrivalWindow("digits", T0 + 60 * k + 5 * j, 5.0, 50)
                for k in range(3)
                for j in range(12)
            ]
        )
    finally:
        await store.close()


async def test_report_json_totals_and_counterfactual_match_hand_sums(
    db_url: str, tmp_path: Path
) -> None:
    await seed(db_url)
    out = mark(
        "--until", UNTIL, "--format", "json", "--baseline-rps", "10",
        db_url=db_url, data_dir=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    on_demand = 60 * 0.085 / 3600  # 30 s bills the 60 s minimum
    standby = (100 + 60) * 0.0832 / 3600  # 100 s, then 20 s billed 60 s
    spot = 800 * 0.0286 / 3600  # T0+200 .. until, accruing
    lam = 500 * 1.66667e-05 + 1000 * 0.2 / 1e6
    # the standby's 8 GB volume (offerings.volume_gb) while stopped: T0+100 .. T0+500,
    # then T0+520 .. until, accruing; gp3 at $0.08 per GB-month of 730 h
    ebs = (400 + 480) * 8 * 0.08 / (730 * 3600)
    t = doc["totals"]
    assert t["by_component"] == pytest.approx(
        {"on-demand": on_demand, "standby": standby, "spot": spot, "lambda": lam, "ebs": ebs}
    )
    assert t["cost"] == pytest.approx(on_demand + standby + spot + lam + ebs)
    assert t["accruing"] == pytest.approx(spot + 480 * 8 * 0.08 / (730 * 3600))
    # 600 requests/min, 10 r/s per instance at 2x: target 300/min -> 2 ml.c5.large for
    # 180 s, at the ml.c5.large hosting price (derived: c5 markup 1.2 × EC2 0.085 = 0.102)
    (cf,) = doc["counterfactual"]
    assert (cf["instance_type"], cf["requests"], cf["peak_instances"]) == ("c5.large", 1800, 2)
    assert cf["price_per_hour"] == pytest.approx(0.102)
    assert cf["cost"] == pytest.approx(2 * 180 * 0.102 / 3600)
    assert "c5 markup 1.2" in cf["price_source"]
    assert cf["mark_cost"] == pytest.approx(t["cost"])
    assert any("ml.* real-time hosting price" in n for n in doc["notes"])

    csv_out = mark("--until", UNTIL, "--format", "csv", "--no-baseline", db_url=db_url,
                   data_dir=tmp_path)  # fmt: skip
    assert csv_out.returncode == 0, csv_out.stderr
    lines = csv_out.stdout.strip().splitlines()
    assert len(lines) == 1 + len(doc["rows"])

    table = mark("--until", UNTIL, "--since", "2023-11-14", "--no-baseline", db_url=db_url,
                 data_dir=tmp_path)  # fmt: skip
    assert table.returncode == 0, table.stderr
    assert "accruing" in table.stdout and f"{t['cost']:.6f}" in table.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--since", "yesterday"), "--since 'yesterday' is not an ISO date"),
        (("--until", "2024-02-30"), "--until '2024-02-30' is not an ISO date"),
        (("--since", "2024-05-02", "--until", "2024-05-01"), "must be before"),
        (("--baseline-type", "zz.top"), "unknown instance type 'zz.top'"),
        (("--baseline-type", "p2.xlarge"), "no SageMaker ml.* hosting price for p2.xlarge"),
    ],
)
def test_bad_input_ends_in_one_line_and_exit_2(
    args: tuple[str, ...], needle: str, tmp_path: Path
) -> None:
    out = mark(*args, db_url=f"sqlite:///{tmp_path}/m.db", data_dir=tmp_path)
    assert out.returncode == 2
    assert needle in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
