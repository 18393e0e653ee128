"""How much of a model's load the planner may expect on each variant, and the batch
latency an instance has under that mix: what the fleet is sized by when the data plane
chooses variants per batch (``bouncer.variants``).

Every instance loads every variant, so a variant is not bought apart: an instance's work
per request is the mix's. The cheapest mix that keeps the expected accuracy at or above
the floor minimises the time per request, ``Σ s_v t_v`` over shares ``s`` (``Σ s_v = 1``,
``Σ s_v a_v ≥ floor``), ``t_v`` a variant's seconds per request and ``a_v`` its accuracy:
a linear programme of two constraints, so the optimum puts the load on at most two
variants, the floor binding between them (``variant_shares``). An instance's batch
latency under the mix is the shares' average of the variants' (``mixed_latency``), and
the planner rates each offering by it as it rates one variant's profile (INFaaS, Romero
et al., ATC '21, choose variant and hardware together; here the hardware is chosen for
the mix).

This sizes for the floor met on average. The data plane serves the accurate variant
whenever an instance has time for it, so at a load below the plan the delivered accuracy
sits above the floor, and the mix is the most a planned fleet relies on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bouncer.latency import BatchLatency


@dataclass(frozen=True)
class VariantCost:
    name: str
    accuracy: float
    seconds_per_request: float
    """Its time per request at the batch it serves best (T_b / b at the profile's best)."""


def variant_shares(variants: Sequence[VariantCost], floor: float) -> dict[str, float]:
    """The share of the load on each variant (those with none left out) that minimises
    the time per request while the expected accuracy stays at or above ``floor``.

    Every single variant that meets the floor, and every pair whose accuracies straddle
    it (its faster one as much as the floor allows), is a candidate: the LP's optimum is
    one of them. No variant meets the floor alone or in a pair only when the floor is
    above them all; then the most accurate takes it all."""
    if not variants:
        raise ValueError("no variants to share the load")
    best = max(variants, key=lambda v: (v.accuracy, -v.seconds_per_request))
    candidates: list[tuple[float, dict[str, float]]] = [
        (v.seconds_per_request, {v.name: 1.0}) for v in variants if v.accuracy >= floor - 1e-12
    ]
    for hi in variants:
        for lo in variants:
            if not lo.accuracy < floor < hi.accuracy:
                continue
            s_hi = (floor - lo.accuracy) / (hi.accuracy - lo.accuracy)
            t = s_hi * hi.seconds_per_request + (1.0 - s_hi) * lo.seconds_per_request
            candidates.append((t, {hi.name: s_hi, lo.name: 1.0 - s_hi}))
    if not candidates:
        return {best.name: 1.0}
    return min(candidates, key=lambda c: (c[0], -sum(s for s in c[1].values() if s > 0)))[1]


def mixed_latency(curves: Mapping[str, BatchLatency], shares: Mapping[str, float]) -> BatchLatency:
    """An instance's T_b when a share ``shares[v]`` of its batches runs on variant ``v``:
    the shares' average of the curves, at every batch size any of them was measured at."""
    sizes = sorted({b for v in shares for b, _ in curves[v].points})
    return BatchLatency.from_mapping(
        {b: sum(s * curves[v](b) for v, s in shares.items() if s > 0) for b in sizes}
    )


def seconds_per_request(curve: BatchLatency, rt_max_s: float) -> float:
    """A variant's time per request at its best measured batch that ends within RT_max
    (T_1 where none does)."""
    fits = [t / b for b, t in curve.points if t <= rt_max_s]
    return min(fits) if fits else curve(1)


def planning_curves(
    own: Mapping[str, BatchLatency],
    others: Mapping[str, Mapping[str, BatchLatency]],
    accuracy: Mapping[str, float],
    primary: str,
    floor: float,
    rt_max_s: float,
) -> dict[str, BatchLatency]:
    """Per instance type, the batch latency the planner rates it at: the model's own
    curve ``own[type]`` (its most accurate variant, ``primary``) mixed with the other
    variants' curves on that type (``others[variant][type]``, where profiled) at the
    shares the floor allows (``variant_shares``). A type no other variant was profiled
    on keeps the model's own curve."""
    out: dict[str, BatchLatency] = {}
    for itype, curve in own.items():
        curves = {primary: curve, **{v: c[itype] for v, c in others.items() if itype in c}}
        costs = [
            VariantCost(v, accuracy[v], seconds_per_request(c, rt_max_s)) for v, c in curves.items()
        ]
        out[itype] = mixed_latency(curves, variant_shares(costs, floor))
    return out
