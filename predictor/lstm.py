"""LSTM forecaster: direct multi-step forecast of the next `horizon` per-minute maxima.

Why it is built this way:

* Scale. Rates are modelled as log1p(rate) minus the mean of the last
  `level_minutes` ("level"), so one network serves any load level and an
  error is a relative error, which is what provisioning cares about. The
  level itself, standardised with the training statistics, is an input too.
* Season. Web load repeats daily, so the head also sees yesterday's values
  around the same minute (the hour before and the `horizon` after), plus
  time-of-day and day-of-week. With less than a day of history those inputs
  are zero and flagged absent, so the model still forecasts.
* Direct. One forward pass emits all `horizon` steps: no error feedback
  through recursion, and one forecast costs one small LSTM pass.
* Loss. Pinball loss in log space: an under-prediction costs `under_weight`
  times an over-prediction of the same size, i.e. the model learns the
  w/(1+w) quantile. w = 1 is the median (best MAPE); w > 1 trades MAPE for
  fewer under-provisioned minutes.
* Gaps. Missing minutes are interpolated in the inputs (with a flag) and
  masked out of the loss: a gap is never a target.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view
from torch import nn

from predictor.base import (
    MINUTES_PER_DAY,
    FloatArray,
    Forecaster,
    ForecasterError,
    History,
    JsonScalar,
    day_of_week,
    minute_of_day,
)

SEQ_FEATURES = 4  # value - level, imputed flag, sin/cos time of day
TIME_FEATURES = 4  # sin/cos time of day, sin/cos day of week (at the origin)


@contextmanager
def _numerics(n: int) -> Iterator[None]:
    """Use `n` torch threads and no oneDNN inside, restore the caller's settings after.

    oneDNN compiles its LSTM kernels for the CPU it finds (AVX-512 here, AVX2 there), so
    the same seeded fit came out different on different machines, and so did every
    simulated cost after it; without it the LSTM runs on ATen's kernels and MKL, whose
    results do not depend on the vector width once MKL is pinned to its compatible code
    path (``mark.sim.pinned_fit``). The network is small: a fit takes seconds more."""
    before, dnn = torch.get_num_threads(), bool(torch.backends.mkldnn.enabled)
    torch.set_num_threads(n)
    torch.backends.mkldnn.enabled = False  # type: ignore[assignment]  # a ContextProp
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = dnn  # type: ignore[assignment]
        torch.set_num_threads(before)


MIN_LEVEL_STD = 0.1
"""Least spread of the log level the level feature is scaled by: a change of about 10 %
is one unit. On a history of steady load the spread is counting noise (a few %), and a
+50 % surge scaled by it read as tens of units: day-old steady load then a surge made
the forecast jump to 23,000 r/s from 160 (``--trace surge``)."""


class _Net(nn.Module):
    def __init__(self, n_extra: int, hidden: int, horizon: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(SEQ_FEATURES, hidden, batch_first=True)
        self.head = nn.Sequential(
            nn.Linear(hidden + n_extra, 2 * hidden),
            nn.ReLU(),
            nn.Linear(2 * hidden, horizon),
        )

    def forward(self, seq: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
        _, (h, _) = self.lstm(seq)
        out: torch.Tensor = self.head(torch.cat((h[-1], extra), dim=1))
        return out


@dataclass
class _Samples:
    seq: FloatArray  # (n, lookback, SEQ_FEATURES)
    extra: FloatArray  # (n, n_extra)
    target: FloatArray  # (n, horizon), NaN where missing
    level: FloatArray  # (n,)


@dataclass(frozen=True)
class TrainReport:
    """What a fit did, for the CLI and the benchmark."""

    epochs: int
    best_epoch: int
    best_val_loss: float
    seconds: float
    samples: int


class LSTMForecaster(Forecaster):
    """See the module docstring. All knobs are constructor arguments (saved with the model)."""

    name = "lstm"

    def __init__(
        self,
        horizon: int = 60,
        lookback: int = 60,
        hidden: int = 32,
        level_minutes: int = 30,
        under_weight: float = 1.0,
        epochs: int = 30,
        patience: int = 5,
        batch_size: int = 512,
        lr: float = 3e-3,
        val_fraction: float = 0.2,
        seed: int = 0,
        threads: int = 1,
        progress: bool = False,
        min_level_std: float = MIN_LEVEL_STD,
    ) -> None:
        super().__init__()
        if horizon < 1 or lookback < level_minutes or level_minutes < 1:
            raise ValueError("need horizon >= 1 and lookback >= level_minutes >= 1")
        if under_weight <= 0 or not 0 < val_fraction < 1:
            raise ValueError("need under_weight > 0 and 0 < val_fraction < 1")
        self.horizon = horizon
        self.lookback = lookback
        self.hidden = hidden
        self.level_minutes = level_minutes
        self.under_weight = under_weight
        self.epochs = epochs
        self.patience = patience
        self.batch_size = batch_size
        self.lr = lr
        self.val_fraction = val_fraction
        self.seed = seed
        self.threads = threads
        self.progress = progress
        self.min_level_std = min_level_std
        self.level_mean = 0.0
        self.level_std = 1.0
        self.report: TrainReport | None = None
        with _numerics(self.threads):
            torch.manual_seed(seed)
            self.net = _Net(self.n_extra, hidden, horizon)

    @property
    def lag_before(self) -> int:
        """Minutes of yesterday's data before the origin that the head sees."""
        return self.horizon

    @property
    def n_extra(self) -> int:
        return self.lag_before + self.horizon + 1 + TIME_FEATURES + 1

    def params(self) -> dict[str, JsonScalar]:
        keys = [
            *("horizon", "lookback", "hidden", "level_minutes", "under_weight", "epochs"),
            *("patience", "batch_size", "lr", "val_fraction", "seed", "threads"),
            "min_level_std",
        ]
        return {key: getattr(self, key) for key in keys}

    # --- features -----------------------------------------------------------

    def _samples(self, history: History, origins: np.ndarray, with_target: bool) -> _Samples:
        """Features for forecasting after each origin index (the last known minute)."""
        raw = history.values
        z = np.log1p(np.maximum(history.filled(), 0.0))
        imputed = (~np.isfinite(raw)).astype(np.float64)
        n, lb, h = z.shape[0], self.lookback, self.horizon
        # Left-pad so every origin has a full lookback window (padding is flagged imputed).
        pad = lb - 1
        zp = np.concatenate((np.full(pad, z[0]), z))
        ip = np.concatenate((np.ones(pad), imputed))
        win = sliding_window_view(zp, lb)[origins]  # (k, lb)
        flags = sliding_window_view(ip, lb)[origins]
        level = win[:, -self.level_minutes :].mean(axis=1)
        minutes = history.epoch_minutes()
        tod = 2 * np.pi * minute_of_day(minutes) / MINUTES_PER_DAY
        tod_p = np.concatenate((np.zeros(pad), tod))
        tod_win = sliding_window_view(tod_p, lb)[origins]
        seq = np.stack((win - level[:, None], flags, np.sin(tod_win), np.cos(tod_win)), axis=2)

        # Yesterday around the same minute: positions origin - 1440 - lag_before + 1 ... + horizon.
        offs = np.arange(-self.lag_before + 1, h + 1) - MINUTES_PER_DAY
        idx = origins[:, None] + offs[None, :]
        have = (idx[:, 0] >= 0).astype(np.float64)
        lag = np.where(have[:, None] > 0, z[np.clip(idx, 0, n - 1)] - level[:, None], 0.0)
        t0 = minutes[origins]
        tod0 = 2 * np.pi * minute_of_day(t0) / MINUTES_PER_DAY
        dow0 = 2 * np.pi * day_of_week(t0) / 7
        lvl = (level - self.level_mean) / self.level_std
        extra = np.column_stack(
            (lag, have, np.sin(tod0), np.cos(tod0), np.sin(dow0), np.cos(dow0), lvl)
        )
        if with_target:
            tidx = origins[:, None] + np.arange(1, h + 1)[None, :]
            with np.errstate(invalid="ignore"):
                target = np.log1p(raw[tidx]) - level[:, None]
        else:
            target = np.zeros((origins.shape[0], h))
        return _Samples(seq, extra, target, level)

    # --- training -----------------------------------------------------------

    def _loss(self, pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        err = target - pred  # > 0: forecast below truth
        loss = torch.where(err > 0, self.under_weight * err, -err) * mask
        return loss.sum() / mask.sum().clamp(min=1.0)

    def _fit(self, history: History) -> None:
        n = len(history)
        origins = np.arange(self.level_minutes - 1, n - self.horizon)
        if origins.size < 4:
            raise ForecasterError(
                f"lstm needs at least {self.level_minutes + self.horizon + 3} minutes to fit, "
                f"got {n}"
            )
        z = np.log1p(np.maximum(history.filled(), 0.0))
        levels = sliding_window_view(z, self.level_minutes).mean(axis=1)
        self.level_mean = float(levels.mean())
        self.level_std = float(max(levels.std(), self.min_level_std))
        s = self._samples(history, origins, with_target=True)
        keep = np.asarray(np.isfinite(s.target).any(axis=1))
        # Time-ordered split; drop `horizon` origins between so no target is shared.
        n_val = max(1, int(origins.size * self.val_fraction))
        split = origins.size - n_val
        train_idx = np.flatnonzero(keep[: max(1, split - self.horizon)])
        val_idx = split + np.flatnonzero(keep[split:])
        if train_idx.size == 0 or val_idx.size == 0:
            raise ForecasterError("history too short or too gappy to train on")
        with _numerics(self.threads):
            self.report = self._train(s, train_idx, val_idx)

    def _tensors(self, s: _Samples, idx: np.ndarray) -> tuple[torch.Tensor, ...]:
        target = s.target[idx]
        mask = np.isfinite(target)
        return (
            torch.from_numpy(s.seq[idx].astype(np.float32)),
            torch.from_numpy(s.extra[idx].astype(np.float32)),
            torch.from_numpy(np.where(mask, target, 0.0).astype(np.float32)),
            torch.from_numpy(mask.astype(np.float32)),
        )

    def _train(self, s: _Samples, train_idx: np.ndarray, val_idx: np.ndarray) -> TrainReport:
        started = time.perf_counter()
        torch.manual_seed(self.seed)
        rng = np.random.default_rng(self.seed)
        self.net = _Net(self.n_extra, self.hidden, self.horizon)
        opt = torch.optim.Adam(self.net.parameters(), lr=self.lr)
        sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=2)
        tr = self._tensors(s, train_idx)
        va = self._tensors(s, val_idx)
        best = (float("inf"), 0, {k: v.clone() for k, v in self.net.state_dict().items()})
        epoch = 0
        with _progress(self.progress, self.epochs) as advance:
            for epoch in range(1, self.epochs + 1):
                self.net.train()
                order = torch.from_numpy(rng.permutation(train_idx.size))
                for b in range(0, order.numel(), self.batch_size):
                    sel = order[b : b + self.batch_size]
                    opt.zero_grad()
                    loss = self._loss(self.net(tr[0][sel], tr[1][sel]), tr[2][sel], tr[3][sel])
                    loss.backward()  # type: ignore[no-untyped-call]
                    nn.utils.clip_grad_norm_(self.net.parameters(), 1.0)
                    opt.step()
                self.net.eval()
                with torch.no_grad():
                    val = float(self._loss(self.net(va[0], va[1]), va[2], va[3]))
                sched.step(val)
                if val < best[0] - 1e-5:
                    best = (val, epoch, {k: v.clone() for k, v in self.net.state_dict().items()})
                advance(epoch, val, best[0])
                if epoch - best[1] >= self.patience:
                    break
        self.net.load_state_dict(best[2])
        self.net.eval()
        return TrainReport(
            epochs=epoch,
            best_epoch=best[1],
            best_val_loss=best[0],
            seconds=time.perf_counter() - started,
            samples=int(train_idx.size),
        )

    # --- forecasting --------------------------------------------------------

    def _forecast(self, history: History, steps: int) -> FloatArray:
        need = MINUTES_PER_DAY + self.lag_before + self.lookback
        tail = history.tail(need)
        s = self._samples(tail, np.array([len(tail) - 1]), with_target=False)
        with _numerics(self.threads), torch.no_grad():
            out = self.net(
                torch.from_numpy(s.seq.astype(np.float32)),
                torch.from_numpy(s.extra.astype(np.float32)),
            )
        pred = np.expm1(out.numpy()[0].astype(np.float64) + s.level[0])
        if steps <= self.horizon:
            return np.asarray(pred[:steps], dtype=np.float64)
        # Beyond the trained horizon hold the last step: an honest "no more information".
        return np.concatenate((pred, np.full(steps - self.horizon, pred[-1])))

    # --- persistence --------------------------------------------------------

    def get_state(self) -> dict[str, FloatArray]:
        state: dict[str, FloatArray] = {
            f"net.{k}": v.detach().numpy().astype(np.float64)
            for k, v in self.net.state_dict().items()
        }
        state["level_mean"] = np.asarray(self.level_mean)
        state["level_std"] = np.asarray(self.level_std)
        return state

    def set_state(self, state: dict[str, FloatArray]) -> None:
        if float(state["level_std"]) < self.min_level_std:
            raise ForecasterError(
                f"saved with its level scaled by a spread of {float(state['level_std']):.3g}, "
                f"below the {self.min_level_std:g} a fit now uses (a surge after steady load "
                "read as tens of deviations): refit"
            )
        self.level_mean = float(state["level_mean"])
        self.level_std = float(state["level_std"])
        weights = {
            k.removeprefix("net."): torch.from_numpy(np.asarray(v, dtype=np.float32))
            for k, v in state.items()
            if k.startswith("net.")
        }
        self.net.load_state_dict(weights)
        self.net.eval()


@contextmanager
def _progress(enabled: bool, total: int) -> Iterator[Any]:
    """A rich progress bar over epochs, or a no-op."""
    if not enabled:
        yield lambda *_: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    # On stderr, so `--format json` output on stdout stays machine-readable.
    with Progress(
        TextColumn("[bold]training lstm"),
        BarColumn(),
        TextColumn("epoch {task.completed}/{task.total}"),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    ) as bar:
        task = bar.add_task("fit", total=total, status="")

        def advance(epoch: int, val: float, best: float) -> None:
            bar.update(task, completed=epoch, status=f"val {val:.4f} best {best:.4f}")

        yield advance
        bar.update(task, total=bar.tasks[0].completed)
