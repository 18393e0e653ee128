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

Offsets. A trace's first row is its minute 0, whatever its time: minutes are
counted from the first row's second (or NAB timestamp), so a trace shifted by
any offset yields the same values. The time is kept in `History.start` (the
minute of the first row), which the time-of-day and day-of-week features use:
a per-second trace's `second` is Unix time when the first one is at least
`EPOCH_SECONDS_FROM` (2001-09-09), and otherwise seconds since
`TWITTER_START`, the Twitter trace's second 0 (so a slice of it keeps its
clock). Rows may come in any order (they are sorted by time); a time that
appears twice, NAB buckets less than 5 minutes apart, fractional or
millisecond seconds, negative or non-numeric counts, or an empty file are
`TraceError`s.

Shipped traces. ``twitter`` and ``nab`` name the traces in
`predictor/data/traces/` (package data: an installed wheel carries them, with
their provenance and licences in that directory's README); `load_trace`
takes either name or a path.
"""

from __future__ import annotations

import gzip
import warnings
from dataclasses import dataclass
from importlib import resources
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
# A per-second trace whose first `second` is at least this (2001-09-09T01:46:40Z)
# counts Unix time; below it, seconds since TWITTER_START.
EPOCH_SECONDS_FROM = 1_000_000_000
# ... and from this on (year 5138) it is refused: milliseconds, most likely.
EPOCH_SECONDS_UNTIL = 100_000_000_000
# A per-second trace longer than this is refused before its arrays are built.
MAX_SPAN_SECONDS = 400 * 86_400
NAB_BUCKET_MINUTES = 5
# The traces shipped as package data (predictor/data/traces/), by name.
SHIPPED_TRACES = {
    "twitter": "twitter-2021-08-dev.csv.gz",
    "nab": "nab-twitter-aapl.csv.gz",
}


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


def shipped_trace(name: str) -> Path:
    """The path of a shipped trace (``twitter`` or ``nab``), inside the package."""
    if name not in SHIPPED_TRACES:
        raise TraceError(f"no shipped trace {name!r}; shipped: {', '.join(SHIPPED_TRACES)}")
    ref = resources.files(__package__ or "predictor") / "data" / "traces" / SHIPPED_TRACES[name]
    # A wheel or a checkout installs as a directory, so the resource is a file on disk.
    return Path(str(ref))


def resolve_trace(trace: str | Path) -> Path:
    """A shipped trace's name, or a path (a name wins over a file of that name in the
    working directory; write ``./twitter`` for the file)."""
    name = str(trace)
    return shipped_trace(name) if name in SHIPPED_TRACES else Path(trace)


@dataclass(frozen=True)
class PerSecondTrace:
    """Requests in each second from the first row on, which seconds are missing
    (absent rows, archive gaps), and the UTC time of the first row."""

    counts: FloatArray
    missing: NDArray[np.bool_]
    start: np.datetime64  # datetime64[s] of counts[0]

    @property
    def epoch(self) -> float:
        """Unix time of counts[0], in seconds."""
        return float(self.start.astype("datetime64[s]").astype(np.int64))


def read_per_second(
    path: Path, origin: np.datetime64 = TWITTER_START, gap_seconds: int = GAP_SECONDS
) -> PerSecondTrace:
    """A `second,requests` CSV (optionally gzip), relative to its first second.

    ``origin`` is the time of second 0 of a trace that counts from an origin of
    its own (its first second below `EPOCH_SECONDS_FROM`); larger seconds are
    Unix time. See the module docstring for what is refused.
    """
    table = _read_csv(path, dtype=np.float64)
    raw, values = table[:, 0], table[:, 1]
    if not np.isfinite(raw).all() or (raw != np.round(raw)).any():
        row = int(np.flatnonzero(~np.isfinite(raw) | (raw != np.round(raw)))[0])
        raise TraceError(f"{path}: row {row + 1}: second {float(raw[row])!r} is not a whole second")
    _check_counts(path, values, "requests")
    seconds = raw.astype(np.int64)
    if (np.diff(seconds) < 0).any():  # rows out of order: their seconds say where they go
        order = np.argsort(seconds, kind="stable")
        seconds, values = seconds[order], values[order]
    repeated = np.flatnonzero(np.diff(seconds) == 0)
    if repeated.size:
        raise TraceError(
            f"{path}: second {int(seconds[repeated[0]])} appears in more than one row "
            "(a per-second trace has one row per second)"
        )
    first = int(seconds[0])
    if first >= EPOCH_SECONDS_FROM:
        if first >= EPOCH_SECONDS_UNTIL:
            raise TraceError(
                f"{path}: second {first} is after the year 5000; give seconds, not milliseconds"
            )
        start = np.datetime64(first, "s")
    else:
        start = origin.astype("datetime64[s]") + np.timedelta64(first, "s")
    span = int(seconds[-1]) - first + 1
    if span > MAX_SPAN_SECONDS:
        raise TraceError(
            f"{path}: its seconds span {span / 86_400:,.0f} days (from {first} to "
            f"{int(seconds[-1])}); at most {MAX_SPAN_SECONDS // 86_400} days"
        )
    offsets = seconds - first
    counts = np.zeros(span)
    counts[offsets] = values
    absent = np.ones(span, dtype=bool)
    absent[offsets] = False
    return PerSecondTrace(counts, zero_gap_mask(counts, gap_seconds) | absent, start)


def load_per_second(
    path: Path, origin: np.datetime64 = TWITTER_START, gap_seconds: int = GAP_SECONDS
) -> History:
    """A `second,requests` CSV (optionally gzip) -> per-minute max 5 s rates,
    minute 0 starting at the first row's second."""
    trace = read_per_second(path, origin, gap_seconds)
    return minute_max_rates(trace.counts, trace.start, trace.missing)


def trace_format(path: Path) -> str:
    """``per-second`` or ``nab``, from the CSV header."""
    if not path.is_file():
        raise TraceError(f"trace file not found: {path}")
    try:
        with _open(path) as fh:
            header = fh.readline().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: {exc}") from exc
    if not header:
        raise TraceError(f"{path}: empty file (want a second,requests or timestamp,value header)")
    if header == "second,requests":
        return "per-second"
    if header == "timestamp,value":
        return "nab"
    raise TraceError(f"{path}: unknown header {header!r} (want second,requests or timestamp,value)")


def load_nab(path: Path) -> History:
    """A NAB `timestamp,value` CSV of 5-minute counts -> per-minute rates (req/s).

    A 5-minute count hides its peaks, so each of its minutes gets the bucket's
    mean rate (value / 300): the best this resolution allows. Zero buckets
    are gaps (a zero run of 300 s > 60 s). Minutes are counted from the first
    row's minute (seconds are dropped); rows may come in any order, but two
    must not fall within the same 5 minutes.
    """
    try:
        with _open(path) as fh:
            header = fh.readline().strip()
            rows = [line.strip().split(",") for line in fh if line.strip()]
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise TraceError(f"{path}: {exc}") from exc
    if header != "timestamp,value":
        raise TraceError(f"{path}: expected a NAB 'timestamp,value' CSV")
    if not rows:
        raise TraceError(f"{path}: no rows after the header")
    try:
        stamps = np.array([r[0].replace(" ", "T") for r in rows], dtype="datetime64[m]")
        values = np.array([float(r[1]) for r in rows])
    except (ValueError, IndexError) as exc:
        raise TraceError(f"{path}: {exc}") from exc
    _check_counts(path, values, "value")
    if (np.diff(stamps) < np.timedelta64(0, "m")).any():  # out of order: sort by time
        order = np.argsort(stamps, kind="stable")
        stamps, values = stamps[order], values[order]
    offsets = (stamps - stamps[0]).astype(np.int64)
    close = np.flatnonzero(np.diff(offsets) < NAB_BUCKET_MINUTES)
    if close.size:
        a, b = stamps[close[0]], stamps[close[0] + 1]
        raise TraceError(
            f"{path}: rows at {a} and {b} are {int(offsets[close[0] + 1] - offsets[close[0]])} "
            f"min apart; NAB rows are {NAB_BUCKET_MINUTES}-minute buckets, one per time"
        )
    out = np.full(int(offsets[-1]) + 5, np.nan)
    rate = np.where(values > 0, values / 300.0, np.nan)
    for k in range(5):
        out[offsets + k] = rate
    return History(out, stamps[0])


def load_trace(trace: str | Path, gap_seconds: int = GAP_SECONDS) -> History:
    """A shipped trace's name or any supported trace file, recognised by its CSV header."""
    path = resolve_trace(trace)
    if trace_format(path) == "per-second":
        return load_per_second(path, gap_seconds=gap_seconds)
    return load_nab(path)


def _open(path: Path) -> IO[str]:
    return gzip.open(path, "rt") if path.suffix == ".gz" else path.open()


def _read_csv(path: Path, dtype: type) -> FloatArray:
    try:
        with _open(path) as fh, warnings.catch_warnings():
            warnings.filterwarnings("ignore", "loadtxt: input contained no data", UserWarning)
            table: FloatArray = np.loadtxt(fh, delimiter=",", skiprows=1, dtype=dtype, ndmin=2)
    except (OSError, ValueError, EOFError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: {exc}") from exc
    if table.size == 0:
        raise TraceError(f"{path}: no rows after the header")
    if table.shape[1] != 2:
        raise TraceError(f"{path}: expected two columns")
    return np.asarray(table, dtype=np.float64)


def _check_counts(path: Path, values: FloatArray, column: str) -> None:
    """Rows count from 1 after the header, in file order."""
    bad = np.flatnonzero(~np.isfinite(values) | (values < 0))
    if bad.size:
        row = int(bad[0])
        raise TraceError(
            f"{path}: row {row + 1}: {column} {float(values[row])!r} is not a count "
            "(want a number >= 0)"
        )
