"""`mark simulate`: compare policies on a trace, request by request, with the real decision code."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Literal

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from bouncer.miss_budget import DEFAULT_PERIOD_S as DEFAULT_SLO_PERIOD_S
from bouncer.miss_budget import DEFAULT_SHARE as DEFAULT_DECLINE_SHARE
from mark.catalog import load_hosting_prices
from mark.catalog.hosting import family_of
from mark.cli.context import console, err_console, run_async, state
from mark.cli.simulate_output import (
    baseline_notes,
    bound_notes,
    distinct_bounds,
    results_csv,
    results_table,
    unanswered_note,
)
from mark.errors import ConfigError, UnknownOffering
from mark.sim.compare import bound_code, compare, train_forecaster
from mark.sim.models import GFLOPS, PAPER_MODELS, SimModel, paper_model, with_variants
from mark.sim.oracle_forecast import ORACLE, OracleForecast
from mark.sim.policies import POLICIES, Policy, parse_policies
from mark.sim.run import SimConfig
from mark.sim.workloads import Workload, mmpp_workload, surge_workload, trace_workload
from mark.sim.world import DEFAULT_WARMUP_S
from predictor.base import Forecaster
from provisioner.target_tracking import DEFAULT_METRIC_DELAY_S

DEFAULT_START_DAY = {"twitter": 10.0, "nab": 30.0}


def parse_interruptions(specs: list[str]) -> tuple[tuple[float, float], ...]:
    """``SECONDS:FRACTION`` items: at that many seconds into the window, that share of
    the running spot fleet gets a 2-minute interruption notice."""
    out = []
    for spec in specs:
        try:
            at, frac = (float(x) for x in spec.split(":"))
        except ValueError:
            raise ConfigError(
                f"--interrupt {spec!r}: expected SECONDS:FRACTION, e.g. 1800:0.4"
            ) from None
        if at < 0 or not 0 < frac <= 1:
            raise ConfigError(f"--interrupt {spec!r}: need SECONDS >= 0 and 0 < FRACTION <= 1")
        out.append((at, frac))
    return tuple(out)


ADVISOR = "advisor"


def parse_interrupt_rate(text: str) -> float | None:
    """``--interrupt-rate``: a rate per spot instance-hour, or None for each type's Spot
    Instance Advisor rate (``advisor``)."""
    if text.strip().lower() == ADVISOR:
        return None
    try:
        rate = float(text)
    except ValueError:
        rate = -1.0
    if not rate >= 0:
        raise ConfigError(
            f"--interrupt-rate {text!r}: give interruptions per spot instance-hour (>= 0, "
            f"e.g. 0.02) or {ADVISOR!r}"
        )
    return rate


def parse_pooled(text: str) -> bool | Literal["auto"]:
    """``--pooled-capacity``: auto, true or false."""
    value = {"auto": "auto", "true": True, "false": False}.get(text.strip().lower())
    if value is None:
        raise ConfigError(f"--pooled-capacity {text!r}: use auto, true or false")
    return value  # type: ignore[return-value]


def build_workload(
    trace: str,
    *,
    hours: float,
    start_day: float | None,
    rate_scale: float,
    time_scale: float,
    mean_rps: float | None,
    surge: float,
    base_rps: float,
    seed: int,
) -> Workload:
    if hours <= 0:
        raise ConfigError("--hours must be > 0")
    if trace == "mmpp":
        return mmpp_workload(hours=hours, rate_scale=rate_scale, seed=seed)
    if trace == "surge":
        return surge_workload(base_rps=base_rps * rate_scale, surge=surge, hours=hours)
    day = start_day if start_day is not None else DEFAULT_START_DAY.get(trace, 1.0)
    return trace_workload(
        trace,
        hours=hours,
        start_day=day,
        rate_scale=rate_scale,
        time_scale=time_scale,
        mean_rps=mean_rps,
    )


def _check_sagemaker_type(
    itype: str, model: str, profiled: list[str], chosen: list[Policy]
) -> None:
    """--sagemaker-type must be profiled for the model and, for a policy that runs on
    SageMaker, have an ml.* hosting price."""
    if itype not in profiled:
        why = load_hosting_prices().retiring.get(family_of(itype))
        raise ConfigError(
            f"--sagemaker-type {itype!r}: {why}; every policy runs on current types, "
            f"{model} on {', '.join(profiled)}"
            if why
            else f"--sagemaker-type {itype!r}: {model} was profiled on {', '.join(profiled)}"
        )
    if any(p.hosting == "sagemaker" for p in chosen):
        hosting = load_hosting_prices()
        try:
            hosting.price(itype)
        except UnknownOffering as exc:
            usable = [t for t in profiled if t in hosting.prices]
            raise ConfigError(
                f"--sagemaker-type {itype}: {exc}; the sagemaker policy can run {model} on "
                f"{', '.join(usable) or 'none of its profiled types'} (ec2-target-tracking "
                "runs on any EC2 type)"
            ) from None


def simulate(
    ctx: typer.Context,
    trace: str = typer.Option(
        "twitter",
        "--trace",
        "-t",
        help="twitter | nab (the shipped traces), mmpp (bursty generator), surge (the paper's "
        "surge microbenchmark), or a CSV path ('second,requests' or NAB 'timestamp,value')",
    ),
    hours: float = typer.Option(24.0, help="simulated hours (after the warm-up)"),
    start_day: float | None = typer.Option(
        None, help="day of the trace the window starts (before it: history). Default 10 (twitter)"
    ),
    model: str = typer.Option(
        "inception-v3", "--model", "-m", help=f"profiled model: {', '.join(PAPER_MODELS)}"
    ),
    policies: str = typer.Option(
        "mark,mark-spot,sagemaker,ec2-target-tracking,clairvoyant",
        "--policies",
        "-p",
        help=f"comma-separated; known: {', '.join(POLICIES)}",
    ),
    predictor: str = typer.Option(
        "lstm-calendar",
        help="forecaster trained on the history before the window (cached); 'oracle' "
        "forecasts the window's true per-minute peaks: an ablation that shows what a "
        "perfect forecast would cost",
    ),
    rate_scale: float = typer.Option(1.0, help="multiply the trace's request rate"),
    time_scale: float = typer.Option(1.0, help=">1 plays the trace faster (trace s per sim s)"),
    mean_rps: float | None = typer.Option(None, help="rescale so the window's mean rate is this"),
    surge: float = typer.Option(0.5, help="--trace surge: the rise, 0.5 = +50 % within 2 min"),
    base_rps: float = typer.Option(100.0, help="--trace surge: the steady rate before the rise"),
    interrupt: list[str] = typer.Option(
        [], help="SECONDS:FRACTION into the window, that share of the spot fleet is interrupted"
    ),
    interrupt_rate: str = typer.Option(
        "advisor",
        help="spot interruptions per instance-hour, the same for every type (0: none), or "
        "'advisor': each type's Spot Instance Advisor bucket, read as its upper edge "
        "(mark/catalog/spot_advisor.py)",
    ),
    sagemaker_type: str | None = typer.Option(
        None,
        help="the target-tracking baselines' instance type, e.g. c5.xlarge (default: the "
        "cheapest per request; for sagemaker among the types SageMaker offers at ml.* prices)",
    ),
    sagemaker_metric_delay_s: float = typer.Option(
        DEFAULT_METRIC_DELAY_S,
        min=0.0,
        help="sagemaker: seconds from the end of a minute until its invocations reach the "
        "scaling alarm (metric published per minute, alarm evaluated once a minute)",
    ),
    sagemaker_boot_s: float | None = typer.Option(
        None, min=0.0, help="sagemaker: decision to InService, seconds (default: --boot-s)"
    ),
    boot_s: float = typer.Option(120.0, help="EC2 launch to serving, seconds"),
    decline_share: float | None = typer.Option(
        None,
        min=0.0,
        max=1.0,
        help="mark policies: share of the SLO's miss allowance (1 - SL_min) spent declining "
        "requests that would spill to Lambda (default: the model spec's, "
        f"{DEFAULT_DECLINE_SHARE:g}: never; 0.9 spends nine tenths of it)",
    ),
    slo_period: float | None = typer.Option(
        None,
        "--slo-period",
        min=60.0,
        help="mark policies: the period in seconds SL_min is kept over, the misses "
        "declines may spend (default: the model spec's, "
        f"{DEFAULT_SLO_PERIOD_S:g} s; 3600 keeps every hour within it)",
    ),
    early_steps: bool = typer.Option(
        True,
        help="mark policies: plan before the next minute once two 5 s windows in a row run "
        "above both the rate the last plan was made for and what the fleet carries, while "
        "spill answers within RT_max (the daemon's default, timings.early_steps)",
    ),
    cooldown_s: float | None = typer.Option(
        None,
        min=0.0,
        help="mark policies: seconds an instance the plan no longer wants idles before it "
        "is retired (the daemon's timings.cooldown_s; default: the boot time, the "
        "ski-rental rule)",
    ),
    warm_pool: bool = typer.Option(
        True,
        "--warm-pool/--no-warm-pool",
        help="mark policies: stop retired on-demand instances into a warm pool and start "
        "them (a stopped start, 20 s) before launching their type anew (the boot); each is "
        "kept while its volume costs less than the boot a start spares (the daemon's "
        "default, timings.warm_start_s; --no-warm-pool: terminated)",
    ),
    variants: str | None = typer.Option(
        None,
        help="mark policies: serve the model with these variants beside it, e.g. "
        "resnet-50,resnet-18 (Inception-v3 only; each rated at the model's T_b times its "
        "GFLOPS over the model's, with torchvision's published top-1: mark/sim/models.py)",
    ),
    accuracy_floor: float | None = typer.Option(
        None,
        min=0.0,
        max=1.0,
        help="with --variants: the accuracy mark's policies keep on average while choosing "
        "variants per batch (slo.accuracy_floor); the baselines serve the model alone",
    ),
    spill_batching: bool = typer.Option(
        True,
        "--spill-batching/--no-spill-batching",
        help="spill in batches the function finishes by their deadlines, sized from its "
        "batch curve where the model has one (mark/sim/models.py; the daemon's: the "
        "lambda-<memory>mb entry of the model's profile); --no-spill-batching: one request "
        "per invocation",
    ),
    pooled_capacity: str = typer.Option(
        "auto",
        help="mark policies: the daemon's planner.pooled_capacity, auto | true | false "
        "(false plans at stand-alone capacity, as the paper)",
    ),
    capacity_target: bool = typer.Option(
        True,
        "--capacity-target/--no-capacity-target",
        help="mark policies: the daemon's planner.spill_capacity_target (plan a step at the "
        "newsvendor quantile of its 5 s rates once spill is measured in time)",
    ),
    rise_by_misses: bool = typer.Option(
        True,
        "--rise-by-misses/--no-rise-by-misses",
        help="mark policies: the daemon's planner.rise_by_misses (where spill cannot answer "
        "in time, carry only the part of a rise the measured misses show is needed)",
    ),
    volume_gb: float = typer.Option(
        8.0,
        min=0.0,
        help="each instance's EBS root volume in GB, billed at the gp3 price while the "
        "instance is stopped (standbys); 8 is Amazon Linux 2023's, the stack's default "
        "worker AMI: set the size of a larger AMI's volume, e.g. a Deep Learning AMI's",
    ),
    warmup_s: float = typer.Option(
        DEFAULT_WARMUP_S,
        min=0.0,
        help="seconds simulated before the window and not counted, so the daemon's state "
        "(its warm pool of stopped instances, above all) has formed: 3 h by default",
    ),
    seed: int = typer.Option(0, help="seed of the arrivals and interruptions"),
    bound: bool = typer.Option(
        True,
        "--bound/--no-bound",
        help="solve the lower bound beside each policy (minutes on the queueing models); "
        "--no-bound where only the policies' costs are compared",
    ),
    bound_own_misses: bool = typer.Option(
        True,
        "--bound-own-misses/--no-bound-own-misses",
        help="also bound each policy that missed more than its SLO allows at its own misses "
        "(one more linear program each, minutes on the queueing models)",
    ),
    fmt: str = typer.Option("table", "--format", "-f", help="table | json | csv"),
    out: Path | None = typer.Option(
        None, help="directory for results.json, results.csv and the plots (PNG)"
    ),
) -> None:
    """Simulate serving a trace under several policies and compare cost and SLO attainment.

    Every policy sees the same seeded arrivals. mark's policies run the daemon's own
    controller, planner, Bouncer and SLO monitor on virtual time against a simulated
    EC2 and Lambda (EC2 billed per second with a 60 s minimum, a stopped instance's EBS
    volume per GB-second; Lambda per ms and GB).
    Latencies come from the paper's published profiles (see mark/sim/models.py).
    Beside each policy stands the lower bound on what any run of the same arrivals in
    its markets that meets the SLO costs (mark/sim/bound.py), and cost / bound.
    """
    if fmt not in ("table", "json", "csv"):
        raise ConfigError(f"--format {fmt!r}: use table, json or csv")
    chosen = parse_policies(policies, note=lambda msg: err_console.print(f"note: {msg}"))
    sim_model = paper_model(model)
    if variants is not None:
        sim_model = _with_variants(sim_model, variants)
    if (accuracy_floor is None) != (variants is None):
        raise ConfigError("--variants and --accuracy-floor go together")
    if sagemaker_type is not None:
        _check_sagemaker_type(sagemaker_type, model, sorted(sim_model.latency), chosen)
    cfg = SimConfig(
        boot_s=boot_s,
        warmup_s=warmup_s,
        seed=seed,
        sagemaker_type=sagemaker_type,
        sagemaker_metric_delay_s=sagemaker_metric_delay_s,
        sagemaker_boot_s=sagemaker_boot_s,
        interrupt_rate_per_hour=parse_interrupt_rate(interrupt_rate),
        interruptions=parse_interruptions(interrupt),
        decline_share=decline_share,
        slo_period_s=slo_period,
        early_steps=early_steps,
        cooldown_s=cooldown_s,
        volume_gb=volume_gb,
        warm_pool=warm_pool,
        spill_batching=spill_batching,
        accuracy_floor=accuracy_floor,
        pooled_capacity=parse_pooled(pooled_capacity),
        capacity_target=capacity_target,
        rise_by_misses=rise_by_misses,
    )
    workload = build_workload(
        trace,
        hours=hours,
        start_day=start_day,
        rate_scale=rate_scale,
        time_scale=time_scale,
        mean_rps=mean_rps,
        surge=surge,
        base_rps=base_rps,
        seed=seed,
    )
    if workload.start < warmup_s + 3600:
        raise ConfigError(
            f"need at least an hour of history before the warm-up ({warmup_s / 3600:g} h): "
            "use a later --start-day or a shorter --warmup-s"
        )
    needs_forecast = any(p.kind == "mark" and p.prediction for p in chosen)
    forecaster: Forecaster | None = None
    if needs_forecast and predictor == ORACLE:
        err_console.print("predictor oracle: the window's true per-minute peaks (an ablation)")
        forecaster = OracleForecast(workload)
    elif needs_forecast:
        cache = state(ctx).settings().data_dir / "sim-cache"
        err_console.print(f"training {predictor} on the history before the window…")
        t = time.perf_counter()
        from predictor.base import ForecasterError

        try:
            forecaster = train_forecaster(predictor, workload, warmup_s, cache)
        except ForecasterError as exc:
            raise ConfigError(str(exc)) from exc
        err_console.print(f"  ready in {time.perf_counter() - t:.1f} s")

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=err_console,
        disable=not sys.stderr.isatty(),
    ) as bar:
        tasks = {p.name: bar.add_task(p.name, total=1.0) for p in chosen}

        def on_progress(name: str, frac: float) -> None:
            bar.update(tasks[name], completed=frac)

        results = run_async(
            compare(
                workload,
                sim_model,
                chosen,
                cfg,
                forecaster=forecaster,
                on_progress=on_progress,
                cache_dir=state(ctx).settings().data_dir / "sim-cache",
                bound=bound,
                own_misses=bound_own_misses,
            )
        )
    title = (
        f"{model} on {workload.name}, {hours:g} h, {results[0].requests:,} requests "
        f"(RT_max {sim_model.rt_max_s * 1000:g} ms, SL_min {sim_model.sl_min:.0%})"
    )
    doc: dict[str, Any] = {
        "model": model,
        "trace": workload.name,
        "hours": hours,
        "rt_max_ms": sim_model.rt_max_s * 1000,
        "sl_min": sim_model.sl_min,
        "predictor": predictor if needs_forecast else None,
        "seed": seed,
        "results": [r.row() for r in results],
        "bounds": [
            {"policies": names, **bound.summary()} for bound, names in distinct_bounds(results)
        ],
        "bound_code": bound_code() if bound else None,
        "simulation_seconds": {r.policy: r.extra.get("wall_s") for r in results},
        "notes": list(sim_model.notes),
    }
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        full = dict(doc, results=[r.to_json() for r in results])
        (out / "results.json").write_text(json.dumps(full, indent=1) + "\n")
        (out / "results.csv").write_text(results_csv(results))
        from mark.sim.plots import cost_bars, fleet_over_time, latency_ccdf, latency_over_time

        cost_bars(results, out / "cost.png", title)
        latency_ccdf(results, out / "latency-ccdf.png", title)
        fleet_over_time(results, out / "fleet.png", title)
        latency_over_time(results, out / "latency.png", title)
        err_console.print(
            f"wrote {out}/results.json, results.csv, cost.png, latency-ccdf.png, fleet.png, "
            "latency.png"
        )
    if fmt == "json":
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    elif fmt == "csv":
        sys.stdout.write(results_csv(results))
    else:
        console.print(results_table(results, title))
        for line in baseline_notes(results):
            console.print(line)
        for line in [*bound_notes(results, sim_model.sl_min), *unanswered_note(results)]:
            console.print(line)
        for note in sim_model.notes:
            console.print(f"[dim]{note}[/]")


def _with_variants(model: SimModel, names: str) -> SimModel:
    family = [n.strip() for n in names.split(",") if n.strip()]
    if model.name not in GFLOPS:
        raise ConfigError(
            f"--variants: only {', '.join(n for n in GFLOPS if n in PAPER_MODELS)} has a "
            "family rated here"
        )
    unknown = [n for n in family if n not in GFLOPS or n == model.name]
    if unknown or not family:
        known = ", ".join(n for n in GFLOPS if n != model.name)
        raise ConfigError(f"--variants {names!r}: name some of {known}")
    return with_variants(model, family)
