"""`mark catalog`: the offerings mark may buy, with their prices."""

from __future__ import annotations

import csv
import io
import json
from enum import StrEnum
from typing import Any, Literal

import typer
from rich.table import Table

from mark.catalog import Accelerator, Market, Offering, load_catalog
from mark.cli.context import console, fail


class Format(StrEnum):
    TABLE = "table"
    JSON = "json"
    CSV = "csv"


FIELDS = (
    "instance_type",
    "market",
    "price_per_hour",
    "discount",
    "vcpus",
    "memory_gib",
    "accelerator",
    "accelerator_detail",
    "burstable",
    "arch",
)


def _row(o: Offering, on_demand: float | None) -> dict[str, Any]:
    t = o.instance_type
    return {
        "instance_type": t.name,
        "market": o.market.value,
        "price_per_hour": o.price_per_hour,
        "discount": None if on_demand is None else round(1 - o.price_per_hour / on_demand, 4),
        "vcpus": t.vcpus,
        "memory_gib": round(t.memory_mib / 1024, 2),
        "accelerator": t.accelerator.value,
        "accelerator_detail": t.gpu_model
        or (f"{t.neuron_cores} NeuronCores" if t.neuron_cores else None),
        "burstable": t.burstable,
        "arch": t.arch,
    }


def catalog(
    accelerator: Accelerator | None = typer.Option(None, help="cpu, gpu, inferentia or trainium"),
    market: Market | None = typer.Option(None, help="on-demand or spot"),
    family: list[str] = typer.Option([], help="instance family, e.g. c5 (repeatable)"),
    instance_type: list[str] = typer.Option([], "--type", help="exact type, e.g. c5.large"),
    burstable: bool | None = typer.Option(None, "--burstable/--not-burstable"),
    arch: str | None = typer.Option(None, help="x86_64 or arm64"),
    max_price: float | None = typer.Option(None, min=0, help="USD per hour"),
    fmt: Format = typer.Option(Format.TABLE, "--format", help="table, json or csv"),
) -> None:
    """List offerings (instance type × market) with hardware and us-east-1 prices."""
    cat = load_catalog()
    for t in instance_type:
        if t not in cat.types:
            fail(f"unknown instance type {t!r}; try `mark catalog --family {t.split('.')[0]}`")
    offers = cat.offerings().compatible(
        accelerator=accelerator,
        market=market,
        burstable=burstable,
        families=family or None,
        arch=arch,
    )
    if instance_type:
        offers = offers.of_types(instance_type)
    if max_price is not None:
        offers = type(offers)(o for o in offers if o.price_per_hour <= max_price)
    rows = [_row(o, cat.on_demand.get(o.type_name)) for o in offers]
    if fmt is Format.JSON:
        typer.echo(json.dumps(rows, indent=1))
        return
    if fmt is Format.CSV:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
        typer.echo(buf.getvalue(), nl=False)
        return
    if not rows:
        fail("no offering matches these filters", code=1)
    table = Table(title=f"{len(rows)} offerings in {cat.region} (USD per hour)")
    columns: list[tuple[str, Literal["left", "right"]]] = [
        ("type", "left"),
        ("market", "left"),
        ("$/h", "right"),
        ("vs on-demand", "right"),
        ("vCPU", "right"),
        ("GiB", "right"),
        ("accelerator", "left"),
        ("burstable", "left"),
    ]
    for col, justify in columns:
        table.add_column(col, justify=justify)
    for r in rows:
        acc = str(r["accelerator"])
        if r["accelerator_detail"]:
            acc += f" ({r['accelerator_detail']})"
        disc = r["discount"]
        table.add_row(
            str(r["instance_type"]),
            str(r["market"]),
            f"{r['price_per_hour']:.4f}",
            "" if disc is None or r["market"] == "on-demand" else f"-{disc:.0%}",
            str(r["vcpus"]),
            f"{r['memory_gib']:g}",
            acc,
            "yes" if r["burstable"] else "",
        )
    console.print(table)
