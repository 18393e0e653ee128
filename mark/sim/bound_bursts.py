"""The bound's burst rows: requests that arrive close together need instances side by side.

The LP of ``mark.sim.bound`` treats a slot's capacity as a fluid, ``δ·Σ μ_o·n[o,v]``: a
fifth of an instance running all slot serves a fifth of its rate. Where a batch takes
most of RT_max (NASNet: 706 ms on c5.xlarge against 1 s), that is far from what an
instance can do: requests that arrive within a few hundred milliseconds of each other
cannot wait for one instance to finish the other's batch, so each needs its own instance,
and an instance is there whole and billed a minute from its start. This module adds, for
each slot, rows that say so; each is valid on its own, so a subset only weakens the bound.

The row and why it holds
------------------------
Take an interval ``I = [a, b]`` inside slot ``w`` and the ``N_I`` window requests that
arrive in it, and ``I' = [a, b + RT_max]``. A request of ``I`` answered in time by an
instance is in a batch dispatched at ``d ≥ r ≥ a`` that ends by ``r + RT_max ≤ b +
RT_max``: the batch lies inside ``I'`` and inside the (extended) run that serves it
(``mark.sim.bound``, item 2). An instance runs one batch at a time, and a batch answering
anyone in time has ``T_n ≤ RT_max``. So one run of offering ``o`` answers at most
``cap_o(|I'|)`` of ``I``'s requests in time, where ``cap_o(L)`` is the most requests
batches of ``o`` with ``T_n ≤ RT_max`` hold in total time ``L`` (``serve_times``: a small
dynamic programme over batch sizes; a batch may hold requests from outside ``I``, which
only counts against it).

The runs of ``o`` that meet ``I'`` are at most those running at any earlier ``τ ≤ a`` plus
those started in ``(τ, b + RT_max]`` (a run is an interval). Average ``τ`` over slot
``w − 1`` (all of it before ``a``) and read the LP's variables (``mark.sim.bound``: ``n``
the slot mean of running runs, a start at offset ``ξ`` of slot ``u`` adding ``(δ − ξ)/δ``
to ``a[u]`` and ``ξ/δ`` to ``b[u]``): a start in slot ``w − 1`` falls after ``τ`` with
probability ``ξ/δ``, so the runs meeting ``I'`` number at most

    D_o = n[o, w−1] + b[o, w−1] + Σ_{u=w}^{e} (a + b)[o, u]

with ``e`` the slot holding ``b + RT_max`` (for ``w = 0``, runs start at ``t0`` at the
earliest, so the first two terms are 0). Of ``I``'s requests, at most ``m[w]`` are missed
and ``Σ_j y[w, j]`` answered by Lambda (the slot's), so

    N_I − m[w] − Σ_j y[w, j] ≤ Σ_o cap_o(|I'|) · D_o

holds for any run of the simulated world, which is all the bound asks of a row. Starts
are dear in the LP (each is billed a minute), so the rows make it keep, for a minute
around each burst, as many runs as the burst needs: what a real fleet pays.

Which intervals
---------------
For each slot and each length ``ℓ`` of ``burst_lengths`` (just short of where some
offering's ``cap`` steps up: there an interval holds the most requests for its ``cap``),
the interval of length at most ``ℓ`` holding the most of the slot's requests
(``bursts``), and of those the shortest. A row whose count is no more than a shorter
one's of the same slot is implied by it and dropped. The LP takes the rest as cuts
(``mark.sim.bound.system_bound``): solved without them, then again with those its optimum
breaks most, until it breaks none or the optimum stops rising.

Pruning offerings
-----------------
``mark.sim.bound.prune_dominated`` keeps one offering, exactly, because every row is
homogeneous in an offering's variables. A burst row weighs offering ``o`` by
``cap_o``, not ``μ_o``: scaling ``o``'s schedule by ``price_o/price_*`` gives one of ``*``
at the same cost that serves at least as much on every row only if ``*`` also has at
least ``o``'s ``cap`` per dollar at every row's ``|I'|``. ``dominated`` checks that.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import numpy as np
from numpy.typing import NDArray

BURST_LENGTHS = 8
"""Interval lengths per slot: the shortest where some offering's ``cap`` steps. Any set is
valid (each row holds alone); more rows only tighten the bound and slow the solve. On two
hours of NASNet at Table 5's load (Twitter day 10, seed 0) the bound was $1.367 without
the rows and $1.533, $1.620 and $1.629 with 4, 8 and 12 lengths."""

SLO_EPS_S = 1e-9  # the simulator's "within RT_max" tolerance (``mark.sim.bound``)


def serve_times(
    latency: Callable[[int], float], max_batch: int, rt_max_s: float, most: int
) -> NDArray[np.float64]:
    """``τ[k]`` for ``k = 0..most``: the least total batch time one instance needs to
    answer ``k`` requests in time, over batches of sizes ``n ≤ max_batch`` with ``T_n ≤
    RT_max`` holding ``k`` or more in all; ``inf`` if no batch fits RT_max."""
    sizes = [
        (n, float(t)) for n in range(1, max_batch + 1) if (t := latency(n)) <= rt_max_s + SLO_EPS_S
    ]
    tau = np.full(most + 1, np.inf)
    tau[0] = 0.0
    for k in range(1, most + 1):
        tau[k] = min((t + tau[max(0, k - n)] for n, t in sizes), default=math.inf)
    return tau


def caps(tau: NDArray[np.float64], reach_s: NDArray[np.float64]) -> NDArray[np.int64]:
    """``cap(L)`` for each ``L`` in ``reach_s``: the most ``k`` with ``τ[k] ≤ L`` (``tau``
    from ``serve_times``, long enough that ``τ[-1]`` exceeds every ``L``)."""
    if tau.size and np.isfinite(tau[-1]) and reach_s.size and tau[-1] <= reach_s.max():
        raise ValueError("serve_times too short for the longest interval")
    return (np.searchsorted(tau, reach_s + SLO_EPS_S, side="right") - 1).astype(np.int64)


def burst_lengths(
    taus: Sequence[NDArray[np.float64]], rt_max_s: float, slot_s: float, most: int
) -> list[float]:
    """The ``most`` shortest interval lengths in ``[0, slot_s)`` just short of a step of
    some offering's ``cap`` (``τ[k] − RT_max``, less a microsecond)."""
    found: set[float] = set()
    for tau in taus:
        for t in tau[1:]:
            ell = float(t) - rt_max_s - 1e-6
            if math.isfinite(ell) and 0.0 <= ell < slot_s:
                found.add(round(ell, 9))
    return sorted(found)[:most]


@dataclass(frozen=True)
class Bursts:
    """One row each: ``count`` requests of slot ``slot`` arrive within an interval whose
    ``I'`` is ``reach_s`` long and ends in slot ``last``."""

    slot: NDArray[np.int64]
    last: NDArray[np.int64]
    count: NDArray[np.int64]
    reach_s: NDArray[np.float64]
    tail: NDArray[np.float64]
    """The share of slot ``last`` before ``I'`` ends."""


def bursts(
    arrivals: NDArray[np.float64],
    t0: float,
    seconds: float,
    slot_s: float,
    rt_max_s: float,
    lengths: Sequence[float],
) -> Bursts:
    """The rows of the module doc for the window ``[t0, t0 + seconds)`` of ``arrivals``
    (sorted): per slot and length, the fullest interval, shortest first; implied rows
    dropped."""
    n_w = math.ceil(seconds / slot_s - 1e-9)
    t = arrivals[(arrivals >= t0) & (arrivals < t0 + seconds)]
    if t.size == 0 or not lengths:
        none = np.zeros(0, dtype=np.int64)
        return Bursts(none, none, none, np.zeros(0), np.zeros(0))
    slot = np.minimum(((t - t0) // slot_s).astype(np.int64), n_w - 1)
    seg = np.flatnonzero(np.r_[True, slot[1:] != slot[:-1]])  # first arrival of each slot
    seg_of = np.cumsum(np.r_[False, slot[1:] != slot[:-1]])  # each arrival's segment
    seg_end = np.r_[seg[1:], t.size][seg_of]  # one past the slot's last arrival
    idx = np.arange(t.size)
    rows: list[Bursts] = []
    best = np.zeros(seg.size, dtype=np.int64)  # the most any shorter row of the slot held
    for ell in sorted(lengths):
        j = np.minimum(np.searchsorted(t, t + ell, side="right"), seg_end)
        cnt = j - idx
        top = np.maximum.reduceat(cnt, seg)
        span = np.where(cnt == top[seg_of], t[j - 1] - t, np.inf)
        short = np.minimum.reduceat(span, seg)
        at = np.flatnonzero(span == short[seg_of])  # the shortest fullest interval(s)
        first = at[np.searchsorted(seg_of[at], np.arange(seg.size))]
        keep = top > best
        best = np.maximum(best, top)
        i = first[keep]
        end = t[j[i] - 1] + rt_max_s + SLO_EPS_S  # the end of I'
        last = ((end - t0) // slot_s).astype(np.int64)
        tail = (end - t0) / slot_s - last
        rows.append(Bursts(slot[i], last, top[keep], end - t[i], tail))
    return Bursts(*(np.concatenate([getattr(r, f.name) for r in rows]) for f in fields(Bursts)))


def dominated(
    price: Sequence[float], per_rate: Sequence[float], cap: NDArray[np.int64]
) -> NDArray[np.bool_]:
    """Which offerings another makes needless on every row (module doc): at most its
    price per rate and at least its ``cap`` per dollar on every burst row (``cap``: one row
    per offering). Of offerings equal on all counts, the first is kept."""
    n = len(price)
    per_dollar = cap / np.asarray(price, dtype=float)[:, None]
    out = np.zeros(n, dtype=bool)
    for o in range(n):
        for s in range(n):
            if s == o or out[s]:
                continue
            no_worse = per_rate[s] <= per_rate[o] * (1 + 1e-12) and bool(
                np.all(per_dollar[s] >= per_dollar[o] * (1 - 1e-12))
            )
            better = per_rate[s] < per_rate[o] * (1 - 1e-12) or bool(
                np.any(per_dollar[s] > per_dollar[o] * (1 + 1e-12))
            )
            if no_worse and (better or s < o):
                out[o] = True
                break
    return out
