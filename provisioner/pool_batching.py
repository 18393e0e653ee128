"""Batching for a pool: the larger batch only a pool of instances fills in time.

``serving_batching`` tunes N_batch and W_batch for one instance alone. It keeps one
batch time in reserve for a request that arrives while the batch ahead still runs,
and it wants a batch to fill at the instance's own rate. In a pool the router opens
each batch on the instance that finishes it soonest, usually an idle one, and the
whole model's arrivals fill it. Where a profile is flat in the batch size the alone
rule leaves most of the instance unused: NASNet on a p2.xlarge takes 0.632 s for one
request or eight, so against RT_max 1.0 s it serves one at a time, 1.06 r/s per
instance in a pool of 8; with batches of up to 8 and a 0.29 s window the same pool
carries 11.9 r/s per instance (``pooled_capacity``, the perf model's simulated queue).

So for each pool size the perf model measures every candidate whose full-batch rate
``b/T_b`` beats the alone rule's: each profiled ``b`` with ``T_b < RT_max``, with a
window of ``WINDOW_SHARES`` of the ``RT_max − T_b`` a batch may wait. A pool serves
with the best at its size; one instance, and any size where no candidate carries more
(ties keep it), serves by the alone rule. A profile without such a batch (Inception-v3
and LSTM-ptb on every profiled type: their batches are as fast per request as the
alone rule's, or slower) has no candidate and plans and serves exactly as before.

The planner's pool capacities, the simulator's servers and the daemon's backends all
take their batching from here, so what is planned is what is served. Pure; cached by
the profile's batch times.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from provisioner.batching import PROFILE_BATCHES, serving_batching
from provisioner.perf_model import InstancePerf, pooled_capacity

WINDOW_SHARES = (0.5, 0.8)
"""Windows tried, as shares of ``RT_max − T_b``: at the whole of it the first request of
a batch that does not fill finishes exactly at RT_max, so any wait behind a busy
instance misses; half leaves room for one."""


@dataclass(frozen=True)
class PoolBatching:
    """How instances of one type batch in a pool of ``size``, and what each then carries."""

    size: int
    n_batch: int
    w_batch_s: float
    capacity_rps: float
    """Per instance, within the SLO (``perf_model.pooled_capacity``)."""


def candidates(
    times: dict[int, float], rt_max_s: float, alone_rate: float
) -> list[tuple[int, float]]:
    """(N_batch, W_batch) pairs whose full-batch rate beats ``alone_rate``."""
    out = []
    for b in sorted(times):
        t_b = times[b]
        if b < 2 or t_b >= rt_max_s or b / t_b <= alone_rate * (1 + 1e-9):
            continue
        out += [(b, share * (rt_max_s - t_b)) for share in WINDOW_SHARES]
    return out


@functools.lru_cache(maxsize=256)
def _table(times: tuple[float, ...], rt_max_s: float, sl_min: float) -> tuple[PoolBatching, ...]:
    curve = dict(zip(PROFILE_BATCHES, times, strict=True))
    n0, w0 = serving_batching(curve.__getitem__, rt_max_s)
    base = InstancePerf(curve[n0], n0, w0)
    best = {k: PoolBatching(k, n0, w0, c) for k, c in pooled_capacity(base, rt_max_s, sl_min)}
    for n, w in candidates(curve, rt_max_s, n0 / curve[n0]):
        for k, c in pooled_capacity(InstancePerf(curve[n], n, w), rt_max_s, sl_min):
            if c > best[k].capacity_rps * (1 + 1e-9):
                best[k] = PoolBatching(k, n, w, c)
    return tuple(best[k] for k in sorted(best))


def pool_batching(
    latency: Callable[[int], float], rt_max_s: float, sl_min: float
) -> tuple[PoolBatching, ...]:
    """The batching and per-instance capacity of each measured pool size (2 … 32)."""
    return _table(tuple(latency(b) for b in PROFILE_BATCHES), rt_max_s, sl_min)


def batching_for(
    latency: Callable[[int], float], rt_max_s: float, sl_min: float, pool_size: int
) -> tuple[int, float]:
    """N_batch and W_batch for an instance serving in a pool of ``pool_size`` of its type:
    the alone rule for one, else that of the largest measured size not above it."""
    n, w = serving_batching(latency, rt_max_s)
    if pool_size < 2:
        return n, w
    for entry in pool_batching(latency, rt_max_s, sl_min):
        if entry.size <= pool_size:
            n, w = entry.n_batch, entry.w_batch_s
    return n, w
