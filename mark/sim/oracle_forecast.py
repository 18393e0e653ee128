"""A forecast that knows the future: the window's true per-minute peaks.

An ablation, not a predictor. Run beside the trained forecaster on the same
arrivals (``mark simulate --predictor oracle``), it splits mark's gap to the
lower bound in two: what a perfect forecast would still cost (the planner, the
boot, whole instances, per-minute peaks against 5 s slots) and what the
forecaster's errors add. It reads the simulated workload, so it exists only in
the simulator; the daemon cannot be given one.
"""

from __future__ import annotations

import numpy as np

from mark.sim.workloads import Workload
from predictor.base import FloatArray, Forecaster, History

WINDOW_S = 5
"""P_s: the peaks are of 5 s windows, the series every forecaster learns."""

ORACLE = "oracle"
"""The ``--predictor`` name that selects it."""


class OracleForecast(Forecaster):
    """Each next minute's peak ``P_s``-window rate of ``workload``, as the paper's series
    measures it, from the minute after the history's last; the last known minute
    repeated past the trace's end."""

    name = ORACLE

    def __init__(self, workload: Workload) -> None:
        super().__init__()
        self.workload = workload
        self.fitted = True  # nothing to learn: it reads the answer

    def _forecast(self, history: History, steps: int) -> FloatArray:
        # Clock minutes, as the controller's history groups them: the trace's second 0
        # need not fall on one, so the minutes are cut here, not by ``minute_max_rates``.
        first = round((history.start_minute + len(history)) * 60 - self.workload.epoch)
        x = self.workload.per_second[max(first, 0) :]
        n = min(steps, x.size // 60)
        if n == 0:
            return np.full(steps, float(history.observed[-1]))
        windows = x[: n * 60].reshape(n, 60 // WINDOW_S, WINDOW_S).mean(axis=2)
        return np.pad(windows.max(axis=1), (0, steps - n), mode="edge")
