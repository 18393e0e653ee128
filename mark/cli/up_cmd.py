"""`mark up`: run the daemon in the configured world (the embedded local one by default)."""

from __future__ import annotations

import typer

from mark.cli.context import console, run_async, state
from mark.daemon import serve


def up(
    ctx: typer.Context,
    port: int | None = typer.Option(None, min=0, max=65535, help="API port (0 = any free port)"),
    host: str | None = typer.Option(None, help="API bind address"),
) -> None:
    """Start mark: state store, REST endpoint and control loop. Ctrl-C stops it cleanly."""
    cli = state(ctx)
    if port is not None:
        cli.overrides.append(f"api.port={port}")
    if host is not None:
        cli.overrides.append(f"api.host={host}")
    settings = cli.settings()
    model = settings.models[0]

    def ready(url: str) -> None:
        console.print(f"mark is up ({settings.world} world) at [bold]{url}[/]", highlight=False)
        console.print(f"  health:  curl {url}/v2/health/ready", highlight=False)
        console.print(f"  model:   curl {url}/v2/models/{model.name}", highlight=False)
        console.print("Press Ctrl-C to stop.")

    run_async(serve(settings, on_ready=ready))
    console.print("mark stopped.")
