"""The orphan sweep's decisions, as `mark plan` and `mark status` show them."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from typer.testing import CliRunner

from mark.cli.main import app
from mark.state import Decision, InstanceRecord, PlanRecord, open_store


def _record(url: str, at: float) -> None:
    async def go() -> None:
        store = await open_store(url, upgrade=True)
        try:
            await store.upsert_instance(
                InstanceRecord(
                    "i-old", "retired", "c5.large", "on-demand", "serving", "running", 0.085, 0, at
                )
            )
            await store.record_plan(PlanRecord("digits", at - 60, "greedy", [1.0], 0.085))
            await store.record_decision(
                Decision("retired", at - 60, "orphan", "an older step's", "c5.large", None, 1, "x")
            )
            await store.record_plan(PlanRecord("digits", at, "greedy", [1.0], 0.085))
            await store.record_decision(
                Decision(
                    "retired",
                    at,
                    "orphan",
                    "model 'retired' is not configured any more; an orphan since t=1, "
                    "terminated at t=601, after the grace of 600 s",
                    "c5.large",
                    "on-demand",
                    1,
                    "i-old",
                )
            )
            await store.record_decision(Decision("digits", at, "launch", "not an orphan"))
        finally:
            await store.close()

    asyncio.run(go())


def test_plan_and_status_show_the_last_steps_orphans(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/s.db"
    db = ["--set", f"database_url={url}"]
    _record(url, time.time())
    runner = CliRunner()
    plan = runner.invoke(app, [*db, "plan", "--explain"], terminal_width=200)
    assert plan.exit_code == 0, plan.output
    assert "orphan: i-old (retired)" in plan.output
    assert "not configured any more" in plan.output
    assert "an older step's" not in plan.output and "not an orphan" not in plan.output
    status = runner.invoke(app, [*db, "status"], terminal_width=250)
    assert status.exit_code == 0, status.output
    assert "orphans at the last step (1)" in status.output
    assert "i-old" in status.output and "not configured any more" in status.output
