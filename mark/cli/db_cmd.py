"""`mark db`: migrate and inspect the state store."""

from __future__ import annotations

import typer

from mark.cli.context import console, run_async, state
from mark.state import migrate, open_store
from mark.state.store import make_engine

app = typer.Typer(help="Migrate and inspect the state store.", no_args_is_help=True)


def _redacted(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


@app.command("upgrade")
def upgrade(ctx: typer.Context) -> None:
    """Create or migrate the database to the schema this version of mark expects."""
    url = state(ctx).settings().db_url

    async def go() -> None:
        store = await open_store(url, upgrade=True)
        await store.close()

    run_async(go())
    console.print(f"database {_redacted(url)} is at revision {migrate.head_revision()}")


@app.command("current")
def current(ctx: typer.Context) -> None:
    """Print the database's migration revision and the one the code expects."""
    url = state(ctx).settings().db_url

    async def go() -> str | None:
        engine = make_engine(url)
        try:
            return await migrate.current_revision(engine)
        finally:
            await engine.dispose()

    rev = run_async(go())
    console.print(f"database: {rev or 'empty'}; code expects: {migrate.head_revision()}")
