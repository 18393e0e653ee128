"""Traces at any starting offset: minute 0 is the first row, the clock is kept.

A per-second trace whose `second` starts at an offset, or is Unix time, gives
the same per-minute values (and the same evaluation) as the same trace written
from 0; rows out of order are sorted; a trace that cannot be read as one is a
one-line error naming the file and the problem.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from mark.cli.demo_cmd import app as demo_app
from mark.cli.predictor_cmd import app as predictor_app
from mark.demo.rate_profile import RateProfile
from predictor.traces import (
    MAX_SPAN_SECONDS,
    TWITTER_START,
    TraceError,
    load_trace,
    read_per_second,
)

runner = CliRunner()
EPOCH = 1_700_000_000  # 2023-11-14T22:13:20Z: 20 s past a minute
DAY = 86_400


def counts(seconds: int, seed: int = 0) -> np.ndarray:
    """A daily wave with noise, one archive gap (a zero run > 60 s) and a short real lull."""
    rng = np.random.default_rng(seed)
    t = np.arange(seconds)
    lam = 30 + 20 * np.sin(2 * np.pi * t / DAY) + 10 * np.sin(2 * np.pi * t / 3600)
    c: np.ndarray = rng.poisson(lam).astype(np.int64)
    c[5000:5400] = 0  # a gap: missing, not load
    c[9000:9030] = 0  # 30 s of silence: load
    return c


def write(path: Path, c: np.ndarray, offset: int, order: np.ndarray | None = None) -> Path:
    seconds = np.arange(c.shape[0], dtype=np.int64) + offset
    rows = np.column_stack([seconds, c])
    if order is not None:
        rows = rows[order]
    body = "\n".join(f"{s},{n}" for s, n in rows)
    text = "second,requests\n" + body + "\n"
    if path.suffix == ".gz":
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path


@pytest.fixture(scope="module")
def two_days() -> np.ndarray:
    return counts(2 * DAY)


@pytest.mark.parametrize("offset", [3_600, 7 * DAY + 37, EPOCH, -600])
def test_an_offset_trace_has_the_values_of_the_same_trace_from_zero(
    tmp_path: Path, two_days: np.ndarray, offset: int
) -> None:
    c = two_days[: 6 * 3600]
    zero = load_trace(write(tmp_path / "zero.csv", c, 0))
    shifted = load_trace(write(tmp_path / "shifted.csv.gz", c, offset))
    np.testing.assert_array_equal(shifted.values, zero.values)  # NaN where NaN
    assert np.isnan(zero.values).sum() >= 6  # the gap really is missing
    if offset >= 1_000_000_000:  # Unix seconds: the clock is the trace's own
        assert shifted.start == np.datetime64(offset, "s").astype("datetime64[m]")
    else:  # seconds since the default origin, the Twitter trace's second 0
        expected = TWITTER_START.astype("datetime64[s]") + np.timedelta64(offset, "s")
        assert shifted.start == expected.astype("datetime64[m]")


def test_epoch_seconds_keep_their_utc_time(tmp_path: Path, two_days: np.ndarray) -> None:
    trace = read_per_second(write(tmp_path / "e.csv", two_days[:600], EPOCH))
    assert trace.epoch == float(EPOCH)
    assert str(trace.start) == "2023-11-14T22:13:20"
    assert trace.counts.shape == (600,)


def test_a_slice_keeps_its_place_in_the_whole(tmp_path: Path, two_days: np.ndarray) -> None:
    """Rows 3600.. of a trace, seconds unchanged: the whole trace's window from minute 60."""
    c = two_days[: 4 * 3600]
    whole = load_trace(write(tmp_path / "whole.csv", c, 0))
    path = tmp_path / "slice.csv"
    path.write_text("second,requests\n" + "".join(f"{s},{c[s]}\n" for s in range(3600, c.shape[0])))
    part = load_trace(path)
    expected = whole.window(60, len(whole))
    assert part.start == expected.start
    np.testing.assert_array_equal(part.values, expected.values)


def test_rows_out_of_order_are_sorted_by_their_seconds(
    tmp_path: Path, two_days: np.ndarray
) -> None:
    c = two_days[:7200]
    order = np.random.default_rng(3).permutation(c.shape[0])
    shuffled = load_trace(write(tmp_path / "shuffled.csv", c, EPOCH, order))
    in_order = load_trace(write(tmp_path / "sorted.csv", c, EPOCH))
    assert shuffled.start == in_order.start
    np.testing.assert_array_equal(shuffled.values, in_order.values)


def test_a_nab_trace_counts_from_its_first_row_in_any_order(tmp_path: Path) -> None:
    rows = [("2015-02-26 21:42:53", 600), ("2015-02-26 21:47:53", 0), ("2015-02-26 21:52:53", 300)]
    a = tmp_path / "a.csv"
    a.write_text("timestamp,value\n" + "".join(f"{t},{v}\n" for t, v in rows))
    b = tmp_path / "b.csv"  # a year later, rows reversed
    later = [(t.replace("2015", "2016"), v) for t, v in reversed(rows)]
    b.write_text("timestamp,value\n" + "".join(f"{t},{v}\n" for t, v in later))
    ha, hb = load_trace(a), load_trace(b)
    np.testing.assert_array_equal(ha.values, hb.values)
    assert hb.start == np.datetime64("2016-02-26T21:42", "m")


def _evaluate(trace: Path) -> list[dict[str, float]]:
    res = runner.invoke(
        predictor_app,
        [
            "evaluate",
            "--trace",
            str(trace),
            "--models",
            "last,seasonal,paper",
            "--train-days",
            "1",
            "--horizon",
            "30",
            "--stride",
            "30",
            "--format",
            "json",
        ],
    )
    assert res.exit_code == 0, res.output
    scores: list[dict[str, float]] = json.loads(res.stdout)["scores"]
    return [{k: v for k, v in s.items() if k not in ("fit_seconds", "forecast_ms")} for s in scores]


def test_evaluate_scores_an_offset_trace_as_the_same_trace_from_zero(
    tmp_path: Path, two_days: np.ndarray
) -> None:
    """The failure this fixes: an offset made the training head all-missing
    ("cannot fit on a history with no observed values")."""
    zero = _evaluate(write(tmp_path / "zero.csv", two_days, 0))
    assert zero[0]["steps"] > 0
    assert _evaluate(write(tmp_path / "week.csv.gz", two_days, 7 * DAY)) == zero
    assert _evaluate(write(tmp_path / "epoch.csv", two_days, EPOCH)) == zero


def test_train_fits_on_an_epoch_trace(tmp_path: Path, two_days: np.ndarray) -> None:
    trace = write(tmp_path / "epoch.csv", two_days[: DAY // 2], EPOCH)
    out = tmp_path / "m.npz"
    res = runner.invoke(
        predictor_app, ["train", "--trace", str(trace), "--model", "paper", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert out.is_file()


def test_a_demo_replay_of_an_offset_trace_is_the_same_profile(
    tmp_path: Path, two_days: np.ndarray
) -> None:
    c = two_days[:7200]
    zero = RateProfile.from_trace(write(tmp_path / "zero.csv", c, 0), start_minute=10)
    epoch = RateProfile.from_trace(write(tmp_path / "epoch.csv", c, EPOCH), start_minute=10)
    assert epoch.points == zero.points
    assert len(zero.points) == 110


BAD = [
    ("empty.csv", "", "empty file"),
    ("header.csv", "second,requests\n", "no rows after the header"),
    ("nab-header.csv", "timestamp,value\n", "no rows after the header"),
    ("twice.csv", "second,requests\n0,1\n1,2\n1,3\n", "second 1 appears in more than one row"),
    ("twice-unsorted.csv", "second,requests\n5,1\n3,2\n5,3\n", "second 5 appears in more"),
    ("fraction.csv", "second,requests\n0,1\n0.5,2\n", "row 2: second 0.5 is not a whole second"),
    ("negative.csv", "second,requests\n0,1\n1,-2\n", "row 2: requests -2.0 is not a count"),
    ("nan.csv", "second,requests\n0,1\n1,nan\n", "row 2: requests nan is not a count"),
    ("millis.csv", "second,requests\n1700000000000,1\n", "not milliseconds"),
    ("span.csv", f"second,requests\n0,1\n{2 * MAX_SPAN_SECONDS},1\n", "span 800 days"),
    (
        "nab-close.csv",
        "timestamp,value\n2015-01-01 00:00:00,1\n2015-01-01 00:02:00,1\n",
        "are 2 min apart",
    ),
    (
        "nab-twice.csv",
        "timestamp,value\n2015-01-01 00:05:00,1\n2015-01-01 00:00:00,1\n2015-01-01 00:05:00,2\n",
        "are 0 min apart",
    ),
    ("nab-negative.csv", "timestamp,value\n2015-01-01 00:00:00,-1\n", "value -1.0 is not a count"),
]


@pytest.mark.parametrize(("name", "content", "message"), BAD, ids=[b[0] for b in BAD])
def test_a_trace_that_cannot_be_read_as_one_is_a_trace_error(
    tmp_path: Path, name: str, content: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(TraceError, match=message) as info:
        load_trace(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(("name", "content", "message"), BAD, ids=[b[0] for b in BAD])
def test_the_cli_says_what_is_wrong_with_a_bad_trace_in_one_line(
    tmp_path: Path, name: str, content: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    res = runner.invoke(predictor_app, ["evaluate", "--trace", str(path), "--models", "last"])
    assert res.exit_code == 2
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)


def test_demo_load_refuses_a_bad_trace_before_sending_anything(tmp_path: Path) -> None:
    path = tmp_path / "twice.csv"
    path.write_text("second,requests\n0,1\n0,2\n")
    res = runner.invoke(demo_app, ["load", "http://127.0.0.1:9", "--trace", str(path)])
    assert res.exit_code == 2
    assert "second 0 appears in more than one row" in " ".join(res.output.split())
