"""The ramp demo's calibration: the world emulates the very profile the slowdown was
calibrated on, so the c5.large the planner rates is the one the demo asked for."""

from __future__ import annotations

from pathlib import Path

import pytest

from bouncer.latency import BatchLatency
from mark.catalog import load_catalog
from mark.control import resolve_source
from mark.demo.ramp_settings import RampSettings, use_demo_model
from mark.world import open_world


async def test_the_world_emulates_the_calibrated_profile(tmp_path: Path) -> None:
    layers = RampSettings.for_run(
        None,
        {"data_dir": str(tmp_path)},
        database=tmp_path / "ramp.db",
        update_period_s=60.0,
        cooldown_s=90.0,
        boot_delay_s=5.0,
        slowdown=None,
        plain_model=False,
    )
    settings = layers.load()
    use_demo_model(settings)
    target = 0.5  # s: slower than any machine runs the model, so the factor is > 1
    slowdown, t1 = layers.calibrate(settings, target)
    pinned = layers.load()
    spec = pinned.models[0]
    profile = BatchLatency.parse(pinned.local.reference_profile[spec.name])
    assert profile(1) == t1 and slowdown == pytest.approx(target / t1)
    assert pinned.local.slowdown["c5.large"] == slowdown

    world = open_world(pinned, {spec.name: resolve_source(spec, pinned.data_dir)}, lambda: 0.0)
    source = resolve_source(spec, pinned.data_dir)
    emulated = await world.emulated_latency(spec, source, load_catalog(), ["c5.large"])
    assert emulated["c5.large"](1) == pytest.approx(target)
    assert emulated["c5.large"].points == profile.scaled(slowdown).points
