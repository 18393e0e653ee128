"""In the local world, under load: an agent killed with SIGKILL, and a model that hangs.

Each is drained at once (no new batches), and its instance replaced by the
control loop within the boot deadline plus a control step; every request the
load sent while the agent died is answered (spilled to Lambda meanwhile).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from mark.config import Settings, load_settings
from mark.daemon import Running, start, stop
from mark.demo import ensure_demo_model
from mark.demo.loadgen import run_load
from mark.demo.rate_profile import RateProfile
from tests.processes import left_behind

P_U = 5.0
DEADLINE = 30.0
UNHEALTHY = 3.0


def _settings(tmp_path: Path, **model: Any) -> Settings:
    settings = load_settings(
        overrides={
            "data_dir": str(tmp_path),
            "api": {"port": 0},
            "offerings": {"types": ["c5.large"], "standby_types": []},
            "timings": {
                "update_period_s": P_U,
                "lead_time_s": 5,
                "cooldown_s": 600,
                "boot_deadline_s": DEADLINE,
                "unhealthy_after_s": UNHEALTHY,
            },
            "predictor": {"model": "last"},
            "local": {"boot_delay_s": 0, "lambda_concurrency": 2},
        }
    )
    spec = settings.models[0].model_copy(update=model)
    return settings.model_copy(update={"models": (spec,)})


async def _serving(run: Running, within: float, exclude: set[str] = frozenset()) -> str:  # type: ignore[assignment]
    dispatcher = run.models["digits"].dispatcher
    assert dispatcher is not None
    deadline = time.monotonic() + within
    while True:
        ids = [b for b in dispatcher.backends if b not in exclude]
        if ids:
            return ids[0]
        assert time.monotonic() < deadline, f"no instance served within {within:g} s"
        await asyncio.sleep(0.5)


@pytest.mark.slow
async def test_a_killed_agent_is_drained_and_replaced_and_no_request_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ensure_demo_model(tmp_path)
    monkeypatch.setenv("MARK_DATA_DIR", str(tmp_path))
    run = await start(_settings(tmp_path))
    try:
        load = asyncio.create_task(
            run_load(run.url, "digits", RateProfile.parse("0:8,100:8"), seed=1)
        )
        victim = await _serving(run, 60)
        procs = run.world.agents.procs  # type: ignore[union-attr]
        os.kill(procs[victim].process.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        replacement = await _serving(run, DEADLINE + P_U + 15, exclude={victim})
        took = time.monotonic() - killed_at
        assert replacement != victim
        result = await load
        summary = result.summary
        assert summary is not None
        # Every request answered: a result, or declined by the SLO's miss budget.
        assert summary.sent > 500 and summary.errors == summary.declined
        assert summary.ok + summary.declined == summary.sent
        rows = [d for d in await run.store.decisions(0, 1e12) if d.action == "replace-unhealthy"]
        assert [d.instance_id for d in rows] == [victim], rows
        states = [e.state for e in await run.store.instance_events(victim)]
        assert "ready" in states and "draining" in states, states  # as `mark status` shows
        print(f"replacement serving {took:.1f} s after the kill")
    finally:
        await stop(run)


@pytest.mark.slow
async def test_a_hung_model_fails_its_probe_is_drained_and_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, children_before: frozenset[int]
) -> None:
    ensure_demo_model(tmp_path)
    monkeypatch.setenv("MARK_DATA_DIR", str(tmp_path))
    flag = tmp_path / "stall"
    monkeypatch.setenv("MARK_TEST_STALL_FILE", str(flag))
    run = await start(_settings(tmp_path, source="tests.e2e.stall_model:stalling_digits"))
    try:
        load = asyncio.create_task(
            run_load(run.url, "digits", RateProfile.parse("0:6,90:6"), seed=2, timeout_s=70)
        )
        stuck = await _serving(run, 60)
        flag.touch()  # the next batch on the agent hangs
        hung_at = time.monotonic()
        dispatcher = run.models["digits"].dispatcher
        assert dispatcher is not None
        while stuck in dispatcher.backends:  # drained: no new batches
            assert time.monotonic() - hung_at < 5.0 + 5.0 + 5.0, "not drained within a probe"
            await asyncio.sleep(0.2)
        drained = time.monotonic() - hung_at
        flag.unlink()  # the replacement's model runs normally
        await _serving(run, DEADLINE + P_U + 15, exclude={stuck})
        rows = [d for d in await run.store.decisions(0, 1e12) if d.action == "replace-unhealthy"]
        deadline = time.monotonic() + UNHEALTHY + 2 * P_U + 5
        while not rows:
            assert time.monotonic() < deadline, "the hung instance was not replaced"
            await asyncio.sleep(0.5)
            rows = [
                d for d in await run.store.decisions(0, 1e12) if d.action == "replace-unhealthy"
            ]
        assert rows[0].instance_id == stuck and "liveness" in rows[0].reason
        load.cancel()
        print(f"drained {drained:.1f} s after the model hung")
    finally:
        await stop(run)
    assert left_behind(os.getpid(), children_before) == [], "the hung agent outlived the daemon"
