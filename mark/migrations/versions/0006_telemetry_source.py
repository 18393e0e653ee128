"""arrivals and latency_rollups.source: each frontend sharing the database keeps its own rows

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# (table, its time column, its unique constraint, what a downgrade merges and how)
TABLES = (
    ("arrivals", "window_start", "uq_arrivals_window", {"count": "SUM", "window_s": "MIN"}),
    (
        "latency_rollups",
        "minute_start",
        "uq_latency_minute",
        {
            "requests": "SUM",
            "slo_hits": "SUM",
            "slo_misses": "SUM",
            "spilled": "SUM",
            "errors": "SUM",
            "http_requests": "SUM",
            "p50_ms": "MAX",
            "p95_ms": "MAX",
            "p99_ms": "MAX",
        },
    ),
)


def upgrade() -> None:
    # Rows written before are one unnamed frontend's (""). Batch mode: SQLite alters a
    # table by copying it; PostgreSQL gets plain ALTERs.
    for table, start, unique, _merge in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(
                sa.Column("source", sa.String(length=128), nullable=False, server_default="")
            )
            batch.drop_constraint(unique, type_="unique")
            batch.create_unique_constraint(unique, ["model", start, "source"])


def downgrade() -> None:
    # The old key has room for one row per window: the sources' rows are merged into
    # the oldest, as reads since 0006 saw them, rather than the downgrade failing on them.
    for table, start, unique, merge in TABLES:
        same = f"o.model = {table}.model AND o.{start} = {table}.{start}"
        sets = ", ".join(
            f"{c} = (SELECT {f}(o.{c}) FROM {table} o WHERE {same})" for c, f in merge.items()
        )
        firsts = f"SELECT MIN(id) FROM {table} GROUP BY model, {start}"
        op.execute(sa.text(f"UPDATE {table} SET {sets} WHERE id IN ({firsts} HAVING COUNT(*) > 1)"))
        op.execute(sa.text(f"DELETE FROM {table} WHERE id NOT IN ({firsts})"))
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(unique, type_="unique")
            batch.create_unique_constraint(unique, ["model", start])
            batch.drop_column("source")
