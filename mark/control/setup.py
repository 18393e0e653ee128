"""What the control loop is built from, read alike by the daemon, the simulator and
the report: the planner's options per model, the predictors, the model files."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from bouncer.latency import BatchLatency
from mark.catalog import Catalog, Market
from mark.config import ModelSpec, Settings
from mark.errors import UnknownOffering
from predictor.online import OnlinePredictor, RefitPolicy
from provisioner.batching import PROFILE_BATCHES, tune_batching
from provisioner.greedy import PlannerOption
from provisioner.options import planner_option
from provisioner.perf_model import InstancePerf
from provisioner.pool_batching import pool_batching

log = logging.getLogger("mark.control")


def build_options(
    spec: ModelSpec,
    catalog: Catalog,
    types: Sequence[str],
    markets: Sequence[Market],
    latency_by_type: Mapping[str, BatchLatency],
    boot_s: float,
) -> list[PlannerOption]:
    """Planner options for one model: batching tuned per type, capacity under the SLO."""
    rt_max_s = spec.slo.rt_max_ms / 1000.0
    options = []
    for itype in types:
        latency = latency_by_type.get(itype)
        if latency is None:
            continue
        try:
            cfg = tune_batching({b: latency(b) for b in PROFILE_BATCHES}, rt_max_s)
        except ValueError as exc:  # even one request at a time misses RT_max
            log.info("%s cannot serve %s within the SLO: %s", itype, spec.name, exc)
            continue
        perf = InstancePerf(latency(cfg.n_batch), cfg.n_batch, cfg.w_batch_s)
        pool = tuple(
            (p.size, p.capacity_rps) for p in pool_batching(latency, rt_max_s, spec.slo.sl_min)
        )
        for market in markets:
            try:
                price = catalog.offering(itype, market).price_per_hour
            except UnknownOffering:
                continue
            options.append(
                planner_option(
                    itype,
                    market.value,
                    price,
                    perf,
                    rt_max_s=rt_max_s,
                    sl_min=spec.slo.sl_min,
                    boot_s=boot_s,
                    pool=pool,
                )
            )
    return options


def online_predictor(settings: Settings) -> OnlinePredictor:
    """The configured model behind the refit schedule; a saved model serves from the start.

    A naive model (last, seasonal, paper) learns nothing, so it serves from the
    first observed minute; a learned one waits for ``min_history_minutes`` of them.
    """
    from predictor.registry import NAIVE, create, load

    spec = settings.predictor
    online = OnlinePredictor(
        lambda: create(spec.model),
        RefitPolicy(
            every_minutes=spec.refit_every_minutes,
            min_history=1 if spec.model in NAIVE else spec.min_history_minutes,
            at_minute_of_day=spec.refit_at_minute_of_day,
        ),
    )
    if spec.model_file is not None:
        online.model = load(spec.model_file)
        online.last_fit = 0  # trained offline: the next refit waits for the schedule
    return online


def resolve_source(spec: ModelSpec, data_dir: Path) -> str:
    """The model file every process loads; the demo model is built here, once, if missing."""
    from mark.demo import DEMO_SOURCE, ensure_demo_model

    if spec.source == DEMO_SOURCE:
        return str(ensure_demo_model(data_dir))
    return spec.source


def measure_latency(source: str, spec: ModelSpec) -> BatchLatency:
    """T_b of this model on this machine (real inference, warm-up, median of runs)."""
    from bouncer.runner import ModelRunner  # torch: only when a profile is measured

    runner = ModelRunner(spec.contract(source))
    return runner.profile(PROFILE_BATCHES)
