"""The Bouncer's admission rule, by hand-computed cases."""

from __future__ import annotations

from bouncer.admission import admit
from bouncer.latency import BatchLatency

T = BatchLatency.from_mapping({1: 0.10, 4: 0.16, 8: 0.24})


def test_latency_table_interpolates_and_extrapolates() -> None:
    assert T(1) == 0.10 and T(4) == 0.16
    assert abs(T(2) - 0.12) < 1e-12  # on the 1..4 segment
    assert abs(T(6) - 0.20) < 1e-12
    assert abs(T(10) - 0.28) < 1e-12  # last slope, 0.02 per item
    assert abs(T.scaled(2.0)(4) - 0.32) < 1e-12


def test_idle_instance_admits_everything_that_fits() -> None:
    d = admit(now=10.0, busy_until=0.0, deadlines=[10.5, 10.5, 10.5, 10.5], batch_latency=T)
    assert d.admitted == (0, 1, 2, 3) and d.rejected == ()
    assert d.start == 10.0 and abs(d.finish - 10.16) < 1e-12


def test_a_busy_queue_pushes_out_the_tight_deadlines() -> None:
    # busy until 10.3: a batch of 3 ends at 10.44, of 2 at 10.42, of 1 at 10.40
    d = admit(now=10.0, busy_until=10.3, deadlines=[10.35, 10.9, 10.43], batch_latency=T)
    assert d.admitted == (1, 2) and d.rejected == (0,)
    assert d.start == 10.3 and abs(d.finish - 10.42) < 1e-12
    d = admit(now=10.0, busy_until=10.3, deadlines=[10.35, 10.9, 10.41], batch_latency=T)
    assert d.admitted == (1,) and d.rejected == (0, 2)


def test_keeps_the_largest_feasible_batch() -> None:
    # 3 together end at 10.14: the 10.13 deadline cannot be met, the other two can (10.12)
    d = admit(now=10.0, busy_until=0.0, deadlines=[10.13, 11.0, 11.0], batch_latency=T)
    assert d.admitted == (1, 2) and d.rejected == (0,)


def test_nothing_fits_means_everything_spills_now() -> None:
    d = admit(now=10.0, busy_until=12.0, deadlines=[11.0, 11.5], batch_latency=T)
    assert d.admitted == () and d.rejected == (0, 1) and d.size == 0
