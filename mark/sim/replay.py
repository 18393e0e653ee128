"""Replay recorded arrivals through the simulator's engine on a fixed fleet.

The parity check between the simulator and the daemon: the same arrival
times, the same instances (each with the T_b curve, N_batch and W_batch the
daemon's dispatcher serves it with) and a Lambda with the latency measured on
the real spill function go through ``mark.sim.engine.Engine``, the data plane
the experiments run. What comes out is summarised the way a load run's
outcomes are (``Shares``), so the two can be compared figure by figure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from bouncer.latency import BatchLatency
from bouncer.miss_budget import MissBudget
from mark.catalog import LambdaPrices
from mark.sim.engine import DECLINED, INSTANCE, LAMBDA, Engine, Server
from mark.sim.serverless import SimLambda


@dataclass(frozen=True)
class ReplayServer:
    """One instance of the fixed fleet, as the dispatcher serves it."""

    instance_id: str
    instance_type: str
    latency: BatchLatency
    n_batch: int
    w_batch_s: float


@dataclass(frozen=True)
class Shares:
    """What share of the requests went where, and how fast they were answered."""

    requests: int
    on_instances: float
    spilled: float
    failed: float
    declined: float
    """Declined by the SLO's miss budget (``bouncer.miss_budget``); not in ``failed``."""
    within_rt_max: float
    p50_s: float
    p99_s: float

    @classmethod
    def of(cls, latency_s: Sequence[float], where: Sequence[str], rt_max_s: float) -> Shares:
        """From each request's latency (inf when it failed) and where it was served:
        "instance", "lambda", "declined" or "failed"."""
        n = len(latency_s)
        if n == 0 or n != len(where):
            raise ValueError("need one latency and one place per request, and at least one")
        lat = np.asarray(latency_s, dtype=np.float64)
        ok = lat[np.isfinite(lat)]
        return cls(
            requests=n,
            on_instances=sum(w == "instance" for w in where) / n,
            spilled=sum(w == "lambda" for w in where) / n,
            failed=sum(w == "failed" for w in where) / n,
            declined=sum(w == "declined" for w in where) / n,
            within_rt_max=float(np.count_nonzero(lat <= rt_max_s)) / n,
            p50_s=float(np.percentile(ok, 50)) if ok.size else math.inf,
            p99_s=float(np.percentile(ok, 99)) if ok.size else math.inf,
        )


def replay(
    arrivals_s: NDArray[np.float64],
    rt_max_s: float,
    servers: Sequence[ReplayServer],
    *,
    lambda_latency_s: float,
    lambda_concurrency: int,
    lambda_prices: LambdaPrices,
    lambda_memory_mb: int = 2048,
    lambda_queue_timeout_s: float = 0.0,
    budget: MissBudget | None = None,
) -> Shares:
    """Serve ``arrivals_s`` (sorted, seconds) on ``servers`` with the engine; Lambda
    environments are warm (as the local world warms its runtimes at start). ``budget``:
    the daemon's miss budget for the model (None: it never declines)."""
    arr = np.asarray(arrivals_s, dtype=np.float64)
    if arr.size and np.any(np.diff(arr) < 0):
        raise ValueError("arrivals must be sorted")
    lam = SimLambda(
        lambda_prices,
        memory_mb=lambda_memory_mb,
        cold_start_s=0.0,
        concurrency=lambda_concurrency,
        queue_timeout_s=lambda_queue_timeout_s,
    )
    engine = Engine(arr, rt_max_s, lam, lambda n: lambda_latency_s * n, budget=budget)
    engine.set_servers(
        Server(
            s.instance_id, s.instance_type, "on-demand", "plan", s.latency, s.n_batch, s.w_batch_s
        )
        for s in servers
    )
    engine.serve_until(float(arr[-1]) + 1.0 if arr.size else 0.0)
    names = {INSTANCE: "instance", LAMBDA: "lambda", DECLINED: "declined"}
    where = [names.get(int(w), "failed") for w in engine.where]
    return Shares.of(engine.lat.tolist(), where, rt_max_s)
