"""Alembic environment: runs on the connection mark hands it (see mark.state.migrate)."""

from __future__ import annotations

from alembic import context

from mark.state.schema import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations with `mark db upgrade`, which supplies the connection")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
