"""`mark report`: what serving cost, by model, type, component and day, and what the
paper's SageMaker baseline would have cost for the same load (at ml.* hosting prices)."""

from __future__ import annotations

import json
import time
from datetime import UTC, date, datetime, timedelta
from enum import StrEnum
from pathlib import Path

import typer

from mark.catalog import Market, load_catalog, load_hosting_prices
from mark.cli.context import console, err_console, fail, run_async, state
from mark.config import Settings
from mark.errors import UnknownOffering
from mark.report.collect import StoreData, read_store
from mark.report.counterfactual import Counterfactual, target_tracking_cost
from mark.report.render import as_dict, build_report, plot, print_report, to_csv
from mark.state import open_store


class Format(StrEnum):
    TABLE = "table"
    JSON = "json"
    CSV = "csv"


def parse_when(text: str, *, option: str, end_of_day: bool = False) -> float:
    """An ISO date (midnight UTC; with ``end_of_day``, the next midnight) or an ISO
    datetime (UTC unless it carries an offset) as epoch seconds."""
    try:
        d = date.fromisoformat(text)
    except ValueError:
        pass
    else:
        start = datetime(d.year, d.month, d.day, tzinfo=UTC)
        return (start + timedelta(days=1 if end_of_day else 0)).timestamp()
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        fail(
            f"{option} {text!r} is not an ISO date or datetime; "
            "e.g. 2024-05-01 or 2024-05-01T13:30 (UTC)"
        )
    return (dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)).timestamp()


def _counterfactuals(
    settings: Settings,
    data: StoreData,
    models: list[str],
    instance_type: str,
    rps: float | None,
    over_provision: float,
) -> tuple[list[Counterfactual], list[str]]:
    from mark.report.capacity import NoCapacity, baseline_capacity, boot_s

    catalog = load_catalog()
    out: list[Counterfactual] = []
    notes: list[str] = []
    prices = load_hosting_prices()
    try:
        hosting = prices.price(instance_type)
    except UnknownOffering as exc:
        priced = ", ".join(prices.offered())
        return [], [f"no counterfactual: {exc}; give --baseline-type (priced: {priced})"]
    price = hosting.price_per_hour
    price_source = hosting.rule if hosting.derived and hosting.rule else hosting.source
    for name in models:
        windows = data.arrivals.get(name, [])
        if not windows:
            notes.append(f"no counterfactual for {name}: no load recorded in this period")
            continue
        if rps is not None:
            capacity, source = rps, "--baseline-rps"
        else:
            try:
                capacity, source = baseline_capacity(
                    settings, settings.model(name), instance_type, catalog
                )
            except NoCapacity as exc:
                notes.append(f"no counterfactual for {name}: {exc}")
                continue
        cf = target_tracking_cost(
            name,
            windows,
            instance_type=instance_type,
            price_per_hour=price,
            capacity_rps=capacity,
            capacity_source=source,
            boot_s=boot_s(settings),
            over_provision=over_provision,
            price_source=price_source,
        )
        if cf is not None:
            out.append(cf)
    return out, notes


def report(
    ctx: typer.Context,
    since: str | None = typer.Option(
        None, help="start (UTC): ISO date 2024-05-01 or datetime 2024-05-01T13:30[Z|+hh:mm]"
    ),
    until: str | None = typer.Option(
        None, help="end, exclusive (UTC); a date means the end of that day (default: now)"
    ),
    model: str | None = typer.Option(None, help="one model (default: every model)"),
    fmt: Format = typer.Option(Format.TABLE, "--format", help="table, json or csv"),
    plot_path: Path | None = typer.Option(
        None, "--plot", dir_okay=False, help="write a PNG of cost over time by component"
    ),
    baseline_type: str | None = typer.Option(
        None,
        help="EC2 type of the SageMaker baseline's ml.* instance, e.g. c5.large for "
        "ml.c5.large (default: the first offering type); it needs an ml.* hosting price",
    ),
    baseline_rps: float | None = typer.Option(
        None,
        min=0.001,
        help="requests/s one baseline instance sustains (default: as the controller plans)",
    ),
    over_provision: float = typer.Option(2.0, min=1.0, help="the baseline's over-provisioning"),
    no_baseline: bool = typer.Option(False, "--no-baseline", help="skip the counterfactual"),
) -> None:
    """Cost from the ledger by day, model, instance type and component (on-demand, spot,
    standby, lambda, lambda-on-pc, lambda-pc), with the same load priced under
    SageMaker-style target tracking.

    EC2 is billed per second with a 60 s minimum per start; Lambda per GB-second plus a
    fee per request; the spill function's provisioned concurrency (lambda-pc) per
    GB-second configured, in 5-minute steps, and the invocations it served (lambda-on-pc)
    at its lower duration rate. A charge counts on the UTC day, and in the period, its run starts.
    Runs the ledger lacks are priced from the instances' state changes: standby runs,
    and runs of instances the store still lists as live, charged up to --until (or now)
    and shown as "accruing". In the local world those instances ended when the daemon
    stopped, so give --until to price a finished local run.

    The counterfactual replays the requests recorded per minute through SageMaker
    target tracking on ml.<--baseline-type> (target = capacity × 60 / over-provision
    invocations per instance per minute, 3 minutes to scale out, 15 to scale in, 300 s
    cooldowns from when the scaling completes, the metric seen 60 s after its minute),
    with the capacity the controller plans with (a profile saved by `mark profile`, or
    measured now), priced at SageMaker's ml.* real-time hosting price of the type (cited
    or derived; see mark/catalog/data/README.md).
    """
    settings = state(ctx).settings()
    now = time.time()
    lo = None if since is None else parse_when(since, option="--since")
    hi = now if until is None else parse_when(until, option="--until", end_of_day=True)
    if lo is not None and lo >= hi:
        fail(f"--since ({since}) must be before --until ({until or 'now'})")
    itype = baseline_type or settings.offerings.types[0]
    if not no_baseline:
        try:
            load_catalog().offering(itype, Market.ON_DEMAND)
            if baseline_type is not None:
                load_hosting_prices().price(itype)
        except UnknownOffering as exc:
            fail(f"--baseline-type: {exc}")
    configured = [m.name for m in settings.models]
    models = configured if model is None else [m for m in configured if m == model]
    if model is not None and not models:
        err_console.print(f"{model!r} is not configured: no counterfactual for it")

    async def go() -> StoreData:
        store = await open_store(settings.db_url)
        try:
            return await read_store(
                store,
                since=lo,
                until=hi,
                model=model,
                arrival_models=[] if no_baseline else models,
            )
        finally:
            await store.close()

    data = run_async(go())
    cfs, notes = ([], []) if no_baseline else _counterfactuals(
        settings, data, models, itype, baseline_rps, over_provision
    )  # fmt: skip
    end = min(hi, now)  # nothing accrues in the future
    result = build_report(
        data.charges(lo, end, settings.offerings.volume_gb, load_catalog().ebs_gb_month),
        since=lo,
        until=end,
        counterfactuals=cfs,
        notes=notes,
    )
    if fmt is Format.JSON:
        typer.echo(json.dumps(as_dict(result), indent=1))
    elif fmt is Format.CSV:
        typer.echo(to_csv(result), nl=False)
    else:
        print_report(console, result)
    if plot_path is not None:
        plot(result, plot_path)
        err_console.print(f"plot written to {plot_path}", highlight=False)
