"""Telemetry windows and roll-ups by hand."""

from __future__ import annotations

import pytest

from mark.serve.telemetry import Telemetry
from provisioner.spill_evidence import SpillCounts


def test_arrivals_per_window_and_minute_rollups_close_on_time() -> None:
    t = Telemetry("m", rt_max_ms=100, sample_window_s=5, recent_size=3)
    t.arrival(0.5, 2)
    t.arrival(4.9)
    t.arrival(5.0, 4)
    t.outcome(1.0, 0.050, ok=True, spilled=False)
    t.outcome(2.0, 0.150, ok=True, spilled=True)  # a miss: over RT_max
    t.outcome(3.0, 0.010, ok=False, spilled=False)  # an error is a miss
    windows, rollups = t.drain(now=7.0)
    assert [(w.window_start, w.count) for w in windows] == [(0.0, 3)]  # 5..10 still open
    assert rollups == []  # minute 0 still open
    windows, rollups = t.drain(now=61.0)
    # Every closed window is handed over, the empty ones as zeros (zero load, not missing).
    assert [(w.window_start, w.count) for w in windows] == [(5.0, 4)] + [
        (5.0 * k, 0) for k in range(2, 12)
    ]
    (r,) = rollups
    assert (r.requests, r.slo_hits, r.slo_misses, r.spilled, r.errors) == (3, 1, 2, 1, 1)
    assert r.p50_ms == 50.0
    assert list(t.recent) == [True, False, False]
    assert 'mark_requests_total{model="m",outcome="spilled"} 1' in t.prometheus()
    assert t.drain(now=60.0) == ([], [])  # nothing closed since
    windows, rollups = t.drain(now=1e9)  # after a long stall: at most an hour of zeros
    assert rollups == []
    assert len(windows) == 720 and {w.count for w in windows} == {0}
    assert windows[-1].window_start == 1e9 - 5.0


def test_a_quiet_daemon_records_zero_windows_from_its_start() -> None:
    t = Telemetry("m", rt_max_ms=100, sample_window_s=5, started_at=12.0)
    windows, _ = t.drain(now=27.0)
    assert [(w.window_start, w.count) for w in windows] == [(10.0, 0), (15.0, 0), (20.0, 0)]
    t.arrival(27.5, 3)
    windows, _ = t.drain(now=31.0)
    assert [(w.window_start, w.count) for w in windows] == [(25.0, 3)]


def test_spilled_outcomes_and_lambda_charges_are_handed_over_once() -> None:
    tel = Telemetry("m", rt_max_ms=600.0)
    tel.outcome(10.0, 0.3, ok=True, spilled=True)  # in time
    tel.outcome(10.1, 1.5, ok=True, spilled=True)  # a cold start: late
    tel.outcome(10.2, 0.2, ok=False, spilled=True)  # the spill failed
    tel.outcome(10.3, 0.1, ok=True, spilled=False)  # served on an instance: not a spill
    tel.lambda_charged(3e-5)
    tel.lambda_charged(2e-5)
    got = tel.take_spills()
    assert (got.total, got.within) == (3, 1)
    assert got.cost == pytest.approx(5e-5)
    assert tel.take_spills() == SpillCounts()


def test_requests_and_rows_are_counted_apart() -> None:
    """Ten calls of 16 instances are 10 requests and 160 rows, in the minute's roll-up
    and in /metrics; the rows stay the load the planner sees (arrival windows)."""
    t = Telemetry("m", rt_max_ms=100, sample_window_s=5)
    for i in range(10):
        t.arrival(1.0 + i, 16)
        for _ in range(16):
            t.outcome(1.0 + i, 0.01, ok=True, spilled=False)
    windows, (r,) = t.drain(now=61.0)
    assert sum(w.count for w in windows) == 160
    assert (r.http_requests, r.requests) == (10, 160)
    text = t.prometheus()
    assert 'mark_inference_requests_total{model="m"} 10\n' in text
    assert 'mark_rows_total{model="m"} 160\n' in text
    assert 'mark_requests_total{model="m",outcome="served"} 160\n' in text  # rows, by outcome
