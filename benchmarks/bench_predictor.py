"""Time the LSTM forecaster: training on 10 days of per-minute data, and one forecast call.

Targets (issue 5): training under 3 minutes on the 2-core dev machine, one
forecast under 20 ms. Training uses the model's defaults (one torch thread);
forecasts are timed from 200 different origins in the last 4 days, each
call given the full history up to its origin, as the control loop would.

    nice -n 10 .venv/bin/python benchmarks/bench_predictor.py [TRACE] [--seed N] [--epochs N]

TRACE defaults to the Twitter dev trace the package ships; 'mmpp' generates 14 days.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from predictor.base import MINUTES_PER_DAY, History
from predictor.lstm import LSTMForecaster

DEFAULT_TRACE = "twitter"  # a name load_trace resolves to the shipped file


def load(trace: str) -> History:
    if trace == "mmpp":
        from predictor.mmpp import mmpp_history

        return mmpp_history(14.0, seed=0)
    from predictor.traces import load_trace

    return load_trace(trace)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", default=DEFAULT_TRACE)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=None, help="default: the model's own")
    args = parser.parse_args()

    history = load(args.trace)
    train = history.head(10 * MINUTES_PER_DAY)
    model = LSTMForecaster(seed=args.seed, **({"epochs": args.epochs} if args.epochs else {}))
    started = time.perf_counter()
    model.fit(train)
    train_s = time.perf_counter() - started
    report = model.report
    assert report is not None
    print(
        f"training on {len(train)} minutes (10 days): {train_s:.1f} s "
        f"({report.epochs} epochs, best {report.best_epoch}, {report.samples} windows; "
        f"target < 180 s)"
    )

    origins = np.linspace(len(train), len(history) - 1, args.calls).astype(int)
    model.forecast(history.head(int(origins[0])), 60)  # warm-up
    times = []
    for o in origins:
        h = history.head(int(o))
        t = time.perf_counter()
        model.forecast(h, 60)
        times.append((time.perf_counter() - t) * 1000)
    times.sort()
    p95 = times[int(0.95 * (len(times) - 1))]
    print(
        f"one 60-step forecast: median {statistics.median(times):.2f} ms, p95 {p95:.2f} ms, "
        f"max {times[-1]:.2f} ms over {len(times)} calls (target < 20 ms)"
    )


if __name__ == "__main__":
    main()
