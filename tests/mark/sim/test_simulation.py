"""Whole simulations on tiny workloads: a cost computed by hand, and the same controller
decisions whichever store holds its state."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bouncer.latency import BatchLatency
from mark.catalog import load_catalog, load_hosting_prices
from mark.sim.memstore import MemoryStore
from mark.sim.models import SimModel, paper_model
from mark.sim.policies import POLICIES
from mark.sim.results import PolicyResult
from mark.sim.run import SimConfig, Simulation
from mark.sim.workloads import Workload, surge_workload
from mark.state import open_store

EPOCH = 1_700_000_000.0
HISTORY_S = 2 * 3600


def _model() -> SimModel:
    return SimModel(
        name="tiny",
        rt_max_s=0.6,
        sl_min=0.98,
        latency={"c5.large": BatchLatency(((1, 0.2),)), "c5.xlarge": BatchLatency(((1, 0.1),))},
        lambda_t1_s=0.4,
        standby_t1_s=0.2,
    )


def _workload(rates: np.ndarray, seconds: int) -> Workload:
    per_second = np.concatenate([np.full(HISTORY_S, rates[0]), rates])
    return Workload("tiny", per_second, EPOCH, HISTORY_S, seconds)


@pytest.mark.parametrize(
    ("policy", "price"),
    [
        ("ec2-target-tracking", load_catalog().offering("c5.large", "on-demand").price_per_hour),
        ("sagemaker", load_hosting_prices().price("c5.large").price_per_hour),  # ml.c5.large
    ],
)
async def test_constant_load_on_one_instance_costs_its_price_and_answers_in_t1(
    policy: str, price: float
) -> None:
    """A request every 2 s, exactly; target tracking keeps its single c5.large (C = 1.87
    r/s within the SLO, so the 2× target is 56 a minute and the load is 30), the hour
    costs the c5.large price (EC2, or ml.* for sagemaker) and every request takes T_1 =
    200 ms."""
    seconds = 3600
    w = _workload(np.full(seconds, 0.5), seconds)
    cfg = SimConfig(warmup_s=600, sagemaker_type="c5.large")
    arrivals = np.arange(w.t0 - cfg.warmup_s, w.t0 + seconds, 2.0)
    sim = Simulation(w, _model(), POLICIES[policy], cfg, arrivals=arrivals)
    r = await sim.run()
    assert r.requests == seconds // 2
    assert r.costs["on-demand"] == pytest.approx(price * 1.0)
    assert r.costs["lambda"] == 0.0
    assert r.within_slo == 1.0
    assert (r.p50_ms, r.p99_ms) == pytest.approx((200.0, 200.0))
    assert r.instance_hours == pytest.approx({"c5.large": 1.0})


async def test_spilled_requests_are_priced_as_lambda_gb_seconds() -> None:
    """No instance can start before the load ends (boot 1 h): mark spills all 100
    requests, one invocation each, 400 ms at 3 GB. The first three are cold: the first
    environment is busy until 0 + 2.5 + 0.4 s, so the requests at 1 s and 2 s need their
    own; from 3 s on a freed one is warm. Cold starts miss RT_max: 97 % within."""
    seconds = 100
    w = _workload(np.ones(seconds), seconds)
    cfg = SimConfig(warmup_s=0, boot_s=3600)
    arrivals = w.t0 + np.arange(seconds, dtype=float)
    sim = Simulation(w, _model(), POLICIES["mark"], cfg, arrivals=arrivals)
    r = await sim.run()
    prices = load_catalog().lambda_prices
    gb_s = 0.4 * 3072 / 1024
    assert r.spilled == seconds
    assert r.costs["lambda"] == pytest.approx(
        seconds * (gb_s * prices.per_gb_second_x86 + prices.per_request)
    )
    assert r.p50_ms == pytest.approx(400.0)
    assert r.extra["lambda_cold_starts"] == 3
    assert r.within_slo == pytest.approx(0.97)


async def test_lambda_counts_leave_out_the_warm_up() -> None:
    """As in the test above, every request spills, but the first 50 of 100 arrive in the
    warm-up: its three cold starts warm the environments the window's requests reuse. The
    window reports what happened in it: 50 spilled, no cold start, and 50 requests' bill."""
    seconds, warmup = 50, 50
    w = _workload(np.ones(seconds), seconds)
    cfg = SimConfig(warmup_s=warmup, boot_s=3600)
    arrivals = w.t0 - warmup + np.arange(seconds + warmup, dtype=float)
    r = await Simulation(w, _model(), POLICIES["mark"], cfg, arrivals=arrivals).run()
    prices = load_catalog().lambda_prices
    gb_s = 0.4 * 3072 / 1024
    assert r.spilled == seconds
    assert r.extra["lambda_cold_starts"] == 0
    assert r.extra["lambda_throttled"] == 0
    assert r.costs["lambda"] == pytest.approx(
        seconds * (gb_s * prices.per_gb_second_x86 + prices.per_request)
    )
    assert r.within_slo == 1.0


@pytest.mark.parametrize(("period", "kept"), [(None, 86_400.0), (3600.0, 3600.0)])
def test_the_simulated_bouncer_keeps_the_slo_over_its_period(
    period: float | None, kept: float
) -> None:
    """The simulated Bouncer's miss budget counts the misses of the period the model's
    SLO is kept over (the spec's, a day, unless ``--slo-period`` says otherwise), as the
    daemon's does; a baseline without a Bouncer has none."""
    w = _workload(np.ones(60), 60)
    cfg = SimConfig(warmup_s=0, slo_period_s=period, decline_share=0.9)
    arrivals = w.t0 + np.arange(60, dtype=float)
    sim = Simulation(w, _model(), POLICIES["mark"], cfg, arrivals=arrivals)
    budget = sim.world.engine.budget
    assert budget is not None and budget.window_s == kept
    assert budget.share == 0.9
    # Declines are opt-in: by default (the spec's 0) mark's Bouncer never declines, but its
    # budget still counts the misses a pool sized for rises may spend (rise_allowance).
    default = Simulation(w, _model(), POLICIES["mark"], SimConfig(warmup_s=0), arrivals=arrivals)
    counting = default.world.engine.budget
    assert counting is not None and counting.share == 0.0
    counting.arrive(w.t0, 100)
    counting.miss(w.t0, 3)
    assert counting.tally(w.t0) == (100, 3)
    assert counting.declinable(w.t0) == 0
    tt = Simulation(w, _model(), POLICIES["ec2-target-tracking"], cfg, arrivals=arrivals)
    assert tt.world.engine.budget is None


def test_the_window_is_judged_on_its_own_requests_not_the_warm_ups() -> None:
    """The miss budget starts again at ``t0``: an hour of warm-up served in time would
    otherwise lend the window 2 % of its requests to decline, and a window judged on its
    own requests could fall below SL_min."""
    w = _workload(np.ones(60), 60)
    cfg = SimConfig(warmup_s=3600, decline_share=0.9)
    arrivals = w.t0 - 3600 + np.arange(3660, dtype=float)
    sim = Simulation(w, _model(), POLICIES["mark"], cfg, arrivals=arrivals)
    world = sim.world
    before = world.engine.budget
    assert before is not None
    before.arrive(w.t0 - 1.0, 3600)  # the warm-up's requests, none missed
    assert before.declinable(w.t0 - 1.0) > 50
    world.start_measuring()
    after = world.engine.budget
    assert after is not None and after is not before
    assert (after.arrived, after.missed) == (0, 0)
    assert after.declinable(w.t0) == 0
    assert after.window_s == before.window_s and after.share == before.share


def _step_load() -> Workload:
    seconds = 2400
    rates = np.full(seconds, 3.0)
    rates[600:1500] = 12.0
    return _workload(rates, seconds)


async def _decisions(store: object) -> list[tuple[float, str, str | None, str | None, int]]:
    w = _step_load()
    cfg = SimConfig(warmup_s=300)
    arrivals = w.arrivals(int(w.start - cfg.warmup_s), w.end, seed=3)
    sim = Simulation(
        w,
        _model(),
        POLICIES["no-prediction"],
        cfg,
        arrivals=arrivals,
        store=store,  # type: ignore[arg-type]
    )
    await sim.run()
    got = await sim.store.decisions(0, 1e12)
    return [(d.at, d.action, d.instance_type, d.market, d.count) for d in got]


async def test_the_controller_decides_the_same_on_a_real_store_as_in_memory(
    sqlite_url: str,
) -> None:
    """The simulator's in-memory store is a stand-in for speed only: the daemon's
    controller, given the same arrivals, takes the same decisions at the same times on
    the SQL store the daemon uses."""
    in_memory = await _decisions(MemoryStore())
    store = await open_store(sqlite_url, upgrade=True)
    try:
        on_sql = await _decisions(store)
    finally:
        await store.close()
    assert in_memory == on_sql
    actions = {a for _, a, *_ in in_memory}
    assert {"launch", "retire"} <= actions  # the step up launched, the step down retired


async def _retired_after_the_step_down(cooldown: float) -> tuple[float, list[float]]:
    w = _step_load()
    cfg = SimConfig(warmup_s=300, cooldown_s=cooldown)
    arrivals = w.arrivals(int(w.start - cfg.warmup_s), w.end, seed=3)
    sim = Simulation(w, _model(), POLICIES["no-prediction"], cfg, arrivals=arrivals)
    r = await sim.run()
    down = w.t0 + 1500  # the load falls from 12 to 3 r/s
    retired = [d.at - down for d in await sim.store.decisions(0, 1e12) if d.action == "retire"]
    return r.total_cost, [t for t in retired if t >= 0]


async def test_the_cool_down_set_for_a_simulation_is_the_one_the_controller_keeps() -> None:
    """``SimConfig.cooldown_s`` (``mark simulate --cooldown-s``) is the daemon's
    ``timings.cooldown_s``: with none, the instance the step down leaves unwanted retires
    at the next plan; with ten minutes it idles, billed, for minutes more."""
    cost_none, after_none = await _retired_after_the_step_down(0.0)
    cost_long, after_long = await _retired_after_the_step_down(600.0)
    assert after_none and min(after_none) < 180
    assert after_long and min(after_long) >= min(after_none) + 300
    assert cost_long > cost_none


async def test_a_surge_is_carried_by_lambda_and_the_slo_monitor() -> None:
    w = surge_workload(base_rps=20.0, surge=1.0, hours=0.75, surge_at_s=900, hold_s=600)
    cfg = SimConfig(warmup_s=600)
    arrivals = w.arrivals(int(w.start - cfg.warmup_s), w.end, seed=1)
    model = paper_model("inception-v3")
    r = await Simulation(w, model, POLICIES["no-prediction"], cfg, arrivals=arrivals).run()
    assert r.within_slo >= 0.98
    before = max(cap for t, _, cap, _ in r.timeline if t < w.t0 + 900)
    during = max(cap for t, _, cap, _ in r.timeline if w.t0 + 1020 <= t < w.t0 + 1500)
    assert during > before  # the fleet followed the surge up


def _mark(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mark.cli.main", *args], capture_output=True, text=True, timeout=300
    )


def test_simulate_cli_prints_json_and_writes_plots(tmp_path: Path) -> None:
    done = _mark(
        "simulate",
        "--trace",
        "surge",
        "--hours",
        "0.5",
        "--warmup-s",
        "900",
        "--base-rps",
        "10",
        "--policies",
        "sagemaker,no-prediction,optimal",
        "--format",
        "json",
        "--out",
        str(tmp_path / "out"),
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    # "optimal" is the former name of "clairvoyant": accepted, with a note.
    assert [r["policy"] for r in doc["results"]] == ["sagemaker", "no-prediction", "clairvoyant"]
    assert "'optimal' is now 'clairvoyant'" in done.stderr
    assert all(r["requests"] == doc["results"][0]["requests"] > 10_000 for r in doc["results"])
    # Each policy stands beside the lower bound of its markets, computed once per markets.
    assert all(r["cost_total"] >= r["bound"] > 0 for r in doc["results"])
    assert all(r["cost_over_bound"] >= 1.0 for r in doc["results"])
    assert sorted(tuple(b["markets"]) for b in doc["bounds"]) == [
        ("on-demand",),
        ("on-demand", "spot"),
    ]
    for name in ("results.json", "results.csv", "cost.png", "latency-ccdf.png", "fleet.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policies", "mark,bogus"], "unknown policy bogus"),
        (["--model", "resnet"], "unknown simulated model 'resnet'"),
        (["--interrupt", "soon"], "expected SECONDS:FRACTION"),
        (["--format", "xml"], "--format 'xml'"),
    ],
)
def test_simulate_cli_rejects_bad_input_in_one_line(args: list[str], message: str) -> None:
    done = _mark("simulate", "--trace", "surge", "--hours", "0.1", *args)
    assert done.returncode == 2
    err = done.stderr
    assert message in err and len(err.strip().splitlines()) == 1


def test_the_table_shows_unanswered_percentiles_as_infinite_and_says_why() -> None:
    """A run that declined or failed more than 1 % of its requests has no p99 latency: the
    table shows ∞ and a line under it says what that means; a run that answered all, none."""
    from rich.console import Console

    from mark.cli.simulate_output import results_table, unanswered_note
    from mark.sim.results import summarise

    def run(latencies: list[float]) -> PolicyResult:
        return summarise(
            policy="mark",
            model="m",
            workload="w",
            hours=1.0,
            rt_max_s=0.5,
            latencies=np.asarray(latencies),
            spilled=0,
            failed=0,
            costs={"on-demand": 1.0},
            instance_hours={},
            timeline=[],
            load=[],
            load_t0=0.0,
            extra={},
        )

    some_unanswered = run([0.1] * 97 + [np.nan] * 3)
    all_answered = run([0.1] * 100)
    console = Console(width=300, record=True)
    console.print(results_table([some_unanswered], "t"))
    assert "∞" in console.export_text()
    (note,) = unanswered_note([some_unanswered, all_answered])
    assert "no answer" in note
    assert unanswered_note([all_answered]) == []


async def test_with_variants_mark_buys_less_and_keeps_the_floor_the_baseline_serves_alone() -> None:
    """A steady 30 r/s for an hour on c5.large, whose accurate variant takes 0.2 s a
    request and the fast one 0.05 s (accuracies 0.8 and 0.7). At a floor of 0.75 mark is
    planned at the half-and-half mix, buys fewer instances, and delivers at least the
    floor; ec2-target-tracking serves the model alone and reports no accuracy."""
    from dataclasses import replace

    from mark.sim.models import SimVariant

    base = _model()
    fast = {t: c.scaled(0.25) for t, c in base.latency.items()}
    model = replace(
        base,
        variants=(SimVariant("tiny", 0.8, base.latency), SimVariant("fast", 0.7, fast)),
    )
    seconds = 3600
    w = _workload(np.full(seconds, 30.0), seconds)
    arrivals = np.arange(w.t0 - 1800, w.t0 + seconds, 1 / 30)
    got = {}
    for floor in (None, 0.75):
        cfg = SimConfig(warmup_s=1800, accuracy_floor=floor)
        got[floor] = await Simulation(w, model, POLICIES["mark"], cfg, arrivals=arrivals).run()
    alone, mixed = got[None], got[0.75]
    assert "accuracy_delivered" not in alone.extra
    assert mixed.extra["accuracy_delivered"] >= 0.75 - 1e-9
    assert mixed.within_slo >= 0.98 and alone.within_slo >= 0.98
    assert sum(mixed.instance_hours.values()) < sum(alone.instance_hours.values())
    tt = await Simulation(
        w,
        model,
        POLICIES["ec2-target-tracking"],
        SimConfig(warmup_s=1800, accuracy_floor=0.75),
        arrivals=arrivals,
    ).run()
    assert "accuracy_delivered" not in tt.extra
