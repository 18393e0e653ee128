"""``experiments/windows/rebound.py``: a result's bound re-solved on the arrivals it ran on."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from mark.catalog import load_catalog
from mark.sim import compare
from mark.sim.bound import window_bound
from mark.sim.models import paper_model
from mark.sim.policies import POLICIES
from mark.sim.run import SimConfig
from mark.sim.workloads import trace_workload
from mark.sim.world import DEFAULT_WARMUP_S

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments" / "windows"))
from rebound import prime, rebound  # type: ignore[import-not-found]

HOURS = 0.05  # three minutes of NASNet at Table 5's load


def _result(tmp_path: Path, within: float) -> Path:
    path = tmp_path / "baselines" / "nasnet" / "d10h08s1.json"
    path.parent.mkdir(parents=True)
    row = {"policy": "sagemaker", "cost_total": 1.5, "within_slo": within, "requests": 1300}
    stale = {"bound": 99.0, "cost_over_bound": 0.015, "bound_own_misses": 98.0}
    doc = {
        "model": "nasnet",
        "results": [dict(row, **stale)],
        "bounds": [],
        "window": {"day": 10, "hour": 8, "seed": 1, "hours": HOURS},
    }
    path.write_text(json.dumps(doc))
    return path


def test_the_bound_is_solved_again_on_the_runs_own_arrivals(tmp_path: Path) -> None:
    path = _result(tmp_path, within=0.995)
    assert rebound(path, "new-code", tmp_path / "cache")
    doc = json.loads(path.read_text())
    w = trace_workload("twitter", hours=HOURS, start_day=10 + 8 / 24, rate_scale=0.1)
    arrivals = w.arrivals(int(w.start - DEFAULT_WARMUP_S), w.end, 1)
    want = window_bound(
        paper_model("nasnet"),
        load_catalog(),
        arrivals,
        t0=w.t0,
        seconds=w.seconds,
        markets=["on-demand"],
    )
    row = doc["results"][0]
    assert row["bound"] == pytest.approx(want.value, abs=1e-4)
    assert row["cost_over_bound"] == pytest.approx(1.5 / want.value, rel=1e-3)
    assert "bound_own_misses" not in row  # within the SLO: no bound at its own misses
    assert doc["bounds"][0]["policies"] == ["sagemaker"]
    assert doc["bound_code"] == "new-code"
    assert not rebound(path, "new-code", tmp_path / "cache")  # current: nothing to do


def test_a_run_below_the_slo_is_also_bounded_at_its_own_misses(tmp_path: Path) -> None:
    path = _result(tmp_path, within=0.9)
    rebound(path, "c", tmp_path / "cache")
    assert "bound_own_misses" not in json.loads(path.read_text())["results"][0]  # not stale
    path.write_text(path.read_text().replace('"bound_code": "c"', '"bound_code": "old"'))
    rebound(path, "c", tmp_path / "cache", own_misses=True)
    row = json.loads(path.read_text())["results"][0]
    assert row["bound_own_misses"] < row["bound"]  # 10 % missed: a cheaper world
    assert row["cost_over_bound_own_misses"] == pytest.approx(
        1.5 / row["bound_own_misses"], rel=1e-3
    )


def test_priming_puts_a_results_stored_bound_where_a_run_on_its_window_finds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh machine's cache is empty; ``--prime`` fills it from the results, and a run
    made again on the window then solves nothing: it finds the stored bound under the
    very key it asks for."""
    path = _result(tmp_path, within=0.995)
    code = compare.bound_code()
    rebound(path, code, tmp_path / "solved")  # the bound as a sweep stores it
    fresh = tmp_path / "fresh"
    assert prime(path, code, fresh) == 1
    assert prime(path, code, fresh) == 0  # already there
    assert {p.name for p in (fresh / "bounds").glob("*.json")} == {
        p.name for p in (tmp_path / "solved" / "bounds").glob("*.json")
    }

    def no_solve(*args: object, **kwargs: object) -> None:
        raise AssertionError("solved again: the primed bound was not found")

    monkeypatch.setattr(compare, "window_bound", no_solve)
    w = trace_workload("twitter", hours=HOURS, start_day=10 + 8 / 24, rate_scale=0.1)
    cfg = SimConfig(seed=1)
    arrivals = w.arrivals(int(w.start - cfg.warmup_s), w.end, 1)
    found = compare.solve_bound(
        compare.bound_key(POLICIES["sagemaker"], cfg),
        workload=w,
        model=paper_model("nasnet"),
        cfg=cfg,
        arrivals=arrivals,
        catalog=load_catalog(),
        cache_dir=fresh,
    )
    stored = json.loads(path.read_text())["bounds"][0]
    assert found.value == stored["value"] and found.instance_hours == stored["instance_hours"]
    assert found.floor_binds == (stored["set_by"] == "presence_floor")


def test_a_result_of_other_bound_code_primes_nothing(tmp_path: Path) -> None:
    path = _result(tmp_path, within=0.995)
    rebound(path, "old-code", tmp_path / "solved")
    assert prime(path, compare.bound_code(), tmp_path / "fresh") == 0
    assert not (tmp_path / "fresh").exists()


def test_a_run_that_solved_no_bound_by_choice_is_left_without(tmp_path: Path) -> None:
    path = _result(tmp_path, within=0.995)
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "bound_code": None}))  # mark simulate --no-bound
    assert not rebound(path, "new-code", tmp_path / "cache")
    assert json.loads(path.read_text())["bound_code"] is None
