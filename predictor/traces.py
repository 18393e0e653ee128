"""Load request traces as per-minute maximum 5-second rates.

The paper (§4.2) samples arrivals in P_s = 5 s windows and forecasts the
maximum 5 s rate of each P_u = 1 min unit, because capacity must cover the
peak of the minute, not its mean.

Gaps. An archive outage shows up as a run of zeros, and zero load it is not:
the Twitter dev trace loses 23:31:01-23:59:59 of every day, NAB AAPL has a
130-minute collection outage. So a run of zero seconds longer than
`gap_seconds` (60 s by default) is *missing*: its 5 s windows are dropped, a
minute with fewer than half of its windows left is NaN, and so is the second
just before the run (the archive cut off mid-second; it holds 1-12 requests
where its neighbours hold ~45). Models interpolate across NaN when they need
a grid (`History.filled`), training masks NaN targets out of the loss, and
evaluation scores no NaN minute. Shorter zero runs are kept as load.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import IO

import numpy as np
from numpy.typing import NDArray

from predictor.base import FloatArray, ForecasterError, History

SAMPLE_SECONDS = 5
UNIT_SECONDS = 60
GAP_SECONDS = 60
# Inferred, not recorded by the source (see the traces README).
TWITTER_START = np.datetime64("2021-08-01T00:00", "m")


class TraceError(ForecasterError):
    """The file is missing or is not a trace this module understands."""


def zero_gap_mask(counts: NDArray[np.float64], gap_seconds: int = GAP_SECONDS) -> NDArray[np.bool_]:
    """True where a second belongs to an archive gap (see module docstring)."""
    zero = counts == 0
    edges = np.diff(np.concatenate(([0], zero.astype(np.int8), [0])))
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)
    mask = np.zeros(counts.shape[0], dtype=bool)
    for s, e in zip(starts, ends, strict=True):
        if e - s > gap_seconds:
            mask[max(0, s - 1) : e] = True
    return mask


def minute_max_rates(
    counts: NDArray[np.float64],
    start: np.datetime64,
    missing: NDArray[np.bool_] | None = None,
    sample_seconds: int = SAMPLE_SECONDS,
) -> History:
    """Per-second counts -> per-minute maximum `sample_seconds` rate (req/s).

    A trailing partial minute is dropped; a window with any missing second is
    dropped; a minute keeps its max only if at least half its windows survive.
    """
    if UNIT_SECONDS % sample_seconds:
        raise ValueError("sample_seconds must divide 60")
    per_unit = UNIT_SECONDS // sample_seconds
    n_min = counts.shape[0] // UNIT_SECONDS
    counts = np.asarray(counts[: n_min * UNIT_SECONDS], dtype=np.float64)
    rates = counts.reshape(-1, sample_seconds).sum(axis=1) / sample_seconds
    if missing is not None:
        bad = missing[: n_min * UNIT_SECONDS].reshape(-1, sample_seconds).any(axis=1)
        rates[bad] = np.nan
    windows = rates.reshape(n_min, per_unit)
    valid = np.isfinite(windows).sum(axis=1)
    out = np.full(n_min, np.nan)
    keep = valid * 2 >= per_unit
    out[keep] = np.nanmax(windows[keep], axis=1)
    return History(out, start)


def per_second_counts(
    path: Path, gap_seconds: int = GAP_SECONDS
) -> tuple[FloatArray, NDArray[np.bool_]]:
    """A `second,requests` CSV (optionally gzip) -> counts per second, and which
    seconds are missing (absent rows, or zero runs longer than ``gap_seconds``)."""
    table = _read_csv(path, dtype=np.float64)
    seconds = table[:, 0].astype(np.int64)
    if seconds.size == 0 or seconds.min() < 0:
        raise TraceError(f"{path}: no rows or negative seconds")
    counts = np.zeros(int(seconds.max()) + 1)
    counts[seconds] = table[:, 1]
    absent = np.ones(counts.shape[0], dtype=bool)
    absent[seconds] = False
    return counts, zero_gap_mask(counts, gap_seconds) | absent


def load_per_second(
    path: Path, start: np.datetime64 = TWITTER_START, gap_seconds: int = GAP_SECONDS
) -> History:
    """A `second,requests` CSV (optionally gzip) -> per-minute max 5 s rates."""
    counts, missing = per_second_counts(path, gap_seconds)
    return minute_max_rates(counts, start, missing)


def trace_format(path: Path) -> str:
    """``per-second`` or ``nab``, from the CSV header."""
    if not path.is_file():
        raise TraceError(f"trace file not found: {path}")
    try:
        with _open(path) as fh:
            header = fh.readline().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: {exc}") from exc
    if header == "second,requests":
        return "per-second"
    if header == "timestamp,value":
        return "nab"
    raise TraceError(f"{path}: unknown header {header!r} (want second,requests or timestamp,value)")


def load_nab(path: Path) -> History:
    """A NAB `timestamp,value` CSV of 5-minute counts -> per-minute rates (req/s).

    A 5-minute count hides its peaks, so each of its minutes gets the bucket's
    mean rate (value / 300): the best this resolution allows. Zero buckets
    are gaps (a zero run of 300 s > 60 s). Minutes are aligned to the
    timestamp's minute (seconds are dropped).
    """
    try:
        with _open(path) as fh:
            header = fh.readline().strip()
            rows = [line.strip().split(",") for line in fh if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: {exc}") from exc
    if header != "timestamp,value" or not rows:
        raise TraceError(f"{path}: expected a NAB 'timestamp,value' CSV")
    try:
        stamps = np.array([r[0].replace(" ", "T") for r in rows], dtype="datetime64[m]")
        values = np.array([float(r[1]) for r in rows])
    except (ValueError, IndexError) as exc:
        raise TraceError(f"{path}: {exc}") from exc
    offsets = (stamps - stamps[0]).astype(np.int64)
    if np.any(np.diff(offsets) <= 0):
        raise TraceError(f"{path}: timestamps are not increasing")
    out = np.full(int(offsets[-1]) + 5, np.nan)
    rate = np.where(values > 0, values / 300.0, np.nan)
    for k in range(5):
        out[offsets + k] = rate
    return History(out, stamps[0])


def load_trace(path: str | Path, gap_seconds: int = GAP_SECONDS) -> History:
    """Any supported trace file, recognised by its CSV header."""
    path = Path(path)
    if trace_format(path) == "per-second":
        return load_per_second(path, gap_seconds=gap_seconds)
    return load_nab(path)


def _open(path: Path) -> IO[str]:
    return gzip.open(path, "rt") if path.suffix == ".gz" else path.open()


def _read_csv(path: Path, dtype: type) -> FloatArray:
    try:
        with _open(path) as fh:
            table: FloatArray = np.loadtxt(fh, delimiter=",", skiprows=1, dtype=dtype, ndmin=2)
    except (OSError, ValueError, EOFError) as exc:
        raise TraceError(f"{path}: {exc}") from exc
    if table.shape[1] != 2:
        raise TraceError(f"{path}: expected two columns")
    return np.asarray(table, dtype=np.float64)
