"""Alembic migrations driven from code, on the store's own async engine.

`mark db upgrade` and the daemon's start-up call ``upgrade``; there is no
alembic.ini to keep in sync with the configured database URL.
"""

from __future__ import annotations

from importlib import resources

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import AsyncEngine


def alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(resources.files("mark") / "migrations"))
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def _upgrade(conn: Connection, target: str) -> None:
    cfg = alembic_config()
    cfg.attributes["connection"] = conn
    command.upgrade(cfg, target)


def _downgrade(conn: Connection, target: str) -> None:
    cfg = alembic_config()
    cfg.attributes["connection"] = conn
    command.downgrade(cfg, target)


def _current(conn: Connection) -> str | None:
    return MigrationContext.configure(conn).get_current_revision()


MIGRATION_LOCK = 0x6D61726B  # "mark"
"""The PostgreSQL advisory lock an upgrade holds: frontends starting together on a new
database migrate one after another, the later ones finding it done."""


async def upgrade(engine: AsyncEngine, target: str = "head") -> None:
    async with engine.begin() as conn:
        if conn.dialect.name == "postgresql":  # held until this transaction ends
            await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})
        await conn.run_sync(_upgrade, target)


async def downgrade(engine: AsyncEngine, target: str) -> None:
    async with engine.begin() as conn:
        await conn.run_sync(_downgrade, target)


async def current_revision(engine: AsyncEngine) -> str | None:
    async with engine.connect() as conn:
        return await conn.run_sync(_current)
