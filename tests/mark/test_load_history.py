"""``LoadHistory`` read back from a store: the worst rise a task outside the step rates
the fleet with is the one the step's forecast carries."""

from __future__ import annotations

from mark.control.history import LoadHistory
from mark.sim.memstore import MemoryStore
from mark.state.records import ArrivalWindow


async def test_the_worst_rise_is_the_forecasts_own() -> None:
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
    seen = await history.forecast("m", now, 5, lead_minutes=2)
    assert seen.worst_rise == await history.worst_rise("m", now, 2) == 3.0
    assert await history.worst_rise("m", now, 0) is None
    assert await history.worst_rise("other", now, 2) is None  # nothing recorded
