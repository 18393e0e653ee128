"""Per-minute max 5 s rates, and archive gaps treated as missing, not as load."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from predictor.base import History
from predictor.traces import (
    TraceError,
    load_trace,
    minute_max_rates,
    shipped_trace,
    zero_gap_mask,
)

TWITTER = shipped_trace("twitter")
START = np.datetime64("2021-08-01T00:00", "m")


def test_minute_value_is_the_max_five_second_rate() -> None:
    counts = np.full(120, 10.0)
    counts[65:70] = 30.0  # one 5 s window of the second minute at 30/s
    counts[71] = 60.0  # one second at 60: its window averages (60 + 4*10)/5 = 20/s
    h = minute_max_rates(counts, START)
    np.testing.assert_allclose(h.values, [10.0, 30.0])
    assert h.start == START


def test_a_long_zero_run_and_the_second_before_it_are_gaps() -> None:
    counts = np.full(300, 5.0)
    counts[100:161] = 0  # 61 s: a gap
    counts[200:260] = 0  # 60 s: real silence, kept
    mask = zero_gap_mask(counts, gap_seconds=60)
    assert mask[99:161].all()  # includes the partial second before the gap
    assert not mask[:99].any()
    assert not mask[161:].any()


def test_gap_minutes_are_nan_not_zero() -> None:
    counts = np.full(240, 8.0)
    counts[60:180] = 0  # two whole minutes of archive gap
    h = minute_max_rates(counts, START, zero_gap_mask(counts))
    assert np.isnan(h.values[1]) and np.isnan(h.values[2])
    assert h.values[0] == pytest.approx(8.0)  # its last second is masked, max unaffected
    assert h.values[3] == pytest.approx(8.0)


def test_per_second_csv_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "t.csv.gz"
    rows = "\n".join(f"{s},{3 if s % 2 else 7}" for s in range(180))
    with gzip.open(path, "wt") as fh:
        fh.write("second,requests\n" + rows + "\n")
    h = load_trace(path)
    assert len(h) == 3
    np.testing.assert_allclose(h.values, [5.4, 5.4, 5.4])  # windows hold 27 or 23: max 27/5


def test_nab_buckets_spread_to_minutes_and_zero_buckets_are_gaps(tmp_path: Path) -> None:
    path = tmp_path / "nab.csv"
    path.write_text(
        "timestamp,value\n2015-02-26 21:42:53,600\n2015-02-26 21:47:53,0\n2015-02-26 21:52:53,300\n"
    )
    h = load_trace(path)
    assert h.start == np.datetime64("2015-02-26T21:42", "m")
    assert len(h) == 15
    np.testing.assert_allclose(h.values[:5], 2.0)
    assert np.isnan(h.values[5:10]).all()
    np.testing.assert_allclose(h.values[10:], 1.0)


@pytest.mark.parametrize(
    ("content", "message"),
    [("a,b\n1,2\n", "unknown header"), ("second,requests\n1,x\n", "t.csv")],
)
def test_bad_files_are_trace_errors(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(content)
    with pytest.raises(TraceError, match=message):
        load_trace(path)


def test_missing_file_is_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="not found"):
        load_trace(tmp_path / "nope.csv")


def test_twitter_daily_gaps_are_missing_minutes() -> None:
    h: History = load_trace(TWITTER)
    assert len(h) == 14 * 1440
    nan = np.isnan(h.values)
    for day in range(14):
        # 23:31-23:59 of every day: 29 minutes with no data.
        assert nan[day * 1440 + 1411 : (day + 1) * 1440].all()
    assert nan.sum() == 14 * 29 + 2  # plus the 150 s gap inside day 12
    assert np.nanmin(h.values) > 30  # no gap leaks through as a near-zero minute


NAB = shipped_trace("nab")


def test_nab_outage_buckets_are_missing_minutes() -> None:
    h = load_trace(NAB)
    assert h.start == np.datetime64("2015-02-26T21:42", "m")
    assert len(h) == 15_902 * 5
    assert np.isnan(h.values).sum() == 29 * 5  # the 29 zero buckets of the README
    outage = (np.datetime64("2015-03-11T07:02") - h.start).astype(int)
    assert np.isnan(h.values[outage : outage + 130]).all()
