"""`mark config`: show and check the effective configuration."""

from __future__ import annotations

import json
from enum import StrEnum

import typer
import yaml

from mark.catalog import load_catalog
from mark.cli.context import console, fail, state
from mark.config import Settings, dump_settings
from provisioner.accelerators import usable

app = typer.Typer(help="Show or check the effective configuration.", no_args_is_help=True)


class Format(StrEnum):
    YAML = "yaml"
    JSON = "json"


@app.command("show")
def show(
    ctx: typer.Context,
    fmt: Format = typer.Option(Format.YAML, "--format", help="yaml or json"),
) -> None:
    """Print the configuration after defaults, the YAML file, MARK_* variables and --set
    (the database password masked)."""
    data = dump_settings(state(ctx).settings())
    data["database_url"] = masked_url(data["database_url"])
    if fmt is Format.JSON:
        typer.echo(json.dumps(data, indent=2))
    else:
        typer.echo(yaml.safe_dump(data, sort_keys=False), nl=False)


@app.command("check")
def check(ctx: typer.Context) -> None:
    """Validate the configuration, load every model and run it once against its declared
    inputs and outputs, and say which instance types each model cannot use; exit 0 when
    it is valid, every model runs as declared and has a type it can use."""
    from mark.cli.model_checks import checked  # torch or onnxruntime: only when checking
    from mark.errors import ConfigError

    s = state(ctx).settings()
    try:
        checked(s)
    except ConfigError as exc:
        fail(str(exc), code=1)
    console.print(
        f"configuration is valid: world={s.world}, {len(s.models)} model(s) loaded and run, "
        f"{len(s.offerings.types)} instance type(s) × {len(s.offerings.markets)} market(s)"
    )
    left_out, stranded = unplanned_types(s)
    for line in left_out:
        console.print(line, markup=False, highlight=False)
    if stranded:
        fail(f"no configured instance type can serve {', '.join(stranded)}", code=1)


def masked_url(url: str) -> str:
    """A database URL with its password as ``***``: what may be printed or pasted."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def unplanned_types(s: Settings) -> tuple[list[str], list[str]]:
    """(a line per model and configured type it will not be planned on, with why;
    the models left with no type at all)."""
    catalog = load_catalog()
    lines: list[str] = []
    stranded: list[str] = []
    for spec in s.models:
        planned = 0
        for t in s.offerings.types:
            ok, why = usable(catalog.instance_type(t).accelerator.value, bool(spec.neuron_artifact))
            if ok:
                planned += 1
            else:
                lines.append(f"{spec.name}: {t} not planned: {why}")
        if not planned:
            stranded.append(spec.name)
    return lines, stranded
