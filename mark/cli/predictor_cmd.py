"""`mark predictor`: train a workload forecaster and evaluate forecasters on a trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from mark.cli.context import console, err_console, fail
from predictor.base import MINUTES_PER_DAY, ForecasterError, History
from predictor.evaluate import Evaluation, evaluate, plot
from predictor.registry import BUILTIN, NAIVE, create, resolve

app = typer.Typer(
    help=(
        "Train and evaluate workload forecasters. They forecast the maximum 5 s request rate "
        "of each of the next 60 minutes (MArk §4.2). A trace is 'twitter' or 'nab' (shipped), "
        "a 'second,requests' CSV (optionally .gz), a NAB 'timestamp,value' CSV, or 'mmpp' for "
        "generated bursty load."
    ),
    no_args_is_help=True,
)

DEFAULT_MODELS = "last,seasonal,seasonal-week,paper,ets,sarima,lstm"
MMPP_TRAIN_DAYS = 1.0  # the paper trains on 24 h of MMPP load

TRACE_HELP = (
    "twitter | nab (the shipped traces), a trace file, or 'mmpp' for the seeded "
    "Markov-modulated Poisson generator"
)
SEED_HELP = "seed of the model (and of the generator with --trace mmpp)"
UNDER_HELP = "lstm: cost of under- vs over-prediction (1 = median; >1 fewer short minutes)"


def _history(trace: str, seed: int, mmpp_days: float) -> tuple[History, str]:
    if trace == "mmpp":
        from predictor.mmpp import mmpp_history

        if mmpp_days <= 0:
            raise typer.BadParameter("must be > 0", param_hint="--mmpp-days")
        return mmpp_history(mmpp_days, seed), f"mmpp({mmpp_days:g} days, seed {seed})"
    from predictor.traces import load_trace

    return load_trace(trace), Path(trace).name


def _params(model: str, seed: int, under_weight: float | None, progress: bool) -> dict[str, Any]:
    """Constructor arguments the CLI controls; only models that take them get them."""
    if BUILTIN.get(model) != BUILTIN["lstm"]:
        return {}
    out: dict[str, Any] = {"seed": seed, "progress": progress}
    if under_weight is not None:
        out["under_weight"] = under_weight
    return out


def _check_under_weight(under_weight: float | None) -> None:
    if under_weight is not None and not under_weight > 0:
        raise typer.BadParameter("must be > 0", param_hint="--under-weight")


def _minutes(days: float | None, default: float, history: History, flag: str) -> int:
    minutes = round((default if days is None else days) * MINUTES_PER_DAY)
    if minutes <= 0:
        raise typer.BadParameter("must be > 0", param_hint=flag)
    if minutes > len(history):
        have = len(history) / MINUTES_PER_DAY
        raise typer.BadParameter(f"the trace has only {have:.2f} days", param_hint=flag)
    return minutes


@app.command("train")
def train(
    trace: str = typer.Option(..., "--trace", help=TRACE_HELP),
    model: str = typer.Option("lstm", "--model", help="built-in name or 'pkg.module:Class'"),
    out: Path | None = typer.Option(None, "--out", help="model file (default: ./<model>.npz)"),
    train_days: float | None = typer.Option(
        None, "--train-days", help="fit on the first N days (default: all of it)"
    ),
    under_weight: float | None = typer.Option(None, "--under-weight", help=UNDER_HELP),
    seed: int = typer.Option(0, "--seed", help=SEED_HELP),
    mmpp_days: float = typer.Option(2.0, "--mmpp-days", help="days to generate with mmpp"),
) -> None:
    """Fit one model on a trace and save it (an .npz file; load with predictor.registry.load)."""
    _check_under_weight(under_weight)
    try:
        resolve(model)
        history, label = _history(trace, seed, mmpp_days)
        n = _minutes(train_days, len(history) / MINUTES_PER_DAY, history, "--train-days")
        forecaster = create(model, **_params(model, seed, under_weight, progress=True))
        forecaster.fit(history.head(n))
        path = forecaster.save(out or Path(f"{model.replace(':', '_')}.npz"))
    except ForecasterError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write the model: {exc}")
    report = getattr(forecaster, "report", None)
    if report is not None:
        console.print(
            f"trained in {report.seconds:.1f} s: {report.epochs} epochs, best at epoch "
            f"{report.best_epoch} (validation loss {report.best_val_loss:.4f}), "
            f"{report.samples} training windows"
        )
    size = path.stat().st_size / 1024
    console.print(f"{model} fitted on {n} minutes of {label}; saved to {path} ({size:.0f} KiB)")


@app.command("evaluate")
def evaluate_cmd(
    trace: str = typer.Option(..., "--trace", help=TRACE_HELP),
    models: str = typer.Option(DEFAULT_MODELS, "--models", help="comma-separated model names"),
    train_days: float | None = typer.Option(
        None, "--train-days", help="fit on the first N days, test on the rest [10; 1 for mmpp]"
    ),
    horizon: int = typer.Option(60, "--horizon", min=1, help="steps forecast from each origin"),
    stride: int = typer.Option(10, "--stride", min=1, help="minutes between forecast origins"),
    output: str = typer.Option("table", "--format", help="table or json"),
    plot_path: Path | None = typer.Option(None, "--plot", help="also write a PNG of the forecasts"),
    under_weight: float | None = typer.Option(None, "--under-weight", help=UNDER_HELP),
    seed: int = typer.Option(0, "--seed", help=SEED_HELP),
    mmpp_days: float = typer.Option(2.0, "--mmpp-days", help="days to generate with mmpp"),
) -> None:
    """Rolling-origin evaluation: fit each model on the head, score its forecasts on the tail."""
    if output not in ("table", "json"):
        raise typer.BadParameter("must be 'table' or 'json'", param_hint="--format")
    names = [m.strip() for m in models.split(",") if m.strip()]
    if not names:
        raise typer.BadParameter("name at least one model", param_hint="--models")
    _check_under_weight(under_weight)
    if plot_path is not None:
        _require_matplotlib()
    try:
        for name in names:
            resolve(name)
        history, label = _history(trace, seed, mmpp_days)
        default = MMPP_TRAIN_DAYS if trace == "mmpp" else 10.0
        n = _minutes(train_days, default, history, "--train-days")
        params = {m: _params(m, seed, under_weight, progress=output == "table") for m in names}
        result = evaluate(
            history,
            names,
            n,
            horizon=horizon,
            stride=stride,
            params=params,
            trace=label,
            on_model=lambda m: err_console.print(f"fitting and evaluating {m} ..."),
        )
        if plot_path is not None:
            plot(result, history, plot_path)
    except ForecasterError as exc:
        fail(str(exc))
    if output == "json":
        typer.echo(json.dumps(result.as_dict(), indent=2))
    else:
        console.print(_table(result))
        _print_verdict(result)
    if plot_path is not None:
        err_console.print(f"plot written to {plot_path}")


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        msg = "needs matplotlib, which is not installed"
        raise typer.BadParameter(msg, param_hint="--plot") from exc


def _table(result: Evaluation) -> Table:
    days = result.test_minutes / MINUTES_PER_DAY
    table = Table(
        title=(
            f"{result.trace}: fit on {result.train_minutes / MINUTES_PER_DAY:g} days, "
            f"{result.horizon}-step forecasts every {result.stride} min over {days:.2f} days"
        )
    )
    for col in ("model", "MAPE %", "RMSE req/s", "under %", "over-prov %", "shortfall %"):
        table.add_column(col, justify="left" if col == "model" else "right")
    table.add_column("fit s", justify="right")
    table.add_column("ms/forecast", justify="right")
    for s in result.scores:
        table.add_row(
            s.model,
            f"{s.mape:.2f}",
            f"{s.rmse:.2f}",
            f"{s.under_rate:.1f}",
            f"{s.over_provision:.2f}",
            f"{s.shortfall:.2f}",
            f"{s.fit_seconds:.1f}",
            f"{s.forecast_ms:.2f}",
        )
    return table


def _print_verdict(result: Evaluation) -> None:
    best = result.best_naive()
    if best is None:
        return
    for s in result.scores:
        gain = result.mape_gain(s.model)
        if s.model not in NAIVE and gain is not None:
            way = "lower" if gain >= 0 else "higher"
            console.print(
                f"{s.model}: MAPE {s.mape:.2f}% is {abs(gain):.1f}% {way} than the best naive "
                f"model's ({best.model}, {best.mape:.2f}%); it under-predicts "
                f"{s.under_rate:.1f}% of steps"
            )
