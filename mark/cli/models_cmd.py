"""`mark models`: the models the configuration (and its repository) serves, as the daemon
reads them."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

import typer
from rich.table import Table

from mark.cli.context import console, fail, state
from mark.config import ModelSpec
from mark.errors import ConfigError

app = typer.Typer(help="The models mark serves: list and check them.", no_args_is_help=True)


class Format(StrEnum):
    TABLE = "table"
    JSON = "json"


def _tensors(tensors: Any) -> str:
    return ", ".join(
        f"{t.name} {t.dtype}{t.spec().batch_shape()}" if t.shape is not None else f"{t.name} (any)"
        for t in tensors
    )


def describe(spec: ModelSpec) -> dict[str, Any]:
    """One model as `mark models list --format json` prints it."""
    return {
        "name": spec.name,
        "version": spec.version,
        "format": spec.model_format,
        "artifact": spec.remote_source,
        "inputs": [t.spec().to_dict() for t in spec.inputs],
        "outputs": [t.spec().to_dict() for t in spec.outputs],
        "slo": {"rt_max_ms": spec.slo.rt_max_ms, "sl_min": spec.slo.sl_min},
    }


@app.command("list")
def list_models(
    ctx: typer.Context,
    fmt: Format = typer.Option(Format.TABLE, "--format", help="table or json"),
    check: bool = typer.Option(
        False, "--check", help="also load each model and run it once (as `mark up` does)"
    ),
) -> None:
    """Each model: version served, format, artifact, tensors (-1: any size) and SLO. With
    --check, each is loaded and run once first, and undeclared output shapes are shown as
    the model gives them."""
    settings = state(ctx).settings()
    if check:
        from mark.cli.model_checks import checked  # torch or onnxruntime: only when checking

        try:
            settings = checked(settings)
        except ConfigError as exc:
            fail(str(exc), code=1)
    if fmt is Format.JSON:
        typer.echo(json.dumps([describe(m) for m in settings.models], indent=2))
        return
    table = Table("model", "version", "format", "inputs", "outputs", "RT_max", "SL_min")
    for m in settings.models:
        table.add_row(
            m.name,
            m.version,
            m.model_format,
            _tensors(m.inputs),
            _tensors(m.outputs),
            f"{m.slo.rt_max_ms:g} ms",
            f"{m.slo.sl_min:.2%}",
        )
    console.print(table)
