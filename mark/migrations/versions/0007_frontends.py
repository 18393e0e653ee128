"""frontends: each daemon process of a cluster, its last beat and what it has counted

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "frontends",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("url", sa.String(length=255), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("last_seen", sa.Float(), nullable=False),
        sa.Column("synced_at", sa.Float(), nullable=True),
        sa.Column("feed", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_frontends_last_seen", "frontends", ["last_seen"])


def downgrade() -> None:
    op.drop_index("ix_frontends_last_seen", table_name="frontends")
    op.drop_table("frontends")
