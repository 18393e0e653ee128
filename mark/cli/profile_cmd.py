"""`mark profile`: measure T_b of a configured model and tune its batching, on this
machine, or (``--type T``, aws world) on one instance of T launched for it, or (``--spill``)
on the world's spill function, whose batch latency sizes batched spill."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import typer
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from mark.cli.context import (
    SIGTERM_EXIT,
    cancelled_on_sigterm,
    console,
    err_console,
    fail,
    run_async,
    state,
)
from mark.config import ModelSpec, Settings
from mark.ports import Store
from mark.profile_files import LOCAL, ec2_instance_type, this_hardware

if TYPE_CHECKING:
    from bouncer.device import DeviceChoice


def profile(
    ctx: typer.Context,
    model: str | None = typer.Option(None, help="model name (default: the first configured)"),
    batches: str = typer.Option("1,2,4,8,16,32", help="batch sizes to time (this machine)"),
    runs: int = typer.Option(10, min=1, max=1000, help="timed runs per batch size (this machine)"),
    out: Path | None = typer.Option(None, help="where to write the profile (JSON)"),
    device: str | None = typer.Option(
        None,
        help="auto, cpu or cuda, chosen as an agent chooses (default: the CPU with one thread, "
        "as the local world's agents run; this machine)",
    ),
    instance_type: str | None = typer.Option(
        None,
        "--type",
        help="measure on one instance of this type launched for it (world: aws), store the "
        "profile as measured for the type, terminate the instance (also on Ctrl-C or "
        "SIGTERM)",
    ),
    timeout: float | None = typer.Option(
        None,
        min=1,
        help="with --type: seconds to wait for the instance's agent (default: the boot "
        "deadline, timings.boot_deadline_s)",
    ),
    variant: str | None = typer.Option(
        None,
        help="time this variant of the model (this machine) instead of its own artifact, "
        "labelled with the variant's name: the profile file a variant's 'profile' names",
    ),
    spill: bool = typer.Option(
        False,
        "--spill",
        help="time batches on the world's spill function (aws: the deployed function at "
        "aws.spill_memory_mb; local: the local Lambda), round trips included, and add the "
        "entry lambda-<memory>mb to the profile file: with it in the model's profile, spill "
        "goes in batches that finish by their deadlines instead of one request per call",
    ),
) -> None:
    """Time real inference for each batch size (warm-up, median of runs) and tune N/W_batch."""
    settings = state(ctx).settings()
    spec = settings.model(model or settings.models[0].name)
    if variant is not None and (spill or instance_type is not None):
        fail("--variant times a variant on this machine; not with --spill or --type")
    if spill:
        if instance_type is not None or device is not None:
            fail("--spill times the spill function; --type and --device time an instance")
        _on_spill(settings, spec, _sizes(batches), runs, out)
        return
    if instance_type is not None:
        for name in ("batches", "runs", "device"):
            given = ctx.get_parameter_source(name)
            if given is not None and given.name == "COMMANDLINE":
                fail(f"--{name} times this machine; with --type the instance's agent measures")
        _on_type(settings, spec, instance_type, timeout, out)
        return
    if timeout is not None:
        fail("--timeout applies to --type (the wait for a launched instance's agent)")
    import numpy as np

    from bouncer.contract import ContractError
    from bouncer.device import DeviceUnavailable, Requested, probe, select_device
    from bouncer.runner import ModelLoadError, ModelRunner
    from mark.control import resolve_source

    sizes = _sizes(batches)
    if device not in (None, "auto", "cpu", "cuda"):
        fail(f"--device must be auto, cpu or cuda, got {device!r}")
    on_type = ec2_instance_type()
    if on_type is not None and device is None:
        device = "auto"  # as that type's agents choose it, so the profile rates the type
    choice: DeviceChoice | None = None
    try:
        if device is not None:
            choice = select_device(
                probe(), neuron_artifact=spec.neuron_artifact, requested=cast(Requested, device)
            )
            console.print(f"device: {choice.describe()}", markup=False, highlight=False)
        contract = spec.contract(resolve_source(spec, settings.data_dir))
        if variant is not None:
            contract = contract.variant(variant)
        runner = ModelRunner(contract, choice=choice)
    except (ModelLoadError, DeviceUnavailable, ContractError) as exc:
        fail(str(exc))
    label = variant or spec.name
    table: dict[int, float] = {}
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(f"profiling {spec.name}", total=len(sizes) * (runs + 1))
        for b in sizes:
            batch = runner.contract.example(b)
            runner.run(batch)  # warm-up
            bar.advance(task)
            times = []
            for _ in range(runs):
                times.append(runner.timed(batch))  # the device synchronized around it
                bar.advance(task)
            table[b] = float(np.median(times))
    result: dict[str, Any] = {
        "model": label,
        "instance_type": on_type or LOCAL,
        "measured_at": time.time(),
        "batch_latency_s": {str(b): t for b, t in table.items()},
        "hardware": this_hardware(
            choice.describe() if choice is not None else "cpu, 1 intra-op thread",
            _gpu_name(choice),
        ),
    }
    _show(spec, table, f"{label} on {on_type or 'this machine'}", result)
    path = out or settings.data_dir / "profiles" / f"{label}.json"
    _write(path, result)
    if on_type is None:
        console.print(
            f"labelled instance_type {LOCAL!r} (this machine is no EC2 instance): it rates no "
            "instance type. For the aws world, `mark profile --type T` measures on T, or "
            "exploration (planner.explore_unprofiled, on by default) measures each type itself"
        )
    else:
        console.print(f"labelled instance_type {on_type!r}: measured on this EC2 instance")


def _sizes(batches: str) -> list[int]:
    try:
        sizes = sorted({int(b) for b in batches.split(",")})
    except ValueError:
        fail(f"--batches must be comma-separated integers, got {batches!r}")
    if not sizes or sizes[0] < 1:
        fail("--batches needs positive sizes")
    return sizes


def _on_spill(
    settings: Settings, spec: ModelSpec, sizes: list[int], runs: int, out: Path | None
) -> None:
    """``--spill``: time the world's spill function, merge its entry into the profile file."""
    from mark.control import resolve_source
    from mark.errors import MarkError
    from mark.profile_files import spill_profile_type
    from mark.spill_profile import measure_spill, spill_function

    contract = spec.contract(resolve_source(spec, settings.data_dir))
    kind = spill_profile_type(settings.spill_memory_mb)

    async def measure(advance: Callable[[], None]) -> dict[int, float]:
        async with spill_function(settings, spec, contract) as fn:
            return await measure_spill(fn, contract, sizes, runs, advance)

    try:
        with Progress(console=console, transient=True) as bar:
            task = bar.add_task(f"timing {spec.name} on {kind}", total=len(sizes) * (runs + 1))
            table = run_async(cancelled_on_sigterm(measure(lambda: bar.advance(task))))
    except (MarkError, ValueError) as exc:
        fail(f"could not time the spill function: {exc}")
    shown = Table(title=f"{spec.name} on the spill function ({kind}, {settings.world} world)")
    for col in ("batch", "round trip ms", "ms per request"):
        shown.add_column(col, justify="right")
    for b, t in table.items():
        shown.add_row(str(b), f"{t * 1000:.1f}", f"{t * 1000 / b:.1f}")
    console.print(shown)
    entry = {
        "model": spec.name,
        "instance_type": kind,
        "measured_at": time.time(),
        "batch_latency_s": {str(b): t for b, t in table.items()},
        "hardware": {"spill_function": settings.world, "memory_mb": settings.spill_memory_mb},
    }
    path = out or spec.profile or settings.data_dir / "profiles" / f"{spec.name}.json"
    _merge(path, entry)
    if spec.profile is None or path.resolve() != spec.profile.resolve():
        console.print(f"set the model's profile to {path} for its spill to go in batches")


def _merge(path: Path, entry: dict[str, Any]) -> None:
    """Write ``entry`` into the profile file at ``path``, replacing the one of the same
    model and type and keeping the others (an instance profile beside the spill's)."""
    entries: list[dict[str, Any]] = []
    if path.exists():
        try:
            doc = json.loads(path.read_text())
        except ValueError as exc:
            fail(f"{path} is not JSON ({exc}); pass --out to write elsewhere")
        if isinstance(doc, dict) and "schema" in doc:
            fail(f"{path} is the paper's profile file; pass --out to write elsewhere")
        entries = doc if isinstance(doc, list) else doc.get("profiles", [doc])
    key = (entry["model"], entry["instance_type"])
    kept = [e for e in entries if (e.get("model"), e.get("instance_type")) != key]
    _write(path, {"profiles": [*kept, entry]})


def _gpu_name(choice: DeviceChoice | None) -> str | None:
    """The GPU the model ran on, if it ran on one (torch is loaded by then)."""
    if choice is None or not choice.device.startswith("cuda"):
        return None
    try:
        import torch

        return str(torch.cuda.get_device_name(choice.device))
    except Exception:  # a name is a label only: never fail the profile for it
        return None


async def awaiting_profile(store: Store, model: str) -> list[tuple[str, bool]]:
    """The types the model's last plan found no profile for, each with whether an
    instance explores it then (``provisioner.explore_step``); empty before any plan."""
    plans = await store.plans(model, limit=1)
    rows = plans[0].explanation.get("awaiting_profile", []) if plans else []
    return [(str(t), bool(on)) for t, on in rows]


def awaiting_text(rows: Sequence[Sequence[Any]]) -> str:
    """One line for `mark status` and `mark plan --explain`: the types a model awaits a
    profile for (not planned until one is measured), the one explored now marked."""
    shown = ", ".join(f"{t} (exploring now)" if on else str(t) for t, on in rows)
    return f"awaiting a profile (not planned until measured): {shown}"


def _show(spec: ModelSpec, table: dict[int, float], title: str, result: dict[str, Any]) -> None:
    """Print T_b per batch size and the tuned batching; add the batching to ``result``."""
    from provisioner.batching import tune_batching

    shown = Table(title=f"{title} (RT_max {spec.slo.rt_max_ms:g} ms)")
    for col in ("batch", "T_b ms", "requests/s"):
        shown.add_column(col, justify="right")
    for b, t in table.items():
        shown.add_row(str(b), f"{t * 1000:.2f}", f"{b / t:.0f}")
    console.print(shown)
    try:
        cfg = tune_batching(table, spec.slo.rt_max_ms / 1000.0)
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


def _write(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    console.print(f"profile saved to {path}")


def _on_type(
    settings: Settings,
    spec: ModelSpec,
    instance_type: str,
    timeout: float | None,
    out: Path | None,
) -> None:
    """``--type``: check the type, launch one, wait for its agent's profile, store it."""
    from mark.catalog import Market, load_catalog
    from mark.cli.profile_type import measure_on_type
    from mark.control.snapshot import health_config
    from mark.errors import UnknownOffering
    from provisioner.accelerators import usable

    if settings.world != "aws":
        fail(
            f"--type measures on a launched {instance_type} instance, which needs world: aws "
            f"(this is the {settings.world} world, whose agents run on this machine and whose "
            "types are rated by the emulated rule); drop --type to time this machine"
        )
    catalog = load_catalog()
    itype = catalog.types.get(instance_type)
    if itype is None:
        fail(f"unknown instance type {instance_type!r}; `mark catalog` lists the known types")
    offered = [*settings.offerings.types, *settings.offerings.standby_types]
    if instance_type not in offered:
        fail(
            f"{instance_type} is not offered to the planner (offerings.types: "
            f"{', '.join(settings.offerings.types)}; standby_types: "
            f"{', '.join(settings.offerings.standby_types) or 'none'}); add it first"
        )
    try:
        catalog.offering(instance_type, Market.ON_DEMAND)
    except UnknownOffering:
        fail(f"{instance_type} has no on-demand offering in the catalog ({catalog.region})")
    ok, why = usable(itype.accelerator.value, spec.neuron_artifact is not None)
    if not ok:
        fail(f"{spec.name} cannot use {instance_type}: {why}")
    wait_s = timeout or health_config(settings, settings.aws.boot_s, 0.0).boot_deadline_s
    try:
        with console.status(f"launching one {instance_type} for {spec.name}") as status:
            got = run_async(
                cancelled_on_sigterm(
                    measure_on_type(
                        settings,
                        spec,
                        instance_type,
                        catalog,
                        wait_s,
                        lambda text: status.update(text),
                        warn=lambda text: err_console.print(
                            f"[bold yellow]warning:[/] {escape(text)}", highlight=False
                        ),
                    )
                )
            )
    except asyncio.CancelledError:  # SIGTERM: the instance was terminated on the way out
        err_console.print(
            "terminated (SIGTERM); the instance it launched was terminated first, unless a "
            "warning above says otherwise"
        )
        raise typer.Exit(SIGTERM_EXIT) from None
    table = dict(got.latency.points)
    result: dict[str, Any] = {
        "model": spec.name,
        "instance_type": instance_type,
        "measured_at": time.time(),
        "batch_latency_s": {str(b): t for b, t in table.items()},
        "instance_id": got.instance_id,
        "hardware": {"instance_type": instance_type, "measured_by": f"agent on {got.instance_id}"},
    }
    _show(spec, table, f"{spec.name} on {instance_type}", result)
    console.print(
        f"stored as the measured profile of {spec.name} on {instance_type} (measured by the "
        f"agent on {got.instance_id}, ready {got.ready_after_s:.0f} s after launch; terminated)"
    )
    if out is not None:
        _write(out, result)
