"""Plan with the capacity instances have *together*, not each alone.

C_i in the paper is what one instance sustains within the SLO on its own queue.
mark's dispatcher pools a model's instances: each batch goes to whichever
instance finishes it first, one FCFS queue in front of all of them, so the tail
wait of k instances is far shorter than that of one, and each carries more load
within the SLO (``perf_model.pooled_capacity``). Planning every instance at its
stand-alone capacity buys up to 2.8x too many small instances (a c5.large on
Inception-v3: 1.66 r/s alone, 4.4 r/s in a pool of 16, 4.73 r/s raw).

But the pool's size is what the plan decides. ``plan_pooled`` looks for the
largest size n such that planning at the per-instance capacity of a pool of n
buys at least n instances now: then the fleet it buys is a pool of at least n,
whose instances each carry at least that capacity (it does not fall with k),
so the plan is covered. n = 1 is the stand-alone plan, always consistent;
a bisection over 1..(its fleet size) finds the largest consistent n in
log2(fleet) greedy calls. Past that n, a plan at a pool size buys fewer instances than
the size and does not hold; topped up to the size (its forecast raised to what that many
of the offering cheapest per request there carry) it does, and where one instance alone
carries little but a pool much (``provisioner.pool_batching``) that is far cheaper, so
sizes up to ``MAX_TOP_UP`` are tried too and the cheapest plan per hour wins. Every
instance of the model counts as a peer in the pool, of whatever type: an
approximation for mixed fleets, where a large instance serves more of the pooled
queue than a small one (and where the batching a pool serves with counts only its
own type). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from provisioner.greedy import Plan, PlannerOption, RunningInstance, plan_greedy
from provisioner.spill_evidence import SpillEvidence

MAX_TOP_UP = 8
"""The largest pool a plan is topped up to (module doc): a pool that carries enough per
instance to be worth buying whole is small; a large one is reached by the bisection."""


def _table(option: PlannerOption) -> tuple[list[int], list[float]]:
    """Pool sizes and per-instance capacities, each value capped by every larger size's."""
    points = [(1, option.capacity_rps), *sorted(option.pool)]
    sizes = [k for k, _ in points]
    caps = [c for _, c in points]
    for i in range(len(caps) - 2, -1, -1):
        caps[i] = min(caps[i], caps[i + 1])
    return sizes, caps


def _interpolate(sizes: list[int], caps: list[float], n: int) -> float:
    if n <= sizes[0]:
        return caps[0]
    for i in range(1, len(sizes)):
        if n <= sizes[i]:
            k0, k1 = sizes[i - 1], sizes[i]
            return caps[i - 1] + (caps[i] - caps[i - 1]) * (n - k0) / (k1 - k0)
    return caps[-1]


def pool_with(mode: bool | Literal["auto"], spill: SpillEvidence) -> bool:
    """Whether to plan at pooled capacity: as configured, or (``auto``) while the model's
    spill is measured to answer in time (``SpillEvidence.in_time``), since a pool's
    transient overload is then Lambda charges rather than SLO misses."""
    if mode == "auto":
        return spill.in_time()
    return bool(mode)


def capacity_in_pool(option: PlannerOption, n: int) -> float:
    """C_i per instance when ``n`` instances serve together: linear between the measured
    pool sizes, the largest size's value beyond it, and never more than a larger
    measured pool gives (so sampling noise cannot make a bigger pool look worse)."""
    if n <= 1 or not option.pool:
        return option.capacity_rps
    return _interpolate(*_table(option), n)


def fleet_size(plan: Plan) -> int:
    """Instances the plan runs now (kept and launched), the pool its capacity assumes."""
    return sum(item.count for item in plan.now())


def plan_pooled(
    forecast: Sequence[float],
    running: Sequence[RunningInstance],
    options: Sequence[PlannerOption],
    *,
    slo_s: float | None = None,
    step_s: float = 60.0,
    tau_steps: int = 5,
    defer_launches: bool = True,
) -> Plan:
    """``plan_greedy`` at the largest pool size its own plan supports (module docstring)."""

    tables: dict[PlannerOption, tuple[list[int], list[float]]] = {}
    for o in (*options, *(r.option for r in running)):
        if o.pool and o not in tables:
            tables[o] = _table(o)

    def at(o: PlannerOption, n: int) -> PlannerOption:
        table = tables.get(o)
        if table is None or n <= 1:
            return o
        cap = _interpolate(*table, n)  # the constructor: ``replace`` is 10x slower here
        return PlannerOption(
            o.instance_type, o.market, o.price_per_hour, cap, o.launch_overhead, o.latency_s, o.pool
        )

    def plan_at(n: int) -> Plan:
        return plan_at_load(n, forecast)

    def plan_at_load(n: int, load: Sequence[float]) -> Plan:
        at_n = {o: at(o, n) for o in tables}
        return plan_greedy(
            load,
            [
                RunningInstance(r.instance_id, at_n.get(r.option, r.option), r.ready_in_steps)
                for r in running
            ],
            [at_n.get(o, o) for o in options],
            slo_s=slo_s,
            step_s=step_s,
            tau_steps=tau_steps,
            defer_launches=defer_launches,
        )

    # The capacities never fall with n, so neither does a plan's fleet rise with it: the
    # consistent sizes are 1..n*, and bisection finds n* in log2(fleet) greedy calls. It
    # runs to the end: where one instance alone carries little and a pool much (a profile
    # flat in the batch size, ``provisioner.pool_batching``), the stand-alone fleet is
    # hundreds and n* a few, and a bisection cut short would stop at the stand-alone plan.
    best = plan_at(1)
    lo, hi = 1, fleet_size(best)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        candidate = plan_at(mid)
        if fleet_size(candidate) >= mid:
            lo, best = mid, candidate
        else:
            hi = mid - 1
    # Beyond n*, the plan at a pool size buys fewer instances than the size, so it does not
    # hold; topped up to the size with the offering cheapest per request there, it does.
    # Where a pool carries many times what one instance does, that is far cheaper than
    # the plan at n*: two p2.xlarge batching NASNet carry 17 r/s, six alone 0.4.
    for k in sorted({size for sizes, _ in tables.values() for size in sizes if lo < size}):
        if k > MAX_TOP_UP:
            break
        at_k = [a for a in (at(o, k) for o in options if o in tables) if a.capacity_rps > 0]
        if not at_k:
            continue
        cheapest = min(at_k, key=lambda o: o.price_per_hour / o.capacity_rps)
        floor = k * cheapest.capacity_rps * (1.0 - 1e-9)
        topped = plan_at_load(k, [max(f, floor) for f in forecast])
        if fleet_size(topped) >= k and topped.cost_per_hour < best.cost_per_hour * (1 - 1e-9):
            best = topped
    return best
