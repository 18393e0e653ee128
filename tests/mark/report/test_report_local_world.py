"""Done means: `mark report` over a ledger a real local-world run produced prints totals
equal to a hand computation from the store, and writes the PNG.

The run: requests spill to Lambda before any instance exists; a spot instance is
launched and the control loop (zero forecast, no cool-down) retires and bills it,
while keeping a stopped t3.large standby for the spot capacity at risk, which
it launches and stops. Whatever else the loop decides is in the store too, and
the hand computation below prices it the same way.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from mark.catalog import Market
from mark.config import load_settings
from mark.daemon import start, stop
from mark.demo import load_digits_tensors
from mark.ports import LaunchRequest
from mark.state import open_store

MARK = [sys.executable, "-m", "mark.cli.main"]
LAMBDA_GB_S = 1.66667e-05  # x86 $/GB-s, us-east-1
LAMBDA_REQUEST = 0.2 / 1_000_000


def ec2_by_hand(price_per_hour: float, start: float, end: float) -> float:
    return max(60.0, math.ceil(end - start - 1e-9)) * price_per_hour / 3600.0


def mark(*args: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MARK, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MARK_DATA_DIR": str(data_dir)},
    )


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


@pytest.mark.slow
async def test_report_totals_equal_a_hand_computation_over_a_local_world_run(
    tmp_path: Path,
) -> None:
    settings = load_settings(
        overrides={
            "data_dir": str(tmp_path),
            "api": {"port": 0},
            "offerings": {
                "types": ["c5.large"],
                "markets": ["spot", "on-demand"],
                "standby_types": ["t3.large"],
            },
            "timings": {
                "update_period_s": 1,
                "sample_window_s": 1,
                "cooldown_s": 0,
                "billing_minimum_s": 0,
                "lead_time_s": 0,
            },
            "predictor": {"model": "last"},
            "local": {"boot_delay_s": 0, "lambda_concurrency": 1},
        }
    )
    run = await start(settings)
    sent = 12
    try:
        x, _ = load_digits_tensors()
        key = {"Authorization": f"Bearer {run.api_key}"}
        async with aiohttp.ClientSession(headers=key) as session:
            for i in range(sent):  # no instance yet: every one spills to Lambda
                body = {"instances": [x[i].numpy().tolist()]}
                async with session.post(f"{run.url}/v1/models/digits:predict", json=body) as r:
                    assert r.status == 200, await r.text()
        assert run.world.fleet is not None
        (spot,) = await run.world.fleet.launch(LaunchRequest("digits", "c5.large", Market.SPOT))
        # The forecast ("last") is the max rate of the last 60 s, which slides with the
        # clock: the spilled requests keep an instance wanted for 60 s after the last one.
        deadline = time.monotonic() + 150
        while True:  # retired and billed; the standby it called for launched and stopped
            ledger = await run.store.ledger()
            standbys = [i for i in await run.store.instances() if i.role == "standby"]
            if any(e.instance_id == spot.instance_id for e in ledger) and any(
                s.state == "stopped" for s in standbys
            ):
                break
            assert time.monotonic() < deadline, "the loop never retired the spot instance"
            await asyncio.sleep(0.5)
    finally:
        await stop(run)
    until = math.ceil(time.time()) + 1

    # -- by hand, from the store ---------------------------------------------------
    store = await open_store(settings.db_url)
    try:
        instances = await store.instances()
        events = {i.instance_id: await store.instance_events(i.instance_id) for i in instances}
        ledger = await store.ledger()
    finally:
        await store.close()
    ec2 = ebs = 0.0
    volume_per_s = settings.offerings.volume_gb * 0.08 / (730 * 3600)  # gp3, $ per second
    components: set[str] = set()
    for inst in instances:
        start_at: float | None = inst.launched_at  # runs: launch/start -> stop/terminate
        stopped_at: float | None = None  # stopped volumes: stop -> start/terminate
        for ev in events[inst.instance_id]:
            if stopped_at is not None and ev.state not in ("stopping", "stopped"):
                ebs += (ev.at - stopped_at) * volume_per_s
                stopped_at = None
            if ev.state in ("stopped", "terminated") and start_at is not None:
                ec2 += ec2_by_hand(inst.price_per_hour, start_at, ev.at)
                start_at = None
            elif ev.state == "pending" and start_at is None:
                start_at = ev.at
            if ev.state in ("stopping", "stopped") and stopped_at is None:
                stopped_at = ev.at
        if start_at is not None:  # still live in the store: accrues up to --until
            ec2 += ec2_by_hand(inst.price_per_hour, start_at, until)
        if stopped_at is not None:  # still stopped: its volume accrues up to --until
            ebs += (until - stopped_at) * volume_per_s
            components.add("ebs")
        components.add("standby" if inst.role == "standby" else inst.market)
    for e in ledger:  # the ledger priced the same runs the same way
        if e.kind == "ec2":
            assert e.cost == pytest.approx(ec2_by_hand(e.unit_price, e.start, e.end))
    lambdas = [e for e in ledger if e.kind == "lambda"]
    lam = sum(e.gb_seconds * LAMBDA_GB_S + e.requests * LAMBDA_REQUEST for e in lambdas)
    # The world warms each Lambda runtime once at start: a billed request, as on AWS.
    warmups = settings.local.lambda_concurrency
    assert sum(e.requests for e in lambdas) == sent + warmups
    assert {"spot", "standby"} <= components

    # -- mark report ---------------------------------------------------------------
    # The report prices nothing past its own clock (a stopped volume accrues to the
    # earlier of --until and now): run it once --until has passed.
    await asyncio.sleep(max(0.0, until - time.time()) + 0.1)
    common = ["--set", "offerings.types=[c5.large]", "report", "--until", iso(until)]
    out = mark(*common, "--format", "json", data_dir=tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    totals = doc["totals"]
    assert ebs > 0  # the stopped standby's volume
    assert totals["cost"] == pytest.approx(ec2 + lam + ebs, rel=1e-9)
    assert totals["by_component"]["ebs"] == pytest.approx(ebs, rel=1e-9)
    assert totals["by_component"]["lambda"] == pytest.approx(lam, rel=1e-9)
    assert set(totals["by_component"]) == components | {"lambda"}
    assert totals["lambda_requests"] == sent + warmups
    (cf,) = doc["counterfactual"]  # the same requests, through target tracking on c5.large
    assert cf["requests"] == sent and cf["instance_type"] == "c5.large"
    assert cf["cost"] >= 60 * 0.085 / 3600  # at least one instance, at least 60 s

    png = tmp_path / "cost.png"
    rps = str(cf["capacity_rps"])
    table = mark(*common, "--baseline-rps", rps, "--plot", str(png), data_dir=tmp_path)
    assert table.returncode == 0, table.stderr
    assert f"total ${ec2 + lam + ebs:.6f}" in table.stdout
    assert "counterfactual digits" in table.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    sys.stderr.write(table.stdout)  # shown with -s: the sample output
