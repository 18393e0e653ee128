"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "arrivals",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("model", sa.String(length=64), nullable=False),
        sa.Column("window_start", sa.Float(), nullable=False),
        sa.Column("window_s", sa.Float(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("model", "window_start", name="uq_arrivals_window"),
    )
    op.create_table(
        "instances",
        sa.Column("instance_id", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=64), nullable=False),
        sa.Column("instance_type", sa.String(length=32), nullable=False),
        sa.Column("market", sa.String(length=16), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("address", sa.String(length=128), nullable=True),
        sa.Column("price_per_hour", sa.Float(), nullable=False),
        sa.Column("launched_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("instance_id"),
    )
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_instances_model"), ["model"], unique=False)
        batch_op.create_index(batch_op.f("ix_instances_state"), ["state"], unique=False)

    op.create_table(
        "latency_rollups",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("model", sa.String(length=64), nullable=False),
        sa.Column("minute_start", sa.Float(), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("p50_ms", sa.Float(), nullable=False),
        sa.Column("p95_ms", sa.Float(), nullable=False),
        sa.Column("p99_ms", sa.Float(), nullable=False),
        sa.Column("slo_hits", sa.Integer(), nullable=False),
        sa.Column("slo_misses", sa.Integer(), nullable=False),
        sa.Column("spilled", sa.Integer(), nullable=False),
        sa.Column("errors", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("model", "minute_start", name="uq_latency_minute"),
    )
    op.create_table(
        "ledger",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("model", sa.String(length=64), nullable=False),
        sa.Column("start", sa.Float(), nullable=False),
        sa.Column("end", sa.Float(), nullable=False),
        sa.Column("component", sa.String(length=16), nullable=False),
        sa.Column("instance_id", sa.String(length=64), nullable=True),
        sa.Column("instance_type", sa.String(length=32), nullable=True),
        sa.Column("unit_price", sa.Float(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("billed_seconds", sa.Float(), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("gb_seconds", sa.Float(), nullable=False),
        sa.Column("cost", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("ledger", schema=None) as batch_op:
        batch_op.create_index("ix_ledger_start", ["start"], unique=False)

    op.create_table(
        "plans",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("model", sa.String(length=64), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("planner", sa.String(length=32), nullable=False),
        sa.Column("forecast", sa.JSON(), nullable=False),
        sa.Column("horizon_cost", sa.Float(), nullable=False),
        sa.Column("explanation", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.create_index("ix_plans_model_at", ["model", "at"], unique=False)

    op.create_table(
        "decisions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("plan_id", sa.Integer(), nullable=True),
        sa.Column("model", sa.String(length=64), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("instance_type", sa.String(length=32), nullable=True),
        sa.Column("market", sa.String(length=16), nullable=True),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("instance_id", sa.String(length=64), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["plan_id"], ["plans.id"], ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("decisions", schema=None) as batch_op:
        batch_op.create_index("ix_decisions_at", ["at"], unique=False)

    op.create_table(
        "instance_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("instance_id", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["instance_id"], ["instances.instance_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("instance_events", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_instance_events_instance_id"), ["instance_id"], unique=False
        )


def downgrade() -> None:

    with op.batch_alter_table("instance_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_instance_events_instance_id"))

    op.drop_table("instance_events")
    with op.batch_alter_table("decisions", schema=None) as batch_op:
        batch_op.drop_index("ix_decisions_at")

    op.drop_table("decisions")
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.drop_index("ix_plans_model_at")

    op.drop_table("plans")
    with op.batch_alter_table("ledger", schema=None) as batch_op:
        batch_op.drop_index("ix_ledger_start")

    op.drop_table("ledger")
    op.drop_table("latency_rollups")
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_instances_state"))
        batch_op.drop_index(batch_op.f("ix_instances_model"))

    op.drop_table("instances")
    op.drop_table("arrivals")
