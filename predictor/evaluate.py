"""Rolling-origin evaluation of forecasters on one series.

Each model is fitted once on the first `train_minutes`; then, every `stride`
minutes through the rest, it forecasts the next `horizon` minutes from all
history up to that origin (as the daemon would, without refitting) and is
scored against what happened. Minutes that are gaps (NaN) are not scored.
Results are plain dataclasses so the CLI can print them as a table or JSON.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from predictor.base import FloatArray, Forecaster, ForecasterError, History
from predictor.registry import NAIVE, create


@dataclass(frozen=True)
class Score:
    """How one model did. Rates in req/s, the rest in percent."""

    model: str
    mape: float  # mean |f - y| / y, over scored steps with y > 0
    rmse: float  # req/s
    under_rate: float  # share of scored steps with f < y (capacity short, reactive paths needed)
    over_provision: float  # mean max(f - y, 0) / y: capacity bought and not needed
    shortfall: float  # mean max(y - f, 0) / y: load left to Lambda and the SLO monitor
    steps: int
    origins: int
    fit_seconds: float
    forecast_ms: float  # mean wall time of one forecast call


@dataclass(frozen=True)
class Run:
    """One model's forecasts: row i is made at origins[i] for the next `horizon` minutes."""

    origins: np.ndarray
    forecasts: FloatArray
    truth: FloatArray
    fit_seconds: float
    forecast_ms: float


@dataclass
class Evaluation:
    trace: str
    train_minutes: int
    test_minutes: int
    horizon: int
    stride: int
    scores: list[Score] = field(default_factory=list)
    runs: dict[str, Run] = field(default_factory=dict, repr=False)

    def best_naive(self) -> Score | None:
        """The naive model with the lowest MAPE: the bar for a learned one."""
        naive = [s for s in self.scores if s.model in NAIVE and np.isfinite(s.mape)]
        return min(naive, key=lambda s: s.mape, default=None)

    def mape_gain(self, model: str) -> float | None:
        """How much lower `model`'s MAPE is than the best naive one's, in percent of it."""
        best = self.best_naive()
        mine = next((s for s in self.scores if s.model == model), None)
        if best is None or mine is None or best.mape <= 0:
            return None
        return (1 - mine.mape / best.mape) * 100

    def as_dict(self) -> dict[str, Any]:
        """Plain data (no arrays) for JSON."""
        best = self.best_naive()
        return {
            "trace": self.trace,
            "train_minutes": self.train_minutes,
            "test_minutes": self.test_minutes,
            "horizon": self.horizon,
            "stride": self.stride,
            "scores": [s.__dict__ for s in self.scores],
            "best_naive": best.model if best else None,
            "mape_gain_vs_best_naive": {
                s.model: self.mape_gain(s.model) for s in self.scores if s.model not in NAIVE
            },
        }


def rolling_origin(
    model: Forecaster, history: History, train_minutes: int, horizon: int = 60, stride: int = 10
) -> Run:
    """Fit on the head, forecast from every `stride`-th origin of the tail."""
    n = len(history)
    if not 0 < train_minutes <= n - horizon - 1:
        raise ForecasterError(
            f"need 0 < train minutes <= {n - horizon - 1} for a {n}-minute series, "
            f"got {train_minutes}"
        )
    started = time.perf_counter()
    model.fit(history.head(train_minutes))
    fit_seconds = time.perf_counter() - started
    origins = np.arange(train_minutes - 1, n - horizon, max(1, stride))
    truth = history.values[origins[:, None] + np.arange(1, horizon + 1)[None, :]]
    origins, truth = origins[np.isfinite(truth).any(axis=1)], truth[np.isfinite(truth).any(axis=1)]
    forecasts = np.empty_like(truth)
    started = time.perf_counter()
    for i, o in enumerate(origins):
        forecasts[i] = model.forecast(history.head(int(o) + 1), horizon)
    per_call = (time.perf_counter() - started) / max(1, origins.size) * 1000
    return Run(origins, forecasts, truth, fit_seconds, per_call)


def score(name: str, run: Run) -> Score:
    f, y = run.forecasts, run.truth
    ok = np.isfinite(y)
    pos = ok & (y > 0)
    err = f[ok] - y[ok]
    rel = (f[pos] - y[pos]) / y[pos]
    return Score(
        model=name,
        mape=float(np.mean(np.abs(rel)) * 100) if rel.size else float("nan"),
        rmse=float(np.sqrt(np.mean(err**2))),
        under_rate=float(np.mean(err < 0) * 100),
        over_provision=float(np.mean(np.maximum(rel, 0)) * 100) if rel.size else float("nan"),
        shortfall=float(np.mean(np.maximum(-rel, 0)) * 100) if rel.size else float("nan"),
        steps=int(ok.sum()),
        origins=int(run.origins.size),
        fit_seconds=run.fit_seconds,
        forecast_ms=run.forecast_ms,
    )


def evaluate(
    history: History,
    models: Sequence[str],
    train_minutes: int,
    horizon: int = 60,
    stride: int = 10,
    params: dict[str, dict[str, Any]] | None = None,
    trace: str = "",
    on_model: Callable[[str], None] | None = None,
) -> Evaluation:
    """Score every model on the same origins; `params[name]` goes to that model's constructor."""
    result = Evaluation(trace, train_minutes, len(history) - train_minutes, horizon, stride)
    for name in models:
        if on_model is not None:
            on_model(name)
        model = create(name, **(params or {}).get(name, {}))
        run = rolling_origin(model, history, train_minutes, horizon, stride)
        result.runs[name] = run
        result.scores.append(score(name, run))
    return result


def plot(evaluation: Evaluation, history: History, path: str | Path) -> Path:
    """PNG of truth vs each model's forecast as the daemon would see it.

    Each origin's first `stride` steps are drawn, so the line is the forecast
    that was current at each minute. Needs matplotlib, imported only here.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ForecasterError("--plot needs matplotlib, which is not installed") from exc
    path = Path(path)
    start = evaluation.train_minutes
    times = history.times[start:]
    fig, ax = plt.subplots(figsize=(14, 5))
    ax.plot(times, history.values[start:], color="black", lw=0.6, label="truth")
    for name, run in evaluation.runs.items():
        k = min(evaluation.stride, evaluation.horizon)
        xs = (run.origins[:, None] + np.arange(1, k + 1)[None, :]).ravel()
        ax.plot(history.times[xs], run.forecasts[:, :k].ravel(), lw=0.8, label=name)
    ax.set_ylabel("max 5 s rate per minute (req/s)")
    ax.set_title(evaluation.trace or "forecast vs truth")
    ax.legend(loc="upper right", ncol=4)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
