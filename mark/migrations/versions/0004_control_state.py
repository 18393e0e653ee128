"""control_state and control_lease: the control state a restart needs, the leader lease

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "control_state",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("state", sa.JSON(), nullable=False),
        sa.Column("saved_at", sa.Float(), nullable=False),
        sa.Column("saved_by", sa.String(length=200), nullable=True),
        sa.PrimaryKeyConstraint("key"),
    )
    op.create_table(
        "control_lease",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("holder", sa.String(length=200), nullable=False),
        sa.Column("acquired_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )


def downgrade() -> None:
    op.drop_table("control_lease")
    op.drop_table("control_state")
