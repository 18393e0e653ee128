"""`mark config`: show and check the effective configuration."""

from __future__ import annotations

import json
from enum import StrEnum

import typer
import yaml

from mark.cli.context import console, state
from mark.config import dump_settings

app = typer.Typer(help="Show or check the effective configuration.", no_args_is_help=True)


class Format(StrEnum):
    YAML = "yaml"
    JSON = "json"


@app.command("show")
def show(
    ctx: typer.Context,
    fmt: Format = typer.Option(Format.YAML, "--format", help="yaml or json"),
) -> None:
    """Print the configuration after defaults, the YAML file, MARK_* variables and --set."""
    data = dump_settings(state(ctx).settings())
    if fmt is Format.JSON:
        typer.echo(json.dumps(data, indent=2))
    else:
        typer.echo(yaml.safe_dump(data, sort_keys=False), nl=False)


@app.command("check")
def check(ctx: typer.Context) -> None:
    """Validate the configuration; exit 0 when it is valid."""
    s = state(ctx).settings()
    console.print(
        f"configuration is valid: world={s.world}, {len(s.models)} model(s), "
        f"{len(s.offerings.types)} instance type(s) × {len(s.offerings.markets)} market(s)"
    )
