"""`mark up`: run the daemon in the configured world (the embedded local one by default)."""

from __future__ import annotations

import json
from typing import Any

import typer

from mark import logs
from mark.cli.context import console, fail, run_async, state
from mark.config import ModelSpec


def up(
    ctx: typer.Context,
    port: int | None = typer.Option(None, min=0, max=65535, help="API port (0 = any free port)"),
    host: str | None = typer.Option(None, help="API bind address"),
) -> None:
    """Start mark: state store, REST endpoint and control loop. Ctrl-C (or SIGTERM) drains
    it: readiness goes false, new requests get 503, those in flight are answered; then it
    stops. A second Ctrl-C stops it without waiting for the drain."""
    from mark.cli.model_checks import checked
    from mark.daemon import Running, serve  # torch and the cloud adapters: only when serving
    from mark.demo import DEMO_SOURCE, ensure_demo_model
    from mark.errors import ConfigError
    from mark.serve.auth import KEY_FILE

    cli = state(ctx)
    if port is not None:
        cli.overrides.append(f"api.port={port}")
    if host is not None:
        cli.overrides.append(f"api.host={host}")
    settings = cli.settings()
    model = settings.models[0]
    if model.source == DEMO_SOURCE:
        with console.status("preparing the demo model (trained once, then cached)..."):
            ensure_demo_model(settings.data_dir)
    try:  # before anything is created: no database, no key, no instance for a broken model
        settings = checked(settings)
    except ConfigError as exc:
        fail(str(exc), code=1)
    logs.configure(
        logs.choose_format(settings.log_format, settings.world), settings.log_level.upper()
    )

    def ready(run: Running) -> None:
        url = run.url
        example = json.dumps({"instances": [example_instance(model)]}, separators=(",", ":"))
        key = f' -H "Authorization: Bearer {run.api_key}"' if run.api_key else ""
        console.print(f"mark is up ({settings.world} world) at [bold]{url}[/]", highlight=False)
        if run.api_key:
            console.print(
                f"  API key:  in {settings.data_dir / KEY_FILE} "
                "(`mark keys` lists, makes and revokes keys)",
                highlight=False,
                soft_wrap=True,
            )
        elif settings.api.auth:
            console.print(
                "  API key:  none of this store's keys is saved here; make one with "
                "`mark keys create --name me --scopes inference` and put it in the lines below",
                highlight=False,
                soft_wrap=True,
            )
        else:
            console.print("  API key:  none needed (api.auth is false)", highlight=False)
        console.print(f"  health:   curl {url}/v2/health/ready", highlight=False)
        console.print(
            f"  model:    curl{key} {url}/v2/models/{model.name}", highlight=False, soft_wrap=True
        )
        console.print(
            f"  predict:  curl -s -X POST {url}/v1/models/{model.name}:predict{key} "
            f"-H 'Content-Type: application/json' -d '{example}'",
            highlight=False,
            soft_wrap=True,
        )
        if run.api_key:
            console.print(f"  metrics:  curl{key} {url}/metrics", highlight=False, soft_wrap=True)
        console.print("Press Ctrl-C to stop (requests in flight are answered first; twice: now).")

    run_async(serve(settings, on_ready=ready))
    console.print("mark stopped.")


def example_instance(model: ModelSpec) -> Any:
    """One instance for the printed curl: a real '0' digit for the demo, zeros otherwise."""
    from mark.demo import DEMO_SOURCE, load_digits_tensors

    if model.source == DEMO_SOURCE:
        x, _ = load_digits_tensors()
        return [[[round(float(v), 4) for v in row] for row in x[0, 0]]]
    value: Any = 0
    for d in reversed(model.input_tensor.shape or ()):
        value = [value] * (d if d > 0 else 2)  # a variable dimension: two of it
    return value
