"""`mark profile`: measure T_b of a configured model on this machine and tune its batching."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import cast

import typer
from rich.progress import Progress
from rich.table import Table

from mark.cli.context import console, fail, state


def profile(
    ctx: typer.Context,
    model: str | None = typer.Option(None, help="model name (default: the first configured)"),
    batches: str = typer.Option("1,2,4,8,16,32", help="batch sizes to time"),
    runs: int = typer.Option(10, min=1, max=1000, help="timed runs per batch size"),
    out: Path | None = typer.Option(None, help="where to write the profile (JSON)"),
    device: str | None = typer.Option(
        None,
        help="auto, cpu or cuda, chosen as an agent chooses (default: the CPU with one thread, "
        "as the local world's agents run)",
    ),
) -> None:
    """Time real inference for each batch size (warm-up, median of runs) and tune N/W_batch."""
    import numpy as np

    from bouncer.device import DeviceChoice, DeviceUnavailable, Requested, probe, select_device
    from bouncer.runner import ModelLoadError, ModelRunner
    from mark.control import resolve_source
    from provisioner.batching import tune_batching

    settings = state(ctx).settings()
    spec = settings.model(model or settings.models[0].name)
    try:
        sizes = sorted({int(b) for b in batches.split(",")})
    except ValueError:
        fail(f"--batches must be comma-separated integers, got {batches!r}")
    if not sizes or sizes[0] < 1:
        fail("--batches needs positive sizes")
    if device not in (None, "auto", "cpu", "cuda"):
        fail(f"--device must be auto, cpu or cuda, got {device!r}")
    choice: DeviceChoice | None = None
    try:
        if device is not None:
            choice = select_device(
                probe(), neuron_artifact=spec.neuron_artifact, requested=cast(Requested, device)
            )
            console.print(f"device: {choice.describe()}", markup=False, highlight=False)
        runner = ModelRunner(resolve_source(spec, settings.data_dir), choice=choice)
    except (ModelLoadError, DeviceUnavailable) as exc:
        fail(str(exc))
    example = np.zeros(spec.input.shape, dtype=spec.input.dtype)
    table: dict[int, float] = {}
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(f"profiling {spec.name}", total=len(sizes) * (runs + 1))
        for b in sizes:
            batch = np.repeat(example[None, ...], b, axis=0)
            runner.run(batch)  # warm-up
            bar.advance(task)
            times = []
            for _ in range(runs):
                times.append(runner.timed(batch))  # the device synchronized around it
                bar.advance(task)
            table[b] = float(np.median(times))
    rt_max_s = spec.slo.rt_max_ms / 1000.0
    result = {
        "model": spec.name,
        "instance_type": "local",
        "measured_at": time.time(),
        "batch_latency_s": {str(b): t for b, t in table.items()},
    }
    shown = Table(title=f"{spec.name} on this machine (RT_max {spec.slo.rt_max_ms:g} ms)")
    for col in ("batch", "T_b ms", "requests/s"):
        shown.add_column(col, justify="right")
    for b, t in table.items():
        shown.add_row(str(b), f"{t * 1000:.2f}", f"{b / t:.0f}")
    console.print(shown)
    try:
        cfg = tune_batching(table, rt_max_s)
        result["n_batch"], result["w_batch_s"], result["mu_star"] = (
            cfg.n_batch,
            cfg.w_batch_s,
            cfg.mu_star,
        )
        console.print(
            f"batching: N_batch {cfg.n_batch}, W_batch {cfg.w_batch_s * 1000:.1f} ms, "
            f"μ* {cfg.mu_star:.0f} requests/s (no batching: {cfg.mu_nb:.0f})"
        )
    except ValueError as exc:
        console.print(f"batching: none ({exc})")
    path = out or settings.data_dir / "profiles" / f"{spec.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    console.print(f"profile saved to {path}")
