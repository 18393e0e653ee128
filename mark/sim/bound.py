"""A lower bound on what any policy pays to serve a simulated window within its SLO.

The ``clairvoyant`` policies are a schedule, not a bound: they cover every
minute's peak with instances only. This module computes, on the very arrivals
the policies see, a linear program whose optimum no schedule of the simulated
world can beat, whatever it forecasts, boots, batches or spills.

The world, as the simulator prices it (``SimWorld.result``)
------------------------------------------------------------
- A policy's cost is every EC2 run clipped to the measured window
  ``[t0, t_end)``, each clipped run billed ``max(60 s, its length)`` at its
  offering's price (the catalog's on-demand or spot price; standbys at the
  on-demand price of their type), plus the Lambda charges of invocations made
  from ``t0`` on. The warm-up is not counted.
- An instance serves batches one after another (the Bouncer's ``Backlog``); a
  batch of ``n`` takes ``T_n`` from the model's profile, and ``n`` is at most
  ``max(PROFILE_BATCHES)`` (``serving_batching`` only picks from those sizes).
  A request is within the SLO when it is answered within RT_max of arriving.
- Lambda runs a chunk of ``k`` requests for ``T_λ(k)`` (``SimModel.lambda_latency``:
  ``k·T_1``, or the model's batch curve where it has one), at most ``concurrency``
  environments at once, and bills each chunk ``ceil(ms)·GB`` plus a fee per
  invocation.
- The SLO: at least SL_min of the window's requests answered within RT_max,
  i.e. at most ``(1 − SL_min)·N`` missed.

The linear program
------------------
Time from ``t0`` is cut into slots of ``δ`` seconds (``δ`` divides 60; default
5 s, the telemetry window), ``k = 60/δ``, ``h = ceil(RT_max/δ)``, and ``A_w``
requests arrive in slot ``w`` (``w < W``). ``μ_o`` is offering ``o``'s best
SLO-feasible rate ``max_n {n/T_n : T_n ≤ RT_max}``; ``κ = 1 + RT_max/60``.
Variables, all continuous and ≥ 0:

- ``n[o,u]`` mean instances of ``o`` running in slot ``u``; ``a[o,u] + b[o,u]``
  runs of ``o`` started in slot ``u`` (split: the share of each start's slot
  after it, ``a``, and before it, ``b``); ``p[o,u]`` mean instances billed in
  slot ``u``; for ``u < W + k``;
- ``x[w,j]``, ``y[w,j]`` requests of slot ``w`` answered within RT_max by
  instances, by Lambda, with the work done in slot ``w + j`` (``j ≤ h``);
  ``m[w]`` requests of slot ``w`` missed.

    minimise  Σ_o price_o·δ/(3600·κ)·Σ_u p[o,u]  +  c_λ·Σ y
    s.t.  Σ_j x[w,j] + Σ_j y[w,j] + m[w] = A_w                   every w < W
          Σ_w m[w] ≤ M = floor((1 − SL_min)·N)
          Σ_j x[v−j,j] ≤ δ·Σ_o μ_o·n[o,v]                        every slot v
          Σ_j y[v−j,j] ≤ δ·C/T_λ  (y ≡ 0 unless T_λ ≤ RT_max)     every slot v
          n[o,u] − n[o,u−1] ≤ a[o,u] + b[o,u−1]                  (runs start to grow)
          p[o,u] ≥ n[o,u]                                        (running is billed)
          p[o,u] ≥ a[o,u] + Σ_{u−k<u'<u} (a+b)[o,u'] + b[o,u−k]  (60 s minimum)

Why it is a lower bound (for any schedule meeting the SLO)
----------------------------------------------------------
Take any simulated run that meets the SLO and read the LP's variables off it.
Extend each clipped EC2 run ``[s, e)`` to ``[s, e + RT_max)``: a batch that
holds a request of the window answered in time starts at or after the
request's arrival (≥ ``t0``, ≥ ``s``) and ends within RT_max of it, so before
``e + RT_max`` (it may have been dispatched before ``e`` and run after); a
run clipped to nothing (ended by ``t0``) serves no request of the window. Let
``R_o(τ)`` count the extended runs of ``o`` at time ``τ`` and ``B_o(τ)`` the
runs whose window ``[s, s + max(60, e − s + RT_max))`` holds ``τ``. Set
``n = ∫_slot R/δ``, ``p = ∫_slot B/δ``, and for a run starting at offset ``ξ``
into its slot add ``(δ−ξ)/δ`` to ``a`` and ``ξ/δ`` to ``b``. Then:

1. *Cost.* A run billed ``max(60, L)`` has ``max(60, L + RT_max) ≤ κ·max(60, L)``,
   so the EC2 bill is ≥ ``Σ price·∫B/(3600κ)`` = the LP's first term. A Lambda
   request answered in time rides a chunk of some ``k`` with ``T_λ(k) ≤ RT_max``,
   whose share per request is ``(T_λ(k)·GB·rate + fee)/k`` (ceil only adds): at
   least ``c_λ``, the least of those over such ``k``.
2. *Capacity.* Give each in-time request of a batch of ``n`` the share
   ``|batch ∩ slot|/T_n`` of each slot its batch overlaps. A batch that answers
   any request in time has ``T_n ≤ RT_max`` so ``n/T_n ≤ μ_o``, and an instance
   runs one batch at a time inside its extended run: the shares in slot ``v``
   are ≤ ``μ_o·∫_v R_o``. A request of slot ``w`` is worked on only in
   ``[start of w, end of w + RT_max)``, i.e. slots ``w..w+h``. Lambda the same
   way: a request answered in time holds one of at most C environments, in a chunk
   of ``k`` for ``T_λ(k) ≤ RT_max`` (a cold start only adds; a queued invocation
   waits for a free one), so at most ``δ·C·μ_λ`` per slot, ``μ_λ`` the best such
   ``k/T_λ(k)``.
3. *Growth.* ``R(τ') − R(τ) ≤`` starts in ``(τ, τ']``. Averaged over ``τ`` in
   slot ``u−1`` and ``τ'`` in slot ``u``, a start at offset ``ξ`` of slot ``u``
   counts ``(δ−ξ)/δ = a`` and one at offset ``ξ`` of slot ``u−1`` counts
   ``ξ/δ = b``.
4. *Billing minimum.* ``B ≥ R``, and ``B`` ≥ the runs started in the last 60 s;
   a start at offset ``ξ`` of slot ``u'`` covers ``δ−ξ`` of ``u'``, all of
   ``u'+1 .. u'+k−1`` and ``ξ`` of ``u'+k``: exactly the ``a``/``b`` terms.
5. *SLO.* The run missed at most ``M`` requests.
6. *Batching floor* (with ``batch_floor``; it binds where load is too sparse to fill
   batches, e.g. NASNet and OpenNMT-ende at Table 5's scale). The rate ``μ_o`` assumes
   full batches, but the in-time requests of one batch arrive close together: a batch
   of ``n`` dispatched at ``τ`` (its requests have arrived) answers request ``r`` in time
   only if ``τ + T_n ≤ r + RT_max``, so its in-time requests all arrived in
   ``[τ − (RT_max − T_n), τ]``. With ``k`` in-time requests in a batch of ``n ≥ k``
   (``n ≤ n_max``, the largest with ``T_n ≤ RT_max``), ``T_n ≥ T̃_k = min_{k≤j≤n_max} T_j``,
   so those ``k`` arrived within ``g_k = RT_max − T̃_k`` of each other: ``k`` consecutive
   arrivals (in time order, warm-up neighbours too) holding ``r`` span at most ``g_k``
   (the arrivals between the first and last of a set are within its span). Let
   ``K_o(r)`` be the largest such ``k`` (the feasible ``k`` are ``1..K_o(r)``: ``g_k``
   falls as ``k`` grows, and a shorter run of consecutive arrivals holding ``r`` inside
   a feasible one spans no more). Each in-time request of that batch then holds at least
   ``θ_o(r) = min_{i≤K_o(r)} T̃_i/i ≤ T_n/k`` of instance time; over slots, its share
   ``|batch ∩ v|/T_n`` (item 2) times ``θ_o(r)`` is at most ``|batch ∩ v|/k``, and the
   batch's ``k`` requests together at most ``|batch ∩ v|``. One batch at a time per
   instance, so ``Σ_r θ_o(r)·share_v(r) ≤ ∫_v R_o``. Multiply by ``price_o`` and take
   ``π_r = min_o price_o·θ_o(r)`` over every offering (before pruning); summing over
   offerings, ``Σ_r π_r·share_v(r) ≤ δ·Σ_o price_o·n[o,v]``. The LP keeps this per request:
   the requests of slot ``w`` fall into groups of equal ``π`` (those at or below the least
   price per full-batch rate ``c*`` merged at their least ``π``: the capacity row implies
   their part), ``x`` is split by group, at most a group's count answered from it, and
   ``Σ_{g,j: w_g + j = v} π_g·x[g,j] ≤ δ·Σ_o price_o·n[o,v]`` is a row for each slot some
   group above ``c*`` can be worked in. The LP picks which requests to miss, so it misses
   the dearest: a run that missed others pays no less. It does not charge for queueing
   (a clairvoyant dispatcher could time every batch), nor for whole instances: where
   those bind, the bound stays loose.

7. *Burst rows* (``burst_rows``; their proof is ``mark.sim.bound_bursts``'s docstring).
   Requests that arrive within a short interval ``I`` of slot ``w`` are answered inside
   ``I'`` (``I`` plus RT_max), where one run of ``o`` answers at most ``cap_o(|I'|)`` of
   them, so ``N_I − m[w] − Σ_j y[w,j] ≤ Σ_o cap_o·D_o`` with ``D_o`` the runs that can meet
   ``I'``: those running in slot ``w − 1`` and those started since (each billed a minute).
   Where a batch takes most of RT_max (NASNet, OpenNMT-ende) this is what charges for
   bursts; pruning then also compares ``cap`` per dollar (``bound_bursts.dominated``).
   ``window_bound`` adds them only where Lambda cannot answer in time (elsewhere a burst's
   excess goes to Lambda at its price per request, and they added nothing).

So every SLO-meeting run is a feasible point whose LP objective is at most its
cost: the LP optimum is a lower bound. HiGHS solves it to optimality (through
``scipy.optimize.linprog``, as ``provisioner.milp`` reaches it through
``scipy.optimize.milp``; its tolerances are ~1e-7 relative), in seconds for
8 hours of 5 s slots. Instance counts are continuous: the bound is
the LP relaxation, valid because relaxing only lowers the optimum. A run that
missed more than ``M`` is bounded by the same LP with its own misses as ``M``
(``miss_budget``): that is ``bound_own`` in a comparison.

Exact reductions
----------------
An offering with a higher price and no higher rate than another is never
needed (swap each of its instances for the other's: feasible, no dearer).
In this LP more holds: every constraint is linear and homogeneous in an
offering's variables, so ``o``'s schedule scaled by ``μ_o/μ_*`` is one of the
offering ``*`` with the least price per rate, serving as much for no more. The
optimum therefore uses one offering; ``prune_dominated`` keeps only those with
the least ``price/μ`` (ties kept). With the batching floor, scale by price instead:
``o``'s schedule times ``price_o/price_*`` is one of ``*`` that costs the same, has
the same ``Σ price·n`` (the floor's right side) and serves at least as much
(``μ_*/price_* ≥ μ_o/price_o``); the growth and billing rows are homogeneous. Tests
check the value is the same unpruned.

The presence floor (where Lambda cannot answer in time)
--------------------------------------------------------
The LP lets a fraction of an instance serve a sparse load; a real instance is there
whole, billed at least 60 s, or it serves nothing. Where no request can be answered in
time but by an instance (Lambda's ``T_λ > RT_max``: NASNet, OpenNMT-ende), this gives a
second bound, and the bound reported is the larger (both hold, so the maximum does).

Take a run, clipped to the window as billed: ``[s', e')``, ``L = e' − s'``, billed
``b = max(60, L)``. A window request ``r`` it answers in time is in a batch dispatched at
``τ`` with ``r ≤ τ`` (its requests have arrived), ``s ≤ τ ≤ e`` (dispatched while it
runs) and ``τ + T_n ≤ r + RT_max``; with ``t0 ≤ r < t_end`` that puts ``r`` in
``D = [s' − RT_max, e']``, of length ``L + RT_max ≤ b·(1 + RT_max/60)`` (``b ≥ 60``,
``b ≥ L``). Let ``φ = 60/(60 + RT_max)``. The union of every run's ``D`` falls into
disjoint intervals (components) ``C``, and every request answered in time lies in one.
The runs of a component are billed ``Σ b ≥ φ·Σ|D| ≥ φ·|C|``, and at least 60 s: so
``≥ max(60, φ·span)``, ``span`` being the time from its first request answered in time
to its last. A request in no component is missed.

So any run meeting the SLO is a point of this problem: choose disjoint groups of
consecutive requests (in arrival order) at ``max(60, φ·(t_k − t_a))`` seconds for the
requests ``a..k`` (a component's first and last answered in time; components are
disjoint in time, so their requests do not interleave, and the unanswered requests
between them are only not counted as missed); every request in no group is missed, at
most ``M``. Its cost in instance-seconds times the
least hourly price of any offering that can answer in time is at most the run's EC2
bill. For any ``λ ≥ 0``, ``min over groups [seconds + λ·missed] − λ·M`` is at most that
problem's optimum (Lagrangian duality), and the minimum is an exact dynamic programme
over the requests (``_cover_seconds``). ``presence_floor`` takes the best ``λ`` it finds;
every ``λ`` gives a valid floor, so an inexact search only weakens it.

What it leaves out (each only lowers it): boot time, forecast error, the
planner's 98 %-quantile capacity, integer instances, queueing beyond the burst rows'
short intervals, cold starts, Lambda
throttling beyond the concurrency, the fleet limit, spot interruptions.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import OptimizeResult, linprog
from scipy.sparse import coo_matrix, csr_matrix, vstack

from bouncer.routing import spill_cap
from mark.billing import EC2_MINIMUM_S
from mark.catalog import Catalog, Market
from mark.errors import UnknownOffering
from mark.sim.bound_bursts import (
    BURST_LENGTHS,
    Bursts,
    burst_lengths,
    bursts,
    caps,
    dominated,
)
from mark.sim.bound_bursts import serve_times as _serve_times
from mark.sim.models import SimModel
from provisioner.batching import PROFILE_BATCHES

DEFAULT_SLOT_S = 5.0  # P_s: the windows the daemon's telemetry counts
MAX_BATCH = max(PROFILE_BATCHES)  # no instance in the simulator batches more
SLO_EPS_S = 1e-9  # the simulator's "within RT_max" tolerance


class BoundError(ValueError):
    """The bound cannot be set up (a slot that does not divide 60 s, an RT_max ≥ 60 s)."""


@dataclass(frozen=True)
class BoundOffering:
    """An instance type bought in one market, as the bound sees it."""

    instance_type: str
    market: str
    price_per_hour: float
    rate_rps: float  # best SLO-feasible batch rate, max_n n/T_n with T_n ≤ RT_max
    role: str = "serving"  # or "standby" (a burstable standby at full speed)
    latency: Callable[[int], float] | None = field(default=None, compare=False, repr=False)
    """T_n, for the batching floor (``batch_floor``); None: only ``rate_rps`` is known."""
    max_batch: int = MAX_BATCH

    @property
    def key(self) -> str:
        return f"{self.instance_type}/{self.market}" + (
            "/standby" if self.role != "serving" else ""
        )

    @property
    def price_per_request(self) -> float:
        """$ per request at full SLO-feasible rate (the ratio the LP ranks by)."""
        return self.price_per_hour / 3600.0 / self.rate_rps


@dataclass(frozen=True)
class LambdaTerms:
    latency_s: float  # T_1 of one request on Lambda, warm
    cost_per_request: float  # at least this per request (``lambda_terms``)
    concurrency: int
    env_rate_rps: float | None = None
    """The most requests per second one environment answers in time, μ_λ (None: 1/T_1)."""

    @property
    def rate_per_env(self) -> float:
        return self.env_rate_rps if self.env_rate_rps is not None else 1.0 / self.latency_s


@dataclass(frozen=True)
class Bound:
    """The bound's value and how the LP's optimum spends it.

    ``instance_hours``, ``lambda_requests`` and ``missed`` always describe the LP's
    solution; where the presence floor binds (``floor_binds``) the value is the floor's,
    which is a cost, not a schedule, and ``summary`` says which one set the value."""

    value: float
    instance_cost: float
    lambda_cost: float
    requests: int
    lambda_requests: float
    missed: float
    miss_budget: int
    instance_hours: dict[str, float]  # per offering key, billed hours the LP pays (÷ κ)
    offerings: tuple[str, ...]  # what the LP could buy after pruning
    markets: tuple[str, ...]
    slot_s: float
    solve_s: float
    status: str
    presence_floor: float = 0.0
    """The presence floor (module doc), 0 where Lambda answers in time; ``value`` is the
    larger of it and the LP's optimum, ``lp_value``."""
    lp_value: float | None = None

    @property
    def floor_binds(self) -> bool:
        """Whether the presence floor, not the LP, sets ``value``."""
        return self.presence_floor > 0.0 and self.presence_floor >= self.value

    def summary(self) -> dict[str, object]:
        """The figures, for JSON (an infeasible bound's value is None)."""
        finite = math.isfinite(self.value)
        return {
            "value": round(self.value, 4) if finite else None,
            "instance_cost": round(self.instance_cost, 4) if finite else None,
            "lambda_cost": round(self.lambda_cost, 4),
            "requests": self.requests,
            "lambda_requests": round(self.lambda_requests, 1),
            "missed": round(self.missed, 1),
            "miss_budget": self.miss_budget,
            "instance_hours": {k: round(v, 3) for k, v in sorted(self.instance_hours.items())},
            "offerings": list(self.offerings),
            "markets": list(self.markets),
            "slot_s": self.slot_s,
            "solve_s": round(self.solve_s, 2),
            "status": self.status,
            "set_by": "presence_floor" if self.floor_binds else "lp",
            "presence_floor": round(self.presence_floor, 4),
            "lp_value": None
            if self.lp_value is None or not math.isfinite(self.lp_value)
            else round(self.lp_value, 4),
        }


# -- inputs ------------------------------------------------------------------


def slo_rate(curve: Callable[[int], float], rt_max_s: float, max_batch: int = MAX_BATCH) -> float:
    """``max_n n/T_n`` over ``n ≤ max_batch`` with ``T_n ≤ RT_max``; 0 if none fits."""
    best = 0.0
    for n in range(1, max_batch + 1):
        t = curve(n)
        if t <= rt_max_s + SLO_EPS_S:
            best = max(best, n / t)
    return best


def bound_offerings(
    model: SimModel,
    catalog: Catalog,
    markets: Sequence[str],
    standby_types: Sequence[str] = (),
) -> list[BoundOffering]:
    """Every profiled type in each allowed market, plus burstable standbys (on-demand,
    at full speed: ``model.standby_latency``); types that cannot meet RT_max are left out."""
    out: list[BoundOffering] = []
    for itype, curve in sorted(model.latency.items()):
        if itype not in catalog.types:
            continue
        rate = slo_rate(curve, model.rt_max_s)
        if rate <= 0:
            continue
        for market in markets:
            try:
                price = catalog.offering(itype, Market(market)).price_per_hour
            except UnknownOffering:
                continue
            out.append(BoundOffering(itype, market, price, rate, latency=curve))
    for itype in standby_types:
        if itype not in catalog.types:
            continue
        curve = model.standby_latency(catalog.types[itype].vcpus)
        rate = slo_rate(curve, model.rt_max_s, max_batch=1)
        price = catalog.offering(itype, Market.ON_DEMAND).price_per_hour
        if rate > 0:
            out.append(
                BoundOffering(
                    itype,
                    Market.ON_DEMAND.value,
                    price,
                    rate,
                    "standby",
                    latency=curve,
                    max_batch=1,
                )
            )
    return out


def lambda_terms(
    model: SimModel, catalog: Catalog, memory_mb: int, concurrency: int
) -> LambdaTerms:
    """What one request on the simulated Lambda costs at least, and how many it answers
    at once: over the chunk sizes ``k`` it can run (up to the largest its batch curve was
    measured at, one without a curve) whose ``T_λ(k)`` is within RT_max (all of them where
    none is, so a model Lambda cannot answer in time keeps T_1's terms), the least
    price per request and the most requests per second per environment."""
    prices = catalog.lambda_prices
    t1 = model.lambda_latency(1)
    largest = spill_cap(model.lambda_batches)
    in_time = model.rt_max_s + SLO_EPS_S
    sizes = [k for k in range(1, largest + 1) if model.lambda_latency(k) <= in_time]
    sizes = sizes or [1]
    gb_rate = memory_mb / 1024.0 * prices.per_gb_second_x86
    cost = min((model.lambda_latency(k) * gb_rate + prices.per_request) / k for k in sizes)
    rate = max(k / model.lambda_latency(k) for k in sizes)
    return LambdaTerms(t1, cost, concurrency, rate)


def slot_counts(
    arrivals: NDArray[np.float64], t0: float, seconds: float, slot_s: float
) -> NDArray[np.int64]:
    """Requests arriving in each slot of ``[t0, t0 + seconds)``."""
    n, idx = _slots_of(arrivals, t0, seconds, slot_s)
    return np.bincount(idx, minlength=n).astype(np.int64)


def _slots_of(
    arrivals: NDArray[np.float64], t0: float, seconds: float, slot_s: float
) -> tuple[int, NDArray[np.int64]]:
    """(slots in the window, the slot of each of its arrivals, in arrival order)."""
    n = math.ceil(seconds / slot_s - 1e-9)
    a = arrivals[(arrivals >= t0) & (arrivals < t0 + seconds)]
    return n, np.minimum(((a - t0) // slot_s).astype(np.int64), n - 1)


def per_request_floor(
    offering: BoundOffering, rt_max_s: float
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(g, θ) for ``k = 1..n_max`` (module doc, 6): ``g[k−1] = RT_max − T̃_k``, the most
    ``k`` in-time requests of one batch can arrive apart, and ``θ[k−1] = min_{i≤k} T̃_i/i``,
    the least instance time per in-time request in a batch with ``k`` of them, with
    ``T̃_i = min_{i≤j≤n_max} T_j``. Without a latency curve: ``g = RT_max`` and
    ``θ = 1/rate`` at every ``k``."""
    if offering.latency is None:
        return np.full(MAX_BATCH, rt_max_s), np.full(MAX_BATCH, 1.0 / offering.rate_rps)
    times = [offering.latency(n) for n in range(1, offering.max_batch + 1)]
    n_max = max((n for n, t in enumerate(times, 1) if t <= rt_max_s + SLO_EPS_S), default=0)
    if n_max == 0:
        return np.zeros(0), np.zeros(0)
    envelope = np.minimum.accumulate(np.asarray(times[:n_max], dtype=float)[::-1])[::-1]
    per = envelope / np.arange(1, n_max + 1)
    return np.maximum(rt_max_s - envelope, 0.0), np.minimum.accumulate(per)


THETA_STEP = 1e-3
"""A fall of θ smaller than this share is not looked for: those ``k`` take the run's least θ."""


def _sharers(
    arrivals: NDArray[np.float64], at: NDArray[np.int64], k: int, span_s: float
) -> NDArray[np.bool_]:
    """Whether ``k`` consecutive ``arrivals`` (sorted) holding ``arrivals[at]`` span at
    most ``span_s``: one cumulative count of the blocks that do, read per request."""
    n = arrivals.size
    if k > n:
        return np.zeros(at.size, dtype=bool)
    ok = (arrivals[k - 1 :] - arrivals[: n - k + 1]) <= span_s + SLO_EPS_S
    cum = np.concatenate([[0], np.cumsum(ok)])
    lo = np.maximum(at - k + 1, 0)  # the blocks holding request ``at``: starts lo..hi
    hi = np.minimum(at, n - k)
    return np.asarray(cum[hi + 1] - cum[lo] > 0)


def request_prices(
    arrivals: NDArray[np.float64],
    t0: float,
    seconds: float,
    offerings: Sequence[BoundOffering],
    rt_max_s: float,
) -> NDArray[np.float64]:
    """π_r, in $, for each request of ``[t0, t0 + seconds)`` in arrival order: the least
    any offering's instances are paid per request answered in time on them, given how many
    neighbours could share its batch (module doc, 6); ``inf`` where none can answer it.
    ``arrivals`` sorted, warm-up included (a neighbour before ``t0`` can share a batch)."""
    first = int(np.searchsorted(arrivals, t0, side="left"))
    last = int(np.searchsorted(arrivals, t0 + seconds, side="left"))
    at = np.arange(first, last, dtype=np.int64)
    best = np.full(at.size, np.inf)
    for o in offerings:
        gaps, theta = per_request_floor(o, rt_max_s)
        if theta.size == 0:
            continue
        # Look for K ≥ k only where θ falls by more than THETA_STEP; θ is read at the
        # run's end (the least θ before the next such k): never above θ(K), so valid.
        steps = [1] + [
            k for k in range(2, theta.size + 1) if theta[k - 1] < theta[k - 2] * (1 - THETA_STEP)
        ]
        level = np.array([theta[nxt - 2] for nxt in steps[1:]] + [theta[-1]])
        reach = np.zeros(at.size, dtype=np.int64)  # index into steps of the largest feasible
        for i, k in enumerate(steps[1:], 1):
            can = _sharers(arrivals, at, k, float(gaps[k - 1]))
            if not can.any():
                break  # fewer can share at a larger k (module doc, 6)
            reach[can] = i
        best = np.minimum(best, level[reach] * o.price_per_hour / 3600.0)
    return best


@dataclass(frozen=True)
class BatchFloor:
    """The batching floor's requests in groups (module doc, 6): group ``g`` holds
    ``count[g]`` requests of slot ``slot[g]`` at ``price[g]`` $ each; a slot's groups
    hold all its requests, in ascending slot order."""

    slot: NDArray[np.int64]
    price: NDArray[np.float64]
    count: NDArray[np.int64]


def batch_floor(
    arrivals: NDArray[np.float64],
    t0: float,
    seconds: float,
    slot_s: float,
    offerings: Sequence[BoundOffering],
    rt_max_s: float,
) -> BatchFloor:
    """The requests of each slot grouped by π (``request_prices``); those at or below the
    least price per full-batch rate share one group at their least π (the capacity row
    implies their floor). ``arrivals`` sorted, warm-up included."""
    n, slot = _slots_of(arrivals, t0, seconds, slot_s)
    prices = request_prices(arrivals, t0, seconds, offerings, rt_max_s)
    rated = [o.price_per_hour / 3600.0 / o.rate_rps for o in offerings if o.rate_rps > 0]
    c_star = min(rated, default=0.0)
    prices = np.where(np.isfinite(prices), prices, 0.0)  # none answers it: no floor
    low = prices <= c_star * (1 + 1e-9)
    low_min = np.full(n, np.inf)
    np.minimum.at(low_min, slot[low], prices[low])
    prices = np.where(low, low_min[slot], prices)
    return _groups(slot, prices, n)


def _groups(slot: NDArray[np.int64], prices: NDArray[np.float64], n: int) -> BatchFloor:
    """Count the requests per (slot, price); every slot has at least one group."""
    empty = np.setdiff1d(np.arange(n), slot)
    s = np.concatenate([slot, empty])
    p = np.concatenate([prices, np.zeros(empty.size)])
    c = np.concatenate([np.ones(slot.size, dtype=np.int64), np.zeros(empty.size, dtype=np.int64)])
    order = np.lexsort((p, s))
    s, p, c = s[order], p[order], c[order]
    new = np.ones(s.size, dtype=bool)
    new[1:] = (s[1:] != s[:-1]) | (p[1:] != p[:-1])
    starts = np.flatnonzero(new)
    return BatchFloor(s[starts], p[starts], np.add.reduceat(c, starts).astype(np.int64))


def miss_budget(requests: int, sl_min: float) -> int:
    """How many of ``requests`` may miss RT_max with SL_min still met."""
    return math.floor((1.0 - sl_min) * requests + 1e-9)


def serve_times(o: BoundOffering, rt_max_s: float, longest_s: float) -> NDArray[np.float64]:
    """``τ[k]`` (``bound_bursts.serve_times``) far enough that ``τ[-1] > longest_s``; an
    offering known only by its rate serves ``k`` in ``k/μ``."""
    most = int(o.rate_rps * longest_s) + 2  # τ[k] ≥ k/μ
    if o.latency is None:
        return np.arange(most + 1) / o.rate_rps
    return _serve_times(o.latency, o.max_batch, rt_max_s, most)


def burst_rows(
    arrivals: NDArray[np.float64],
    t0: float,
    seconds: float,
    slot_s: float,
    offerings: Sequence[BoundOffering],
    rt_max_s: float,
) -> Bursts:
    """The burst rows (``mark.sim.bound_bursts``) of the window; ``arrivals`` sorted."""
    taus = [serve_times(o, rt_max_s, slot_s + rt_max_s) for o in offerings if o.rate_rps > 0]
    lengths = burst_lengths(taus, rt_max_s, slot_s, BURST_LENGTHS)
    return bursts(arrivals, t0, seconds, slot_s, rt_max_s, lengths)


def prune_dominated(offerings: Sequence[BoundOffering]) -> list[BoundOffering]:
    """The offerings with the least price per rate (exact for this LP; see the module doc).

    This includes dropping every offering with a higher price and no higher rate than
    another (such an offering has a higher price per rate)."""
    if not offerings:
        return []
    best = min(o.price_per_request for o in offerings)
    return [o for o in offerings if o.price_per_request <= best * (1 + 1e-12)]


# -- the LP ------------------------------------------------------------------


class _Columns:
    """Column index allocation for the LP's variable blocks."""

    def __init__(self) -> None:
        self.size = 0

    def block(self, *shape: int) -> NDArray[np.int64]:
        n = int(np.prod(shape)) if shape else 0
        idx = np.arange(self.size, self.size + n, dtype=np.int64).reshape(shape)
        self.size += n
        return idx


def system_bound(
    counts: Sequence[int] | NDArray[np.int64],
    offerings: Sequence[BoundOffering],
    *,
    rt_max_s: float,
    miss_budget: int,
    lam: LambdaTerms | None,
    slot_s: float = DEFAULT_SLOT_S,
    markets: Sequence[str] = (),
    prune: bool = True,
    batch_floor: BatchFloor | None = None,
    bursts: Bursts | None = None,
) -> Bound:
    """The LP of the module docstring on ``counts`` (requests per slot of ``slot_s``);
    ``batch_floor`` (the requests of each slot grouped by π, ``batch_floor``) adds the
    batching floor, ``bursts`` (``burst_rows``) the burst rows."""
    k_f = EC2_MINIMUM_S / slot_s
    k = round(k_f)
    if slot_s <= 0 or abs(k_f - k) > 1e-9 or k < 1:
        raise BoundError(f"slot of {slot_s} s: it must divide {EC2_MINIMUM_S:g} s")
    if not 0 < rt_max_s < EC2_MINIMUM_S:
        raise BoundError(f"RT_max {rt_max_s} s: the bound needs 0 < RT_max < 60 s")
    t_start = time.perf_counter()
    demand = np.asarray(counts, dtype=float)
    n_req = int(demand.sum())
    n_w = demand.size
    cap = np.zeros((len(offerings), 0), dtype=np.int64)
    if bursts is not None and bursts.count.size and offerings:
        longest = float(bursts.reach_s.max())
        cap = np.stack([caps(serve_times(o, rt_max_s, longest), bursts.reach_s) for o in offerings])
    if not prune:
        opts = list(offerings)
    elif cap.shape[1]:  # burst rows weigh offerings by cap too (bound_bursts, pruning)
        drop = dominated(
            [o.price_per_hour for o in offerings], [o.price_per_request for o in offerings], cap
        )
        opts, cap = [o for o, d in zip(offerings, drop, strict=True) if not d], cap[~drop]
    else:
        opts = prune_dominated(offerings)
    h = max(1, math.ceil(rt_max_s / slot_s - 1e-12))
    n_s = n_w + k  # slots modelled: the window, then what a late start is still billed
    n_o = len(opts)
    kappa = 1.0 + (rt_max_s + SLO_EPS_S) / EC2_MINIMUM_S
    use_lambda = lam is not None and lam.latency_s <= rt_max_s + SLO_EPS_S

    cols = _Columns()
    # c[o,u]: starts of o up to and including slot u (a running sum, so that the window
    # of the 60 s minimum is two terms whatever k is).
    n_c, a_c, b_c, p_c, c_c = (cols.block(n_o, n_s) for _ in range(5))
    if batch_floor is None:  # one group per slot, at no floor
        g_slot, g_price, g_count = np.arange(n_w), np.zeros(n_w), demand
    else:
        g_slot, g_price, g_count = batch_floor.slot, batch_floor.price, batch_floor.count
        held = np.bincount(g_slot, weights=g_count, minlength=n_w)
        if held.size != n_w or not np.array_equal(held, demand):
            raise BoundError("the batching floor's groups do not hold the slots' requests")
    n_g = g_slot.size
    x_c = cols.block(n_g, h + 1)
    y_c = cols.block(n_w, h + 1) if use_lambda else cols.block(0, h + 1)
    m_c = cols.block(n_w)
    n_var = cols.size

    cost = np.zeros(n_var)
    for o, opt in enumerate(opts):
        cost[p_c[o]] = opt.price_per_hour * slot_s / (3600.0 * kappa)
    if use_lambda and lam is not None:
        cost[y_c.ravel()] = lam.cost_per_request

    rows: list[NDArray[np.int64]] = []
    cs: list[NDArray[np.int64]] = []
    vs: list[NDArray[np.float64]] = []
    b_ub: list[NDArray[np.float64]] = []
    n_rows = 0

    def add(r: NDArray[np.int64], c: NDArray[np.int64], v: float | NDArray[np.float64]) -> None:
        rows.append(np.asarray(r, dtype=np.int64).ravel())
        cs.append(np.asarray(c, dtype=np.int64).ravel())
        vs.append(np.broadcast_to(np.asarray(v, dtype=float), np.shape(c)).ravel())

    # Capacity of slot v, v < n_w + h: Σ_j x[v−j, j] − δ Σ_o μ_o n[o,v] ≤ 0 (and Lambda's).
    n_cap = n_w + h
    w_idx, j_idx = np.meshgrid(np.arange(n_w), np.arange(h + 1), indexing="ij")
    gs_idx, gj_idx = np.meshgrid(g_slot, np.arange(h + 1), indexing="ij")  # per group, j
    add(n_rows + gs_idx + gj_idx, x_c, 1.0)
    for o, opt in enumerate(opts):
        add(n_rows + np.arange(n_cap), n_c[o, :n_cap], -slot_s * opt.rate_rps)
    b_ub.append(np.zeros(n_cap))
    n_rows += n_cap
    if use_lambda and lam is not None:
        add(n_rows + w_idx + j_idx, y_c[w_idx, j_idx], 1.0)
        b_ub.append(np.full(n_cap, slot_s * lam.concurrency * lam.rate_per_env))
        n_rows += n_cap
    floor_rows = 0
    if batch_floor is not None and opts:
        # The batching floor of slot v: Σ_{g,j: w_g+j=v} π_g x[g, j] − δ Σ_o price_o n[o,v]
        # ≤ 0 ($ per second on both sides). Where every π it holds is at most the least
        # price per full-batch rate, the capacity row above implies it: only the other
        # slots get one (the same optimum, and a full-batch load's LP is unchanged).
        c_star = min(opt.price_per_hour / 3600.0 / opt.rate_rps for opt in opts)
        above = np.zeros(n_cap, dtype=bool)
        dear = g_slot[g_price > c_star * (1 + 1e-9)]
        for j in range(h + 1):
            above[dear + j] = True
        slots = np.flatnonzero(above)
        row_of = np.full(n_cap, -1, dtype=np.int64)
        row_of[slots] = n_rows + np.arange(slots.size)
        keep = above[gs_idx + gj_idx]
        add(
            row_of[(gs_idx + gj_idx)[keep]],
            x_c[keep],
            np.broadcast_to(g_price[:, None], x_c.shape)[keep],
        )
        for o, opt in enumerate(opts):
            add(row_of[slots], n_c[o, slots], -slot_s * opt.price_per_hour / 3600.0)
        b_ub.append(np.zeros(slots.size))
        n_rows += slots.size
        floor_rows = slots.size
        # A group answers at most its count: Σ_j x[g, j] ≤ count_g (a slot of one group:
        # its demand row says as much).
        several = np.flatnonzero(np.bincount(g_slot, minlength=n_w)[g_slot] > 1)
        r = n_rows + np.arange(several.size)
        add(np.repeat(r, h + 1), x_c[several].ravel(), 1.0)
        b_ub.append(g_count[several].astype(float))
        n_rows += several.size
    # Misses: Σ m ≤ M.
    add(np.full(n_w, n_rows), m_c, 1.0)
    b_ub.append(np.array([float(miss_budget)]))
    n_rows += 1
    u = np.arange(n_s)
    for o in range(n_o):
        # Growth: n[u] − n[u−1] − a[u] − b[u−1] ≤ 0.
        r = n_rows + u
        add(r, n_c[o], 1.0)
        add(r, a_c[o], -1.0)
        add(r[1:], n_c[o, :-1], -1.0)
        add(r[1:], b_c[o, :-1], -1.0)
        n_rows += n_s
        # Running is billed: n[u] − p[u] ≤ 0.
        r = n_rows + u
        add(r, n_c[o], 1.0)
        add(r, p_c[o], -1.0)
        n_rows += n_s
        # 60 s minimum: a[u] + Σ_{u−k<u'<u} (a+b)[u'] + b[u−k] − p[u] ≤ 0, the sum being
        # c[u−1] − c[u−k].
        r = n_rows + u
        add(r, a_c[o], 1.0)
        add(r, p_c[o], -1.0)
        add(r[1:], c_c[o, :-1], 1.0)
        add(r[k:], c_c[o, : n_s - k], -1.0)
        add(r[k:], b_c[o, : n_s - k], 1.0)
        n_rows += n_s
    for _ in range(3 * n_o):
        b_ub.append(np.zeros(n_s))

    a_ub = coo_matrix(
        (np.concatenate(vs), (np.concatenate(rows), np.concatenate(cs))), shape=(n_rows, n_var)
    ).tocsr()
    # Every request of a slot is answered in time (instances, Lambda) or missed.
    eq_r = [gs_idx.ravel(), np.arange(n_w)]
    eq_c = [x_c.ravel(), m_c]
    if use_lambda:
        eq_r.append(w_idx.ravel())
        eq_c.append(y_c.ravel())
    ev = [np.ones(r.size) for r in eq_r]
    # The running sums: c[u] − c[u−1] − a[u] − b[u] = 0.
    n_eq = n_w
    for o in range(n_o):
        r = n_eq + u
        eq_r += [r, r[1:], r, r]
        eq_c += [c_c[o], c_c[o, :-1], a_c[o], b_c[o]]
        ev += [np.ones(n_s), -np.ones(n_s - 1), -np.ones(n_s), -np.ones(n_s)]
        n_eq += n_s
    er, ec = np.concatenate(eq_r), np.concatenate(eq_c)
    a_eq = coo_matrix((np.concatenate(ev), (er, ec)), shape=(n_eq, n_var)).tocsr()
    b_eq = np.concatenate([demand, np.zeros(n_eq - n_w)])

    upper = np.concatenate(b_ub)
    burst_a, burst_b = _burst_matrix(
        bursts, cap, n_var, n_s, h, m_c, y_c if use_lambda else None, (n_c, a_c, b_c, c_c)
    )
    a_ub = vstack([a_ub, burst_a]).tocsr()
    upper = np.concatenate([upper, burst_b])

    def solve(method: str) -> OptimizeResult:
        return linprog(
            cost, A_ub=a_ub, b_ub=upper, A_eq=a_eq, b_eq=b_eq, bounds=(0, None), method=method
        )

    # The floor's and the burst rows slow HiGHS's dual simplex tenfold (NASNet, day 10:
    # 230 s); its interior point, with crossover to a vertex, solves the same LP in 20 s.
    # Where the interior point reports anything but an optimum or infeasibility, the
    # simplex decides.
    slow = floor_rows or burst_b.size
    res = solve("highs-ipm" if slow else "highs")
    if slow and res.status not in (0, 2):
        res = solve("highs")
    solve_s = time.perf_counter() - t_start
    if res.status == 2:  # infeasible: no schedule of this world meets the SLO
        return Bound(
            math.inf, math.inf, 0.0, n_req, 0.0, 0.0, miss_budget, {},
            tuple(o.key for o in opts), tuple(markets), slot_s, solve_s, "infeasible",
        )  # fmt: skip
    if res.status != 0 or res.x is None:
        raise BoundError(f"HiGHS: {res.message}")
    xs = res.x
    hours = {
        opt.key: float(xs[p_c[o]].sum()) * slot_s / 3600.0 / kappa for o, opt in enumerate(opts)
    }
    inst = sum(opts[o].price_per_hour * hours[opts[o].key] for o in range(n_o))
    lam_req = float(xs[y_c].sum()) if use_lambda else 0.0
    lam_cost = lam_req * lam.cost_per_request if use_lambda and lam is not None else 0.0
    return Bound(
        value=float(res.fun),
        instance_cost=inst,
        lambda_cost=lam_cost,
        requests=n_req,
        lambda_requests=lam_req,
        missed=float(xs[m_c].sum()),
        miss_budget=miss_budget,
        instance_hours={key: v for key, v in hours.items() if v > 1e-9},
        offerings=tuple(o.key for o in opts),
        markets=tuple(markets),
        slot_s=slot_s,
        solve_s=solve_s,
        status="optimal",
    )


def _burst_matrix(
    bursts: Bursts | None,
    cap: NDArray[np.int64],
    n_var: int,
    n_s: int,
    h: int,
    m_c: NDArray[np.int64],
    y_c: NDArray[np.int64] | None,
    blocks: tuple[NDArray[np.int64], ...],
) -> tuple[csr_matrix, NDArray[np.float64]]:
    """The burst rows (``A x ≤ b``) over the LP's columns: ``N_I − m[w] − Σ_j y[w,j] ≤
    Σ_o cap_o·(n[o,w−1] + b[o,w−1] + S)``, ``S`` the starts in slots ``w..e``, ``c[e] −
    c[w−1]``, and again with those of slot ``e`` before ``I'`` ends only, ``c[e−1] −
    c[w−1] + a[e]/(1 − tail)`` (``bound_bursts``, "the row")."""
    if bursts is None or not cap.shape[0] or not cap.shape[1]:
        return csr_matrix((0, n_var)), np.zeros(0)
    n_c, a_c, b_c, c_c = blocks
    count = cap.shape[1]
    w, e = bursts.slot, np.minimum(bursts.last, n_s - 1)
    later = w > 0  # slot 0: runs start at t0 at the earliest
    inner = e > 0
    rows: list[NDArray[np.int64]] = []
    cs: list[NDArray[np.int64]] = []
    vs: list[NDArray[np.float64]] = []

    def add(r: NDArray[np.int64], c: NDArray[np.int64], v: float | NDArray[np.float64]) -> None:
        rows.append(np.asarray(r, dtype=np.int64).ravel())
        cs.append(np.asarray(c, dtype=np.int64).ravel())
        vs.append(np.broadcast_to(np.asarray(v, dtype=float), np.shape(c)).ravel())

    for variant in range(2):
        r = variant * count + np.arange(count)
        add(r, m_c[w], -1.0)
        if y_c is not None:
            add(np.repeat(r, h + 1), y_c[w].ravel(), -1.0)
        for o in range(cap.shape[0]):
            if variant == 0:
                add(r, c_c[o, e], -cap[o])
            else:
                add(r[inner], c_c[o, e[inner] - 1], -cap[o, inner])
                add(r, a_c[o, e], -cap[o] / (1.0 - bursts.tail))
            for block, sign in ((n_c, -1.0), (b_c, -1.0), (c_c, 1.0)):
                add(r[later], block[o, w[later] - 1], sign * cap[o, later])
    a = coo_matrix(
        (np.concatenate(vs), (np.concatenate(rows), np.concatenate(cs))),
        shape=(2 * count, n_var),
    ).tocsr()
    return a, -np.tile(bursts.count.astype(float), 2)


def _cover_seconds(times: Sequence[float], weight: float, phi: float) -> float:
    """``min over groups [instance-seconds + weight·missed]`` (module doc, the presence
    floor): ``times`` sorted; a request in no group is missed; the group of requests
    ``a..k`` costs ``max(60, φ·(t_k − t_a))``.

    ``f[k]``, the least for the first ``k`` requests, never falls as ``k`` grows (cutting
    a group short costs no more), so the best group ending at ``k`` whose cost is the flat
    60 s starts where that reach begins; the longer ones cost ``φ(t_k − t_a)``, a running
    minimum of ``f[a − 1] − φ·t_a``."""
    reach = EC2_MINIMUM_S / phi  # a group costs 60 s while it spans at most this
    f = [0.0]
    best_lin = math.inf  # min over a before the flat reach of f[a − 1] − φ·t_a
    a_flat = 0  # 0-based index of the first request within reach of the current one
    for k, t in enumerate(times):
        while times[a_flat] < t - reach:
            best_lin = min(best_lin, f[a_flat] - phi * times[a_flat])
            a_flat += 1
        f.append(min(f[k] + weight, f[a_flat] + EC2_MINIMUM_S, phi * t + best_lin))
    return f[-1]


SEARCH_STEPS = 48
"""Golden-section steps over λ: the floor is concave in λ; any λ is valid, more only tighten."""


def golden_max(f: Callable[[float], float], lo: float, hi: float, steps: int) -> float:
    """The largest ``f`` seen in a golden-section search of ``[lo, hi]`` (both ends
    included): for a Lagrange dual, concave in its multiplier, where any point is valid and
    more steps only come closer to the best."""
    g = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = f(a), f(b)
    best = max(f(lo), f(hi), fa, fb)
    for _ in range(steps):
        if fa < fb:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = f(b)
            best = max(best, fb)
        else:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = f(a)
            best = max(best, fa)
    return best


def presence_floor(
    arrivals: NDArray[np.float64],
    offerings: Sequence[BoundOffering],
    *,
    t0: float,
    seconds: float,
    rt_max_s: float,
    miss_budget: int,
    lam: LambdaTerms | None,
    at_most: float = 0.0,
) -> float:
    """The presence floor in $ for the window ``[t0, t0 + seconds)`` of ``arrivals``
    (module doc): 0 where Lambda answers in time or nothing can serve, and not computed
    (0) when even one instance through the window, ``price·(seconds + 60)``, would not
    exceed ``at_most`` (the LP's optimum: the floor could not raise the bound)."""
    if not offerings or (lam is not None and lam.latency_s <= rt_max_s + SLO_EPS_S):
        return 0.0
    price = min(o.price_per_hour for o in offerings) / 3600.0
    if price * (seconds + EC2_MINIMUM_S) <= at_most:
        return 0.0
    phi = EC2_MINIMUM_S / (EC2_MINIMUM_S + rt_max_s)
    times = np.sort(arrivals[(arrivals >= t0) & (arrivals < t0 + seconds)]).tolist()
    if not times:
        return 0.0

    def floor_at(weight: float) -> float:
        return _cover_seconds(times, weight, phi) - weight * miss_budget

    # A lone request costs at most 60 s to cover, so past λ = 60 s per request covering every
    # request is cheapest and the floor only falls: the maximum lies in [0, 60].
    best = golden_max(floor_at, 0.0, EC2_MINIMUM_S, SEARCH_STEPS)
    return max(0.0, best) * price


def window_bound(
    model: SimModel,
    catalog: Catalog,
    arrivals: NDArray[np.float64],
    *,
    t0: float,
    seconds: float,
    markets: Sequence[str],
    standby_types: Sequence[str] = (),
    lambda_memory_mb: int = 3072,
    lambda_concurrency: int = 1000,
    misses: int | None = None,
    slot_s: float = DEFAULT_SLOT_S,
    prune: bool = True,
    bursts: bool = True,
) -> Bound:
    """The bound for one measured window ``[t0, t0 + seconds)`` of ``arrivals``, with the
    offerings of ``markets`` (and ``standby_types``) and the simulated Lambda; ``misses``
    replaces the SLO's budget (a run that missed more is bounded at its own misses);
    ``bursts=False`` leaves out the burst rows (to show what they add). They are added only
    where Lambda cannot answer in time: elsewhere a burst's excess can go to Lambda at its
    price per request, and on Inception-v3 and LSTM-ptb (Twitter day 10 and 12, 8 h) they
    raised the bound by nothing (Inception-v3: an hour of days 10 and 12; LSTM-ptb: 8 h of
    day 12) while they slowed its solve from seconds to two minutes."""
    counts = slot_counts(arrivals, t0, seconds, slot_s)
    budget = miss_budget(int(counts.sum()), model.sl_min)
    offerings = bound_offerings(model, catalog, markets, standby_types)
    allowed = budget if misses is None else max(budget, misses)
    lam = lambda_terms(model, catalog, lambda_memory_mb, lambda_concurrency)
    ordered = np.sort(arrivals)
    lp = system_bound(
        counts,
        offerings,
        rt_max_s=model.rt_max_s,
        miss_budget=allowed,
        lam=lam,
        slot_s=slot_s,
        markets=markets,
        prune=prune,
        batch_floor=batch_floor(ordered, t0, seconds, slot_s, offerings, model.rt_max_s),
        bursts=burst_rows(ordered, t0, seconds, slot_s, offerings, model.rt_max_s)
        if bursts and lam.latency_s > model.rt_max_s + SLO_EPS_S
        else None,
    )
    floor = presence_floor(
        arrivals,
        offerings,
        t0=t0,
        seconds=seconds,
        rt_max_s=model.rt_max_s,
        miss_budget=allowed,
        lam=lam,
        at_most=lp.value,
    )
    return with_presence_floor(lp, floor)


def with_presence_floor(lp: Bound, floor: float) -> Bound:
    """The bound as the larger of the LP's optimum and the presence floor (all EC2)."""
    if not math.isfinite(lp.value) or floor <= lp.value:
        return replace(lp, presence_floor=floor, lp_value=lp.value)
    return replace(lp, value=floor, instance_cost=floor, presence_floor=floor, lp_value=lp.value)
