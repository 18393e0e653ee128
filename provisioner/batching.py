"""The batching tuner of paper §4.3: choose N_batch and W_batch per instance type.

Given the batch latency T_b for the batch sizes b that were profiled and the
no-batching rate μ*_nb (1/T_1 unless measured otherwise), b grows from 1 over
the profiled sizes while both of the paper's constraints can hold:

    W_batch + T_b ≤ RT_max          (a batch never breaks the SLO)
    W_batch + T_b ≤ b / μ*_nb       (batching beats serving one by one)

For each b the window is the largest one both allow,
W_b = min(RT_max − slack·T_b, b/μ*_nb) − T_b; a longer window lets batches fill
at low load. The slack (one batch time by default, ``slack_batches``) is ours:
with the window at RT_max − T_b, the first request of every batch at low load
finishes exactly at its deadline, and a request that also waits for the batch
ahead of it to finish misses; reserving one batch time keeps that case in.
Batching must strictly beat no batching, so for b > 1 we need W_b > 0.

The paper's two constraints alone keep growing b while T_b ≤ RT_max, so with a
smooth T_b curve they end at a batch that almost fills RT_max with a window of a
few ms; such batches never fill in time and μ* is never reached. We add a third
condition (on by default, ``require_fill``): the window must be long enough to
collect the batch at the rate the instance then serves, W_b ≥ (b−1)/μ*_b, where
μ*_b = b/T_b (the next batch is collected while the current one runs).

The result is μ* = N_batch / T_N, the rate at which the planner treats the
instance as a black box. Of the sizes that pass, the chosen one is the smallest
with the highest μ*: a larger batch at the same rate only makes requests wait.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class BatchStep:
    """One candidate batch size and why it was accepted or not."""

    batch: int
    batch_time_s: float
    window_s: float
    meets_slo: bool
    beats_no_batching: bool
    fills_in_window: bool

    @property
    def ok(self) -> bool:
        return self.meets_slo and self.beats_no_batching and self.fills_in_window


@dataclass(frozen=True)
class BatchingConfig:
    n_batch: int
    w_batch_s: float
    mu_star: float
    mu_nb: float
    steps: tuple[BatchStep, ...]


def tune_batching(
    batch_latency_s: Mapping[int, float],
    rt_max_s: float,
    mu_nb: float | None = None,
    *,
    require_fill: bool = True,
    slack_batches: float = 1.0,
) -> BatchingConfig:
    """Grow b from 1 until a constraint fails; see the module docstring.

    Raises ``ValueError`` when μ*_nb is neither given nor derivable (no T_1), or
    when even one request at a time cannot meet RT_max.
    """
    curve = dict(batch_latency_s)
    if mu_nb is None:
        if 1 not in curve:
            raise ValueError("profile has no T_1; pass the measured no-batching rate mu_nb")
        mu_nb = 1.0 / curve[1]
    curve.setdefault(1, 1.0 / mu_nb)
    if curve[1] > rt_max_s:
        raise ValueError(f"T_1 = {curve[1]:.3f} s already exceeds RT_max = {rt_max_s:.3f} s")

    best = BatchingConfig(n_batch=1, w_batch_s=0.0, mu_star=mu_nb, mu_nb=mu_nb, steps=())
    steps: list[BatchStep] = []
    for b in sorted(curve):
        t_b = curve[b]
        window = min(rt_max_s - (slack_batches * t_b if b > 1 else 0.0), b / mu_nb) - t_b
        step = BatchStep(
            batch=b,
            batch_time_s=t_b,
            window_s=window,
            meets_slo=window >= 0 and window + t_b <= rt_max_s,
            beats_no_batching=b == 1 or window > 0,
            fills_in_window=not require_fill or window >= (b - 1) * t_b / b,
        )
        steps.append(step)
        if not step.ok:
            break
        # A larger batch must raise throughput: at equal μ* it only adds waiting
        # (a flat profile, e.g. one point measured at b = 8, extends linearly beyond it).
        if b > 1 and b / t_b > best.mu_star * (1 + 1e-9):
            best = BatchingConfig(b, window, b / t_b, mu_nb, ())
    return BatchingConfig(best.n_batch, best.w_batch_s, best.mu_star, mu_nb, tuple(steps))


PROFILE_BATCHES = (1, 2, 4, 8, 16, 32)
"""The batch sizes every profile measures (agents, `mark profile`, the local world)."""


def serving_batching(batch_time_s: Callable[[int], float], rt_max_s: float) -> tuple[int, float]:
    """N_batch and W_batch a backend serves with, tuned from its profile over
    ``PROFILE_BATCHES``; an instance too slow even for one request alone serves one
    at a time with no window (the Bouncer then spills what it cannot finish).

    The dispatcher, the simulator and the planner's options all batch by this rule.
    """
    try:
        cfg = tune_batching({b: batch_time_s(b) for b in PROFILE_BATCHES}, rt_max_s)
    except ValueError:
        return 1, 0.0
    return cfg.n_batch, cfg.w_batch_s
