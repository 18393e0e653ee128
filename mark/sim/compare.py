"""Run several policies on the same arrivals and collect their results.

Every policy sees the very same request arrival times (one seeded draw) and,
where it forecasts, the same forecaster trained once on the history before
the simulated window. Training is cached on disk by what it was trained on,
so a second comparison on the same trace starts at once.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from mark.sim.models import SimModel
from mark.sim.policies import Policy
from mark.sim.results import PolicyResult
from mark.sim.run import SimConfig, Simulation
from mark.sim.workloads import Workload
from predictor.base import Forecaster, History

OnPolicy = Callable[[str, float], None]  # policy name, fraction done


def history_of(workload: Workload, warmup_s: float) -> History:
    """Per-minute peaks of everything before the warm-up: what the predictor may learn."""
    end = int(workload.start - warmup_s)
    end -= end % 60
    values = workload.minute_max_rates(0, end)
    start = np.datetime64(int(workload.epoch // 60), "m")
    return History(values, start)


def train_forecaster(
    spec: str, workload: Workload, warmup_s: float, cache_dir: Path | None
) -> Forecaster:
    """Fit ``spec`` (a predictor registry name) on the workload's history, cached by content."""
    from predictor.registry import create, load

    history = history_of(workload, warmup_s)
    key = hashlib.sha256(
        spec.encode() + history.values.tobytes() + str(history.start).encode()
    ).hexdigest()[:16]
    path = cache_dir / f"{spec}-{key}.npz" if cache_dir is not None else None
    if path is not None and path.exists():
        return load(path)
    model = create(spec).fit(history)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        model.save(path)
    return model


async def compare(
    workload: Workload,
    model: SimModel,
    policies: Sequence[Policy],
    cfg: SimConfig,
    *,
    forecaster: Forecaster | None,
    on_progress: OnPolicy | None = None,
) -> list[PolicyResult]:
    begin = int(workload.start - cfg.warmup_s)
    arrivals = workload.arrivals(begin, workload.end, cfg.seed)
    out = []
    for p in policies:
        progress = (lambda f, name=p.name: on_progress(name, f)) if on_progress else None
        sim = Simulation(
            workload, model, p, cfg, arrivals=arrivals, forecaster=forecaster, progress=progress
        )
        t = time.perf_counter()
        result = await sim.run()
        result.extra["wall_s"] = round(time.perf_counter() - t, 2)  # type: ignore[index]
        out.append(result)
    return out
