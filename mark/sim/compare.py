"""Run several policies on the same arrivals and collect their results.

Every policy sees the very same request arrival times (one seeded draw) and,
where it forecasts, the same forecaster trained once on the history before
the simulated window, in numerics that do not depend on the CPU's vector width
(``mark.sim.pinned_fit``). Training is cached on disk by what it was trained on,
so a second comparison on the same trace starts at once.

Each result carries the whole-system lower bound (``mark.sim.bound``) on the
same arrivals, computed once per set of offerings the policies may buy (their
markets, and standbys where they keep them) and shared among them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from mark.catalog import Catalog, load_catalog
from mark.sim.bound import Bound, window_bound
from mark.sim.equal_slo import loosest_target
from mark.sim.models import SimModel
from mark.sim.pinned_fit import NUMERICS, fit_pinned
from mark.sim.policies import Policy
from mark.sim.results import PolicyResult
from mark.sim.run import Progress, SimConfig, Simulation
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
    """Fit ``spec`` (a predictor registry name) on the workload's history, cached by content,
    with numerics that do not depend on the CPU's vector width (``mark.sim.pinned_fit``)."""
    from predictor.base import ForecasterError
    from predictor.registry import code_digest, create, load

    history = history_of(workload, warmup_s)
    if cache_dir is None:
        with tempfile.TemporaryDirectory() as tmp:
            return fit_pinned(spec, history, Path(tmp) / "model.npz")
    params = json.dumps(create(spec).params(), sort_keys=True)  # a changed model retrains
    key = hashlib.sha256(
        NUMERICS.encode()
        + code_digest(spec).encode()
        + spec.encode()
        + params.encode()
        + history.values.tobytes()
        + str(history.start).encode()
    ).hexdigest()[:16]
    path = cache_dir / f"{spec}-{key}.npz"
    if path.exists():
        try:
            return load(path)
        except ForecasterError:
            pass  # saved by an older version of the model: fit it again, below
    return fit_pinned(spec, history, path)


BoundKey = tuple[tuple[str, ...], tuple[str, ...]]  # markets, standby types


def bound_key(policy: Policy, cfg: SimConfig) -> BoundKey:
    """What decides a policy's bound: the offerings it may buy."""
    return tuple(sorted(policy.markets)), (cfg.standby_type,) if policy.standbys else ()


BOUND_CODE = tuple(Path(__file__).parent / f for f in ("bound.py", "bound_bursts.py", "models.py"))


def bound_cache_path(cache_dir: Path, *parts: object) -> Path:
    """Where the bound of these inputs (``cached_bound``'s ``parts``), solved by the bound
    code as it is now, is kept under ``cache_dir``."""
    h = hashlib.sha256(bound_code().encode())
    for part in parts:
        h.update(part.tobytes() if isinstance(part, np.ndarray) else repr(part).encode())
    return cache_dir / "bounds" / f"{h.hexdigest()[:24]}.json"


def cached_bound(cache_dir: Path | None, solve: Callable[[], Bound], *parts: object) -> Bound:
    """``solve()``, or the bound saved for the same inputs (``parts``: the arrivals, the
    window, the offerings, the model, the budget) by the same bound code. A sweep runs
    many policies on one window in separate processes; the bound is a third of each."""
    if cache_dir is None:
        return solve()
    path = bound_cache_path(cache_dir, *parts)
    if path.exists():
        with contextlib.suppress(ValueError, TypeError, KeyError):
            raw = json.loads(path.read_text())
            raw["offerings"], raw["markets"] = tuple(raw["offerings"]), tuple(raw["markets"])
            fields: dict[str, Any] = {k: _finite(v) for k, v in raw.items()}
            return Bound(**fields)
    bound = solve()
    store_bound(path, bound)
    return bound


def store_bound(path: Path, bound: Bound) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({k: _jsonable(v) for k, v in asdict(bound).items()}))
    tmp.replace(path)


def bound_of_summary(summary: dict[str, Any]) -> Bound:
    """The ``Bound`` a result stored as ``Bound.summary()`` (its figures rounded as there;
    an infeasible one's ``None`` value as infinite)."""
    raw = {k: v for k, v in summary.items() if k not in ("policies", "set_by")}
    for k in ("value", "instance_cost"):
        raw[k] = math.inf if raw[k] is None else raw[k]
    raw["offerings"], raw["markets"] = tuple(raw["offerings"]), tuple(raw["markets"])
    return Bound(**raw)


def _jsonable(v: object) -> object:
    return repr(v) if isinstance(v, float) and not math.isfinite(v) else v


def _finite(v: object) -> object:
    return float(v) if v in ("inf", "-inf", "nan") else v


def solve_bound(
    key: BoundKey,
    *,
    workload: Workload,
    model: SimModel,
    cfg: SimConfig,
    arrivals: np.ndarray,
    catalog: Catalog,
    misses: int | None = None,
    cache_dir: Path | None = None,
) -> Bound:
    """The bound of ``workload``'s window for the offerings of ``key`` (``misses``: a run's
    own, where it missed more than the SLO allows), from ``cache_dir`` when solved before."""

    def run() -> Bound:
        return window_bound(
            model,
            catalog,
            arrivals,
            t0=workload.t0,
            seconds=workload.seconds,
            markets=key[0],
            standby_types=key[1],
            lambda_memory_mb=cfg.lambda_memory_mb,
            lambda_concurrency=cfg.lambda_concurrency,
            misses=misses,
            slot_s=cfg.bound_slot_s,
        )

    return cached_bound(cache_dir, run, *bound_parts(key, workload, model, cfg, arrivals, misses))


def bound_parts(
    key: BoundKey,
    workload: Workload,
    model: SimModel,
    cfg: SimConfig,
    arrivals: np.ndarray,
    misses: int | None = None,
) -> tuple[object, ...]:
    """What a window's bound depends on, the key ``cached_bound`` keeps it by."""
    return (
        arrivals,
        workload.t0,
        workload.seconds,
        key,
        model,
        cfg.lambda_memory_mb,
        cfg.lambda_concurrency,
        misses,
        cfg.bound_slot_s,
    )


def bound_code() -> str:
    """A digest of the code that computes the bound: results solved by other code differ."""
    h = hashlib.sha256()
    for f in BOUND_CODE:
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


def policy_bound(
    result: PolicyResult,
    policy: Policy,
    *,
    workload: Workload,
    model: SimModel,
    cfg: SimConfig,
    arrivals: np.ndarray,
    catalog: Catalog,
    cache: dict[BoundKey, Bound] | None = None,
    cache_dir: Path | None = None,
    own_misses: bool = True,
) -> PolicyResult:
    """``result`` with its bound (from ``cache`` when this set of offerings has one, or
    from ``cache_dir`` when a run before solved it) and, if it missed more than its SLO
    allows and ``own_misses``, the bound at its own misses (one more solve, the slowest:
    a sweep that reports no such figure skips it)."""
    key = bound_key(policy, cfg)

    def solve(misses: int | None = None) -> Bound:
        return solve_bound(
            key,
            workload=workload,
            model=model,
            cfg=cfg,
            arrivals=arrivals,
            catalog=catalog,
            misses=misses,
            cache_dir=cache_dir,
        )

    cache = {} if cache is None else cache
    if key not in cache:
        cache[key] = solve()
    bound = cache[key]
    own = solve(result.missed) if own_misses and result.missed > bound.miss_budget else None
    return replace(result, bound=bound, bound_own=own)


async def compare(
    workload: Workload,
    model: SimModel,
    policies: Sequence[Policy],
    cfg: SimConfig,
    *,
    forecaster: Forecaster | None,
    on_progress: OnPolicy | None = None,
    cache_dir: Path | None = None,
    bound: bool = True,
    own_misses: bool = True,
) -> list[PolicyResult]:
    """Every policy on the same arrivals, each with its bound unless not ``bound`` (where
    only the policies' costs are compared; ``cache_dir``: where solved bounds are kept
    between runs, ``cached_bound``; ``own_misses``: ``policy_bound``)."""
    begin = int(workload.start - cfg.warmup_s)
    arrivals = workload.arrivals(begin, workload.end, cfg.seed)
    out = []
    bounds: dict[BoundKey, Bound] = {}
    catalog = load_catalog()
    for p in policies:
        progress = (lambda f, name=p.name: on_progress(name, f)) if on_progress else None

        async def run_at(
            factor: float, p: Policy = p, progress: Progress | None = progress
        ) -> PolicyResult:
            at = replace(cfg, over_provision=factor)
            sim = Simulation(
                workload, model, p, at, arrivals=arrivals, forecaster=forecaster, progress=progress
            )
            return await sim.run()

        t = time.perf_counter()
        if p.equal_slo:
            result = await loosest_target(run_at, model.sl_min)
        else:
            result = await run_at(cfg.over_provision)
        result.extra["wall_s"] = round(time.perf_counter() - t, 2)  # type: ignore[index]
        if not bound:
            out.append(result)
            continue
        out.append(
            policy_bound(
                result,
                p,
                workload=workload,
                model=model,
                cfg=cfg,
                arrivals=arrivals,
                catalog=catalog,
                cache=bounds,
                cache_dir=cache_dir,
                own_misses=own_misses,
            )
        )
    return out
