"""latency_rollups.http_requests: inference requests apart from the rows they carry

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable: a minute recorded before this counted rows only, and 0 would be a lie.
    # Batch mode: SQLite alters a table by copying it; PostgreSQL gets a plain ALTER.
    with op.batch_alter_table("latency_rollups") as batch:
        batch.add_column(sa.Column("http_requests", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("latency_rollups") as batch:
        batch.drop_column("http_requests")
