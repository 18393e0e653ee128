"""The traces `mark simulate` names come from the installed package, not from beside the
checkout; a trace file at any offset simulates as the same trace from second 0."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pytest

import predictor
from mark.cli.main import main
from mark.cli.simulate_cmd import DEFAULT_START_DAY, build_workload
from mark.errors import ConfigError
from mark.sim.workloads import trace_path, trace_workload
from predictor.traces import SHIPPED_TRACES, load_trace, shipped_trace

PACKAGE = Path(predictor.__file__).resolve().parent
TRACES = PACKAGE / "data" / "traces"
PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"
EPOCH = 1_700_000_000
DAY = 86_400


@pytest.mark.parametrize("name", sorted(SHIPPED_TRACES))
def test_a_shipped_trace_is_read_from_inside_the_package(name: str) -> None:
    path = trace_path(name).resolve()
    assert path == shipped_trace(name).resolve()
    assert path.is_relative_to(TRACES) and path.is_file()
    assert "shared" not in path.relative_to(PACKAGE).parts
    assert path.suffix == ".gz"  # shipped compressed


def test_the_shipped_traces_come_with_their_provenance_and_licences() -> None:
    readme = (TRACES / "README.md").read_text()
    for file in SHIPPED_TRACES.values():
        assert f"`{file}`" in readme
    assert (
        "MIT" in readme
        and "Copyright 2014-2024 Numenta Inc." in (TRACES / "LICENSE-NAB.txt").read_text()
    )


def test_the_wheel_carries_every_file_of_the_traces_directory() -> None:
    """Every file there matches one of predictor's package-data patterns in pyproject.toml."""
    config = tomllib.loads(PYPROJECT.read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["predictor"]
    files = [PurePosixPath(p.relative_to(PACKAGE)) for p in TRACES.iterdir() if p.is_file()]
    assert len(files) >= 4
    for rel in files:  # a pattern's * does not cross a /: match part for part
        shipped = [pat for pat in patterns if len(PurePosixPath(pat).parts) == len(rel.parts)]
        assert any(rel.match(pat) for pat in shipped), rel


def test_the_default_simulation_inputs_load() -> None:
    """`mark simulate`'s defaults (twitter from day 10) and nab's default day."""
    for name in ("twitter", "nab"):
        w = build_workload(
            name,
            hours=24.0,
            start_day=None,
            rate_scale=1.0,
            time_scale=1.0,
            mean_rps=None,
            surge=0.5,
            base_rps=100.0,
            seed=0,
        )
        assert w.name == name and w.start == int(DEFAULT_START_DAY[name] * DAY)
        assert np.isfinite(w.per_second).all() and w.per_second[w.start : w.end].mean() > 0
    assert load_trace("twitter").start == np.datetime64("2021-08-01T00:00", "m")


def _write(path: Path, counts: np.ndarray, offset: int) -> Path:
    rows = "".join(f"{s + offset},{int(n)}\n" for s, n in enumerate(counts))
    path.write_text("second,requests\n" + rows)
    return path


@pytest.fixture(scope="module")
def counts() -> np.ndarray:
    """A day and a half of load with a daily wave and one archive gap."""
    rng = np.random.default_rng(1)
    t = np.arange(DAY + DAY // 2)
    c = rng.poisson(12 + 8 * np.sin(2 * np.pi * t / DAY)).astype(np.float64)
    c[40_000:40_500] = 0
    return c


@pytest.mark.parametrize("offset", [7 * DAY, EPOCH])
def test_an_offset_trace_file_is_the_same_workload(
    tmp_path: Path, counts: np.ndarray, offset: int
) -> None:
    zero = trace_workload(str(_write(tmp_path / "z.csv", counts, 0)), hours=1, start_day=1)
    shifted = trace_workload(str(_write(tmp_path / "s.csv", counts, offset)), hours=1, start_day=1)
    np.testing.assert_array_equal(shifted.per_second, zero.per_second)
    assert shifted.start == zero.start and shifted.seconds == zero.seconds
    base = float(np.datetime64("2021-08-01T00:00", "s").astype(np.int64))
    assert shifted.epoch == (float(offset) if offset >= 1e9 else base + offset)
    assert zero.epoch == base


def _simulate(trace: Path, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    """Each policy's results, less its workload's name and wall-clock timings."""
    args = ["simulate", "--trace", str(trace), "--start-day", "1", "--hours", "0.25"]
    args += ["--warmup-s", "900"]
    args += ["--policies", "mark", "--predictor", "last", "--format", "json"]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    out = capsys.readouterr()
    assert exit_info.value.code in (0, None), out.err
    results: list[dict[str, Any]] = json.loads(out.out)["results"]
    return [{k: v for k, v in r.items() if k not in ("workload", "wall_s")} for r in results]


def test_simulate_gives_the_same_numbers_for_a_trace_at_epoch_seconds(
    tmp_path: Path,
    counts: np.ndarray,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same requests, and the same numbers within what float rounding moves.

    An arrival time at epoch seconds carries about 2.4e-7 s of rounding (at 0, about
    1e-15), so a request that close to a 5 s window's edge counts in its neighbour: the
    forecast moves by a fraction of a request per second, and a near tie in the planner
    may fall the other way once (here: one c5.large launched a minute later). An offset
    mishandled would move the window itself, and every figure with it.
    """
    monkeypatch.setenv("MARK_DATA_DIR", str(tmp_path / "data"))
    zero = _simulate(_write(tmp_path / "zero.csv", counts, 0), capsys)
    epoch = _simulate(_write(tmp_path / "epoch.csv", counts, EPOCH), capsys)
    assert zero[0]["policy"] == "mark" and zero[0]["requests"] > 0
    (z,), (e,) = zero, epoch
    for key in ("requests", "failed", "bound", "hours"):
        assert e[key] == z[key], key
    # A launch a minute later spills what that minute's load outran: a few tenths of a
    # percent of the requests (the near tie above), where a moved window would move all.
    assert abs(e["spilled"] - z["spilled"]) <= max(2, z["requests"] // 200)
    # That launch a minute later: a few c5.large-minutes of a quarter hour's bill.
    assert e["cost_total"] == pytest.approx(z["cost_total"], rel=0.05)
    assert e["within_slo"] == pytest.approx(z["within_slo"], abs=0.001)
    assert abs(e["declined"] - z["declined"]) <= max(2, z["declined"] // 2)


def test_simulate_says_what_is_wrong_with_a_bad_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "twice.csv"
    bad.write_text("second,requests\n0,1\n1,2\n1,3\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--trace", str(bad), "--policies", "sagemaker"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert "second 1 appears in more than one row" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(ConfigError, match="no trace"):
        trace_path(str(tmp_path / "nope.csv"))
