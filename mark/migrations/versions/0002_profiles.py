"""profiles: T_b per (model, instance type) with its source

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "profiles",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("model", sa.String(length=64), nullable=False),
        sa.Column("instance_type", sa.String(length=32), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("batch_latency_s", sa.JSON(), nullable=False),
        sa.Column("measured_at", sa.Float(), nullable=False),
        sa.Column("device", sa.String(length=32), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("model", "instance_type", "source", name="uq_profiles_model_type"),
    )


def downgrade() -> None:
    op.drop_table("profiles")
