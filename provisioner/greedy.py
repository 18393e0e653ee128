"""The paper's greedy heterogeneous planner (Algorithm 1, §4.3).

Input: the forecast maximum rate F_1..F_m per step, the running instances
(candidates with zero launch overhead, each usable once) and the offerings one
may buy (instance type × market, price P_i, capacity C_i under the SLO, launch
overhead O_i, usable any number of times). Offerings and running instances that
cannot meet the SLO alone are excluded. Then, until every step is covered:
take the earliest step τ whose forecast exceeds the planned capacity and the
longest run τ..e of uncovered steps after it, and add the candidate with the
lowest cost per request served over that run,

    (O_i + (e − τ + 1)·step·P_i) / Σ_{t=τ..e} min(C_i, unmet_t)·step.

(The paper writes (e − τ)·P_i; we count the steps inclusively, so a one-step
run still pays for one step.) Instances launched now are ready at t0 + τ
(``tau_steps``; paper: 5 min with 1-min steps), so new offerings serve only
from that step: the paper's "use the load at t0 + τ as the target". The steps
before it are covered by running instances alone (a booting one from when it
is ready), which keeps what the next τ minutes need from being retired; what
they cannot cover is reported as ``shortfall``.

Beyond the paper, ``defer_launches`` (on by default): an instance chosen to
cover a run that starts after the target step is not launched now but left to
a later re-plan, when that run comes within τ. Algorithm 1 launches it at once
and pays for every step before its run; on seeded random instances (see
``benchmarks/greedy_vs_milp.py``) that alone made greedy cost up to 1.9x the
optimum. The choice of instances is the same either way; only when they start
differs.

Also beyond the paper: keeping a running instance costs every step from
``tau_steps`` to the end of the span it is kept for, not only the span's steps,
since it bills while it idles until then (the steps before ``tau_steps`` it bills
either way: one the plan no longer wants stays through its cool-down, by default
the boot). Algorithm 1 prices it by the span alone, so
an instance idle for half an hour before a forecast peak was kept through
that half hour rather than retired and relaunched for the peak (which costs
its boot, ``launch_overhead``). On the Table 5 window (Inception-v3, Twitter
day 10, 8 h) this took mark from $17.92 to $17.22 (see the issue #17 note).

Also beyond the paper: the steps from ``tau_steps`` on are planned first, by every
candidate; what the steps before it still lack is then covered by the running
instances left, each kept for those steps alone (a bridge: ``PlanItem.bridge_until``,
not counted from ``tau_steps`` on). Algorithm 1 takes the earliest uncovered step first,
so a running instance kept for a step before ``tau_steps`` counted for the whole window:
after a surge, a forecast a few r/s above two p2.xlarge before ``tau_steps`` kept a third,
nearly idle p2.xlarge, re-planned so every minute for the rest of the run, where two c5.large
launched once would have covered the rest (Inception-v3, ``--trace surge``). Now the
c5.large are bought, the p2.xlarge bridges their boot, and once they serve it is no
longer needed and retires after its cool-down.

Every chosen or kept instance carries the ``Reason`` it won (cost per request
and the span it covered) so ``mark plan --explain`` can print it. Launch timing,
cool-down and billing minimum are not decided here: ``provisioner.guards``
wraps any planner's raw decision.

For speed the candidates are scored with numpy, and the winner is added as
many times in a row as it stays fully used over the span: its cost per request
is then unchanged while every other candidate's can only rise as the unmet
load falls, so the one-at-a-time loop would pick it again. Same plan, a
fraction of the iterations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

OptionKey = tuple[str, str]
"""(instance type, market)."""

_EPS = 1e-9


class NoFeasibleOption(Exception):
    """No offering or running instance can meet the SLO on its own."""


@dataclass(frozen=True)
class PlannerOption:
    """An offering: what one instance of it costs and serves for this model.

    ``capacity_rps`` is the rate it sustains within the SLO (C_i);
    ``launch_overhead`` is the dollars paid while it boots (O_i);
    ``latency_s`` is the latency of a request on an idle instance, used to drop
    offerings that cannot meet the SLO however little load they get;
    ``pool`` is (k, C_i per instance when k instances serve the model together)
    for the pool sizes measured (``provisioner.pooling``); empty: C_i at any size.
    """

    instance_type: str
    market: str
    price_per_hour: float
    capacity_rps: float
    launch_overhead: float = 0.0
    latency_s: float = 0.0
    pool: tuple[tuple[int, float], ...] = ()

    @property
    def key(self) -> OptionKey:
        return (self.instance_type, self.market)

    @property
    def label(self) -> str:
        return f"{self.instance_type}/{self.market}"


@dataclass(frozen=True)
class RunningInstance:
    """An instance already bought; ``ready_in_steps`` > 0 while it still boots."""

    instance_id: str
    option: PlannerOption
    ready_in_steps: int = 0


@dataclass(frozen=True)
class Reason:
    """Why a candidate won: its cost per request over the steps it covered."""

    cost_per_request: float
    span_start: int
    span_end: int
    requests_covered: float


@dataclass(frozen=True)
class PlanItem:
    """``count`` instances of ``option``, or the running ``instance_id`` kept."""

    option: PlannerOption
    count: int
    reason: Reason
    instance_id: str | None = None
    bridge_until: int | None = None
    """A running instance kept only for the steps before this one (``tau_steps``), which
    nothing launched now can serve: the plan does not count it from then on."""

    @property
    def kept(self) -> bool:
        return self.instance_id is not None

    def explain(self, deferred: bool = False) -> str:
        if self.kept and self.bridge_until is not None:
            what = f"keep {self.instance_id} until step {self.bridge_until}"
        elif self.kept:
            what = f"keep {self.instance_id}"
        elif deferred:
            what = f"later (step {self.reason.span_start}) launch {self.count}x"
        else:
            what = f"launch {self.count}x"
        r = self.reason
        return (
            f"{what} {self.option.label}: ${r.cost_per_request:.3g}/request "
            f"over steps {r.span_start}-{r.span_end} ({r.requests_covered:.0f} requests)"
        )


@dataclass(frozen=True)
class Plan:
    """The planner's raw decision, with the reasons; the guards decide timing.

    ``items`` in the order chosen (cheapest per request first), ``retire`` the
    running instances no item keeps, ``excluded`` the offerings dropped for the
    SLO.
    """

    items: tuple[PlanItem, ...]
    retire: tuple[str, ...]
    excluded: tuple[PlannerOption, ...]
    tau_steps: int
    defer_launches: bool = True
    shortfall: tuple[tuple[int, float], ...] = ()
    """(step, requests/s) the plan cannot cover: steps before tau_steps that
    the running fleet cannot carry, or any step once no offering is left.
    The reactive paths (Lambda, SLO monitor) must take it."""

    def is_deferred(self, item: PlanItem) -> bool:
        return self.defer_launches and not item.kept and item.reason.span_start > self.tau_steps

    def now(self) -> tuple[PlanItem, ...]:
        """The items to act on now: kept instances and launches due now."""
        return tuple(i for i in self.items if not self.is_deferred(i))

    def launch_items(self) -> tuple[PlanItem, ...]:
        return tuple(i for i in self.now() if not i.kept)

    def launches(self) -> dict[OptionKey, int]:
        counts: dict[OptionKey, int] = {}
        for item in self.launch_items():
            counts[item.option.key] = counts.get(item.option.key, 0) + item.count
        return counts

    def kept(self) -> tuple[str, ...]:
        return tuple(i.instance_id for i in self.items if i.instance_id is not None)

    def capacity_at(self, step: int) -> float:
        """Planned capacity at forecast step ``step`` (deferred items included)."""
        return sum(
            i.option.capacity_rps * i.count
            for i in self.items
            if (i.kept and (i.bridge_until is None or step < i.bridge_until))
            or (not i.kept and i.reason.span_start <= step)
        )

    @property
    def capacity_rps(self) -> float:
        """Capacity of the fleet acted on now."""
        return sum(i.option.capacity_rps * i.count for i in self.now())

    @property
    def cost_per_hour(self) -> float:
        """Cost of the fleet acted on now."""
        return sum(i.option.price_per_hour * i.count for i in self.now())

    def explain(self) -> list[str]:
        lines = [item.explain(self.is_deferred(item)) for item in self.items]
        lines += [f"retire {rid}: not needed to cover the forecast" for rid in self.retire]
        lines += [f"exclude {o.label}: cannot meet the SLO alone" for o in self.excluded]
        lines += [f"short at step {k}: {r:.1f} r/s uncovered" for k, r in self.shortfall]
        return lines


def meets_slo(option: PlannerOption, slo_s: float | None) -> bool:
    return option.capacity_rps > 0 and (slo_s is None or option.latency_s <= slo_s)


def plan_greedy(
    forecast: Sequence[float],
    running: Sequence[RunningInstance],
    options: Sequence[PlannerOption],
    *,
    slo_s: float | None = None,
    step_s: float = 60.0,
    tau_steps: int = 5,
    defer_launches: bool = True,
) -> Plan:
    """Algorithm 1: what to keep, launch and retire now to cover ``forecast``.

    ``forecast[k]`` is the predicted maximum rate (requests/s) of step k from
    now; steps before ``tau_steps`` can only be served by the running fleet,
    since nothing launched now would be ready for them.
    """
    target = np.asarray(forecast, dtype=float)
    if target.size <= tau_steps:
        raise ValueError(f"forecast has no steps at or after tau_steps={tau_steps}")
    usable_running = [r for r in running if meets_slo(r.option, slo_s)]
    usable_options = [o for o in options if meets_slo(o, slo_s)]
    excluded = tuple(o for o in options if not meets_slo(o, slo_s))
    if not usable_running and not usable_options:
        raise NoFeasibleOption(f"no offering meets the SLO of {slo_s} s")

    # Running instances first so that on a tie the free one wins. Capacity per
    # candidate per step: a running instance from when it is ready, a new one
    # from tau_steps (nothing launched now serves before then).
    n_run = len(usable_running)
    cands = [r.option for r in usable_running] + usable_options
    steps = np.arange(target.size)
    ready = np.array([r.ready_in_steps for r in usable_running] + [tau_steps] * len(usable_options))
    cap = np.array([o.capacity_rps for o in cands])
    cap_at = np.where(steps[None, :] >= ready[:, None], cap[:, None], 0.0)
    price_step = np.array([o.price_per_hour for o in cands]) * step_s / 3600.0
    overhead = np.array([0.0] * n_run + [o.launch_overhead for o in usable_options])
    available = np.ones(len(cands), dtype=bool)
    is_running = np.arange(len(cands)) < n_run
    unmet = target.copy()
    items: list[PlanItem] = []
    kept: set[str] = set()
    shortfall: list[tuple[int, float]] = []
    # First the steps from tau_steps on, by any candidate; then what the steps before it
    # still lack (the later ones are all covered by then), by the running instances left,
    # kept for those steps alone (a bridge).
    for first_step, bridge in ((tau_steps, False), (0, True)):
        while True:
            open_steps = np.flatnonzero(unmet[first_step:] > _EPS)
            if open_steps.size == 0:
                break
            start = first_step + int(open_steps[0])
            eligible = available & (cap_at[:, start] > 0)
            if not eligible.any():
                # Nothing can serve this step (before tau, or no offering left): report it.
                shortfall.append((start, float(unmet[start])))
                unmet[start] = 0.0
                continue
            covered_after = np.flatnonzero(unmet[start:] <= _EPS)
            end = start + (int(covered_after[0]) if covered_after.size else unmet.size - start) - 1
            span = unmet[start : end + 1]
            served = np.minimum(cap_at[:, start : end + 1], span[None, :]).sum(axis=1) * step_s
            # A running instance kept for this span bills until its end, idle until the
            # span if it starts later: from tau_steps on for the steps after it, since one
            # not kept bills through its cool-down anyway; a new one is launched when the
            # span comes within reach.
            paid_steps = np.where(is_running, end + 1 - first_step, span.size)
            with np.errstate(divide="ignore"):
                cost = (overhead + paid_steps * price_step) / served
            cost[~eligible] = math.inf
            j = int(np.argmin(cost))
            reason = Reason(
                cost_per_request=float(cost[j]),
                span_start=start,
                span_end=end,
                requests_covered=float(served[j]),
            )
            if j < n_run:
                available[j] = False
                inst = usable_running[j]
                kept.add(inst.instance_id)
                items.append(
                    PlanItem(
                        inst.option, 1, reason, inst.instance_id, tau_steps if bridge else None
                    )
                )
                count = 1
            else:
                count = max(1, int(float(span.min()) // cap[j]))
                items.append(PlanItem(cands[j], count, reason))
            unmet -= count * cap_at[j]

    retire = tuple(r.instance_id for r in running if r.instance_id not in kept)
    return Plan(tuple(items), retire, excluded, tau_steps, defer_launches, tuple(sorted(shortfall)))
