"""``LoadHistory`` read back from a store: the rise a pool sized for rises carries,
measured on the stored 5 s windows."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from bouncer.miss_budget import MissTally
from mark.control.history import LoadHistory, max_rate_per_minute
from mark.sim.memstore import MemoryStore
from mark.state.records import ArrivalWindow
from provisioner.control_state import Rise, StepConfig
from provisioner.guards import GuardConfig

GUARD = GuardConfig(cooldown_s=120.0, billing_minimum_s=60.0)
NONE_MISSED = MissTally(1000, 0)


async def test_the_carried_rise_is_measured_on_the_stored_windows() -> None:
    store = MemoryStore()
    # 20 minutes at 10 r/s, then three at 30 r/s: a rise of 3 within a 2-minute lead.
    rates = [10.0] * 20 + [30.0] * 3
    await store.add_arrivals(
        [
            ArrivalWindow("m", 60.0 * k + 5.0 * w, 5.0, int(rate * 5))
            for k, rate in enumerate(rates)
            for w in range(12)
        ]
    )
    history = LoadHistory(store, history_minutes=60, step_s=60.0)
    now = 60.0 * len(rates)
    # A 2-minute lead; the share of all requests rises may leave to miss.
    cfg = StepConfig(
        step_s=60.0, tau_steps=2, boot_s=120.0, window_steps=5, guard=GUARD, rise_by_misses=False
    )
    at = replace(cfg, rise_miss_share=0.05)
    assert await history.rise_to_carry("m", now, cfg, NONE_MISSED) == Rise(3.0, 3.0)  # all of it
    # The minutes with a level (ten before, and a lead): 9 at 10 r/s and the 3 at 30,
    # whose 36 windows miss 36·(30 − 10R), 5 % of all at R = 2.7.
    total = 12 * (9 * 10.0 + 3 * 30.0)
    rise = await history.rise_to_carry("m", now, at, NONE_MISSED)
    assert rise is not None and rise.carried == pytest.approx(3.0 - 0.05 * total / 36 / 10.0)
    assert await history.rise_to_carry("m", now, replace(at, tau_steps=0), NONE_MISSED) is None
    assert await history.rise_to_carry("other", now, at, NONE_MISSED) is None  # nothing recorded


async def test_recent_rates_are_the_closed_windows_newest_first_with_gaps_as_zero() -> None:
    store = MemoryStore()
    # Windows of 5 s from t=0: 10 r/s, none at 15 s (no request came), 30 r/s at 20 s,
    # and one still open at 25 s that ``now`` = 28 has not closed.
    await store.add_arrivals(
        [
            ArrivalWindow("m", 0.0, 5.0, 50),
            ArrivalWindow("m", 5.0, 5.0, 50),
            ArrivalWindow("m", 10.0, 5.0, 50),
            ArrivalWindow("m", 20.0, 5.0, 150),
            ArrivalWindow("m", 25.0, 5.0, 400),
        ]
    )
    history = LoadHistory(store, history_minutes=60, step_s=60.0)
    await history.minutes("m", 28.0)
    window_s, rates = history.recent_rates("m", 28.0, minutes=1)
    assert window_s == 5.0 and len(rates) == 12
    assert rates[:6] == [30.0, 0.0, 10.0, 10.0, 10.0, 0.0]
    assert history.recent_rates("other", 28.0) == (60.0, [])


async def test_the_columns_kept_step_by_step_are_the_series_as_read() -> None:
    """Each step reads only its last two minutes again; the columns it keeps match the
    stored windows one for one, late windows and those that aged out included."""
    store = MemoryStore()
    history = LoadHistory(store, history_minutes=10, step_s=60.0)
    rng = np.random.default_rng(4)
    for step in range(1, 40):
        now = 60.0 * step
        windows = [
            ArrivalWindow("m", now - 60.0 + 5.0 * w, 5.0, int(rng.integers(0, 90)))
            for w in range(12)
        ]
        late = ArrivalWindow("m", now - 90.0, 5.0, int(rng.integers(0, 90)))  # re-counted
        await store.add_arrivals([*windows[:-1], late])  # the last window is not yet flushed
        start, per_minute = await history.minutes("m", now)
        at, length, rate = history.columns("m")
        stored = {w.window_start: w for w in await store.arrivals("m", start, now)}
        assert sorted(at.tolist()) == sorted(stored)
        got = dict(zip(at.tolist(), rate.tolist(), strict=True))
        assert got == {k: w.rate for k, w in stored.items()}
        expected = max_rate_per_minute(list(stored.values()), start, 10)
        np.testing.assert_array_equal(per_minute, expected)
        assert set(length.tolist()) == {5.0}
