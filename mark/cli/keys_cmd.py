"""`mark keys`: create, list and revoke the API keys the endpoint accepts."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import typer
from rich.table import Table

from mark.cli.context import console, fail, run_async, state

app = typer.Typer(help="Create, list and revoke API keys.", no_args_is_help=True)


def _when(at: float | None) -> str:
    return "" if at is None else datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


@app.command("create")
def create(
    ctx: typer.Context,
    name: str = typer.Option(..., "--name", help="who or what the key is for"),
    scopes: str = typer.Option(
        ..., "--scopes", help="comma-separated: inference, metrics, admin (admin implies metrics)"
    ),
    rate: float | None = typer.Option(
        None, "--rate", min=0.001, help="requests per second (default: api.default_rate_rps)"
    ),
    concurrency: int | None = typer.Option(
        None,
        "--concurrency",
        min=1,
        help="requests in flight at once (default: api.default_max_concurrency)",
    ),
) -> None:
    """Make a key and print it once: only its hash is stored, it cannot be shown again."""
    from mark.serve.auth import create_key, parse_scopes
    from mark.state import open_store

    try:
        wanted = parse_scopes(scopes)
    except ValueError as exc:
        fail(str(exc))
    if not name.strip():
        fail("--name must not be empty")
    url = state(ctx).settings().db_url

    async def go() -> tuple[str, str]:
        store = await open_store(url, upgrade=True)
        try:
            rec, token = await create_key(
                store,
                name.strip(),
                wanted,
                time.time(),
                rate_rps=rate,
                max_concurrency=concurrency,
            )
        finally:
            await store.close()
        return rec.id, token

    key_id, token = run_async(go())
    console.print(
        f"API key {key_id} ({','.join(wanted)}) for {name.strip()!r}. Here it is, once; "
        "only its hash is stored, so it cannot be shown again:",
        highlight=False,
        soft_wrap=True,
    )
    typer.echo(token)


@app.command("list")
def list_keys(ctx: typer.Context) -> None:
    """Every key: id, name, scopes, limits, when it was created and revoked (never a secret)."""
    from mark.state import open_store

    url = state(ctx).settings().db_url

    async def go() -> list[tuple[str, ...]]:
        store = await open_store(url, upgrade=True)
        try:
            keys = await store.api_keys()
        finally:
            await store.close()
        return [
            (
                k.id,
                k.name,
                ",".join(k.scopes),
                "" if k.rate_rps is None else f"{k.rate_rps:g}",
                "" if k.max_concurrency is None else str(k.max_concurrency),
                _when(k.created_at),
                _when(k.revoked_at),
            )
            for k in keys
        ]

    rows = run_async(go())
    if not rows:
        console.print("no API keys; `mark keys create` makes one")
        return
    table = Table("id", "name", "scopes", "rate r/s", "concurrency", "created", "revoked")
    for row in rows:
        table.add_row(*row)
    console.print(table)


@app.command("revoke")
def revoke(ctx: typer.Context, key_id: str = typer.Argument(..., help="the key's id")) -> None:
    """Revoke a key: the endpoint refuses it within api.key_refresh_s."""
    from mark.state import open_store

    url = state(ctx).settings().db_url
    now = time.time()

    async def go() -> tuple[bool, float | None]:
        store = await open_store(url, upgrade=True)
        try:
            if all(k.id != key_id for k in await store.api_keys()):
                return False, None
            return True, (await store.revoke_api_key(key_id, now)).revoked_at
        finally:
            await store.close()

    known, at = run_async(go())
    if not known:
        fail(f"unknown API key id {key_id!r}; `mark keys list` shows the ids")
    if at != now:
        console.print(f"API key {key_id} was already revoked at {_when(at)}", highlight=False)
    else:
        console.print(f"API key {key_id} revoked", highlight=False)
