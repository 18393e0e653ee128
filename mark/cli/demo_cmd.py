"""`mark demo`: build the offline demo model."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, cast

import typer

from mark.cli.context import console

if TYPE_CHECKING:
    from mark.config import Timings

app = typer.Typer(help="The offline demo model (a CNN on scikit-learn's digits).")


@app.command("build")
def build(
    out: Path | None = typer.Option(None, help="where to write the TorchScript file"),
    seed: int = typer.Option(0, help="training seed (same seed, same model)"),
    epochs: int = typer.Option(15, min=1, max=500),
) -> None:
    """Train the demo CNN, print its held-out accuracy, save it as TorchScript."""
    from mark.demo import default_model_path, save_torchscript, train_digits  # imports torch

    path = out or default_model_path()
    with console.status(f"training the digits CNN ({epochs} epochs)..."):
        trained = train_digits(seed=seed, epochs=epochs)
    save_torchscript(trained.model, path)
    console.print(
        f"test accuracy {trained.test_accuracy:.1%} on {trained.test_size} held-out images "
        f"(trained on {trained.train_size}); saved to {path}"
    )


FORECASTERS = ("lstm", "last", "config")
C5_LARGE_T1_MS = 22.0
"""The demo's c5.large: one request of digits x40 in 22 ms, which the planner rates
at ~25 r/s within RT_max 100 ms, so a 60 r/s peak takes a few (mark.demo.ramp)."""


@app.command("ramp")
def ramp(
    ctx: typer.Context,
    profile: str | None = typer.Option(
        None,
        help="rate profile SECONDS:RPS,... (straight lines between points); "
        "default 0:4,60:4,240:60,360:60,480:4,780:4",
    ),
    trace: Path | None = typer.Option(
        None, help="replay a trace file instead of --profile (see --speedup, --scale)"
    ),
    speedup: float = typer.Option(60.0, min=0.001, help="--trace: replay this many times faster"),
    scale: float = typer.Option(1.0, min=0.0001, help="--trace: multiply every rate by this"),
    forecaster: str = typer.Option(
        "lstm",
        help="lstm: trained offline on earlier, jittered repetitions of the same profile shape; "
        "last: repeat the last minute's max; config: the configured predictor untouched "
        "(its cold start is 1.2 x the highest rate seen, so nothing is retired)",
    ),
    update_period: float = typer.Option(
        60.0, min=1.0, help="P_u in seconds (the lstm is trained on per-minute maxima)"
    ),
    cooldown: float = typer.Option(90.0, min=0.0, help="cool-down before retiring (s)"),
    boot_delay: float = typer.Option(5.0, min=0.0, help="local world: launch to agent start (s)"),
    c5_large_t1_ms: float = typer.Option(
        C5_LARGE_T1_MS,
        min=0.01,
        help="the emulated c5.large's time for one request; the slowdown is this over the "
        "time measured on this machine, so the demo means the same on a fast or slow machine",
    ),
    slowdown: float | None = typer.Option(
        None, min=1.0, help="c5.large emulated this many times slower (overrides the above)"
    ),
    plain_model: bool = typer.Option(
        False,
        "--plain-model",
        help="serve the plain digits CNN instead of digits x40 (same answers, more real "
        "compute per call)",
    ),
    api: str = typer.Option("v2", help="v1 (TF-Serving) or v2 (Open Inference Protocol)"),
    seed: int = typer.Option(0, help="seed of the arrivals (and of the lstm's training data)"),
    out: Path = typer.Option(
        Path("ramp-demo"), help="directory for ramp.png, timeline.md and the run's store ramp.db"
    ),
    align: bool = typer.Option(
        True,
        help="start the daemon just before a minute boundary, so P_u = 60 s steps fall "
        "just after the minutes the forecaster is trained on",
    ),
) -> None:
    """Ramp load up and down against the local world and show what the control loop did.

    Starts the daemon in-process (embedded moto EC2, agent processes, local
    Lambda) with demo timings: one instance type (c5.large, slowed so a few of
    them carry the ramp), τ = P_u, a short cool-down, the 60 s EC2 billing
    minimum kept. The model served is the digits CNN evaluated 40 times per
    call (same answers), so the emulated instances run close to the speed
    the planner believes.
    An open-loop Poisson load generator follows the profile.
    Then, per control step: forecast, load seen, instances pending/serving and
    the launch/retire decisions from the store; for each launch whether it came
    ahead of the load it was for, for each retirement how long after the load
    fell. The forecaster is never told the schedule. Takes about 14 minutes
    with the defaults.
    """
    from mark.cli.context import SIGTERM_EXIT, cancelled_on_sigterm, fail, run_async, state
    from mark.config import parse_overrides
    from mark.daemon import start, stop  # torch and the cloud adapters: only when run
    from mark.demo.loadgen import Api, rich_progress
    from mark.demo.ramp import (
        DEFAULT_PROFILE,
        ForecasterChoice,
        forecaster_overrides,
        prepare_forecaster,
        run_ramp,
    )
    from mark.demo.ramp_report import format_report, plot
    from mark.demo.ramp_settings import RampSettings, fresh_store, use_demo_model
    from mark.demo.rate_profile import LoadgenError, RateProfile

    if forecaster not in FORECASTERS:
        fail(f"--forecaster {forecaster!r} is not known; allowed: {', '.join(FORECASTERS)}")
    if api not in ("v1", "v2"):
        fail(f"--api {api!r} is not known; allowed: v1, v2")
    try:
        shape = RateProfile.from_options(profile, trace, speedup, scale, DEFAULT_PROFILE)
    except LoadgenError as exc:
        fail(str(exc))
    cli = state(ctx)
    db = fresh_store(out)
    layers = RampSettings.for_run(
        cli.config_file,
        parse_overrides(cli.overrides),
        database=db,
        update_period_s=update_period,
        cooldown_s=cooldown,
        boot_delay_s=boot_delay,
        slowdown=slowdown,
        plain_model=plain_model,
    )
    settings = layers.load()
    if settings.world != "local":
        fail(f"the ramp demo runs in the local world, not {settings.world!r}")
    with console.status(f"preparing the forecaster ({forecaster})..."):
        use_demo_model(settings)
        if slowdown is None:
            slowdown, measured = layers.calibrate(settings, c5_large_t1_ms / 1000.0)
            console.print(
                f"digits on this machine: T_1 {measured * 1000:.2f} ms; c5.large emulated at "
                f"{c5_large_t1_ms:g} ms, {slowdown:.1f}x slower",
                highlight=False,
            )
            settings = layers.load()
        model_file = prepare_forecaster(
            cast("ForecasterChoice", forecaster),
            shape,
            settings.data_dir,
            settings.timings.window_steps,
            seed,
        )
    if model_file is not None:
        layers.add(forecaster_overrides(model_file))
        settings = layers.load()
    t = settings.timings
    console.print(
        f"profile {shape} ({shape.duration:.0f} s, ~{shape.expected_requests():.0f} requests); "
        f"P_u {t.update_period_s:g} s, τ {_lead(t)}, cool-down {_cooldown(t)}, "
        f"billing minimum {t.billing_minimum_s:g} s, boot delay {settings.local.boot_delay_s:g} s; "
        f"forecaster {forecaster}" + (f" ({model_file})" if model_file else ""),
        highlight=False,
    )
    if align:
        console.print("starting the daemon just before a minute boundary...")
    bar, advance = rich_progress(shape.duration, shape)
    try:
        with bar:
            result = run_async(
                cancelled_on_sigterm(
                    run_ramp(
                        settings,
                        shape,
                        start=start,
                        stop=stop,
                        seed=seed,
                        api=cast("Api", api),
                        align_start_second=57.0 if align else None,
                        progress=advance,
                    )
                )
            )
    except asyncio.CancelledError:  # SIGTERM: every child is stopped by now
        console.print("terminated; the daemon and its children are stopped", highlight=False)
        raise typer.Exit(SIGTERM_EXIT) from None
    assert result.load.summary is not None
    for line in result.load.summary.lines():
        console.print(line, highlight=False)
    report = format_report(result)
    console.print(report, highlight=False, soft_wrap=True)
    (out / "timeline.md").write_text(report + "\n")
    png = plot(result, out / "ramp.png")
    console.print(f"wrote {png}, {out / 'timeline.md'} and the store {db}", highlight=False)


@app.command("load")
def load(
    ctx: typer.Context,
    url: str = typer.Argument(..., help="the daemon's base URL, e.g. http://127.0.0.1:8080"),
    model: str = typer.Option("digits", help="model name (its input is read from /v2/models)"),
    profile: str | None = typer.Option(
        None, help="rate profile SECONDS:RPS,... (default 0:5,30:20,60:5)"
    ),
    trace: Path | None = typer.Option(None, help="replay a trace file instead of --profile"),
    speedup: float = typer.Option(60.0, min=0.001, help="--trace: replay this many times faster"),
    scale: float = typer.Option(1.0, min=0.0001, help="--trace: multiply every rate by this"),
    api: str = typer.Option("v2", help="v1 (TF-Serving) or v2 (Open Inference Protocol)"),
    seed: int = typer.Option(0, help="seed of the arrivals and the random inputs"),
    api_key: str | None = typer.Option(
        None,
        "--api-key",
        help="the API key to send (default: MARK_API_KEY, else the one `mark up` saved in "
        "<data_dir>/api-key)",
    ),
) -> None:
    """Open-loop Poisson load against a running daemon (e.g. `mark up`), then a summary.

    Requests go out on schedule whether or not earlier ones have been answered,
    so an overloaded server shows as latency and errors, not as a slower client.
    Which instance served each request is reported to admin keys only.
    """
    from mark.cli.context import fail, run_async, state
    from mark.demo.loadgen import Api, find_api_key, rich_progress, run_load
    from mark.demo.rate_profile import LoadgenError, RateProfile

    if api not in ("v1", "v2"):
        fail(f"--api {api!r} is not known; allowed: v1, v2")
    key = api_key or find_api_key(state(ctx).settings().data_dir)
    try:
        shape = RateProfile.from_options(profile, trace, speedup, scale, "0:5,30:20,60:5")
        bar, advance = rich_progress(shape.duration, shape)
        with bar:
            result = run_async(
                run_load(
                    url,
                    model,
                    shape,
                    api=cast("Api", api),
                    seed=seed,
                    progress=advance,
                    api_key=key,
                )
            )
    except LoadgenError as exc:
        fail(str(exc))
    assert result.summary is not None
    for line in result.summary.lines():
        console.print(line, highlight=False)


def _lead(t: Timings) -> str:
    return f"{t.lead_time_s:g} s" if t.lead_time_s is not None else "the boot time"


def _cooldown(t: Timings) -> str:
    return f"{t.cooldown_s:g} s" if t.cooldown_s is not None else "the boot time"
