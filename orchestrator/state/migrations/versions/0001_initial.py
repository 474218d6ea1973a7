"""Initial schema: jobs, job_state, instances, migrations, events, signal_samples, meta.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the types this revision was written with (never import schema.py here).
UTC_TIME = sa.DateTime(timezone=True)
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
OPEN_MIGRATION = sa.text("lower(phase) NOT IN ('done', 'failed')")


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("work_gpu_hours", sa.Double(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("start", UTC_TIME, nullable=False),
        sa.Column("deadline", UTC_TIME, nullable=False),
        sa.Column("checkpoint_size_gb", sa.Double(), nullable=False),
        sa.Column("cold_start_h", sa.Double(), nullable=False),
        sa.Column("home_region", sa.String(), nullable=False),
        sa.Column("gpu_types", sa.JSON(), nullable=False),
        sa.Column("throughput", sa.JSON(), nullable=False),
        sa.Column("budget_usd", sa.Double(), nullable=True),
        sa.Column("checkpoint_interval_h", sa.Double(), nullable=False),
        sa.Column("submitted_at", UTC_TIME, nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint("seq", name=op.f("uq_jobs_seq")),
    )
    op.create_table(
        "meta",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_meta")),
    )
    op.execute("INSERT INTO meta (id, version) VALUES (1, 0)")
    op.create_table(
        "signal_samples",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("time", UTC_TIME, nullable=False),
        sa.Column("source", sa.String(), nullable=False),
        sa.Column("key", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("value", sa.Double(), nullable=True),
        sa.Column("unit", sa.String(), nullable=False),
        sa.Column("observed_at", UTC_TIME, nullable=False),
        sa.Column("valid_until", UTC_TIME, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_signal_samples")),
        sa.UniqueConstraint(
            "kind",
            "key",
            "time",
            "source",
            "observed_at",
            name=op.f("uq_signal_samples_kind_key_time_source_observed_at"),
        ),
    )
    op.create_table(
        "events",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("time_s", sa.Double(), nullable=False),
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("offer_id", sa.String(), nullable=False),
        sa.Column("instance_id", sa.String(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_events_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    op.create_index("ix_events_job_id_id", "events", ["job_id", "id"], unique=False)
    op.create_table(
        "instances",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("provider", sa.String(), nullable=False),
        sa.Column("cluster", sa.String(), nullable=False),
        sa.Column("job_id", sa.String(), nullable=True),
        sa.Column("offer_id", sa.String(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("launched_at", UTC_TIME, nullable=False),
        sa.Column("request_id", sa.String(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_instances_job_id_jobs"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_instances")),
        sa.UniqueConstraint("request_id", name=op.f("uq_instances_request_id")),
    )
    op.create_index(op.f("ix_instances_cluster"), "instances", ["cluster"], unique=False)
    op.create_index(op.f("ix_instances_job_id"), "instances", ["job_id"], unique=False)
    op.create_table(
        "job_state",
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("phase", sa.SmallInteger(), nullable=False),
        sa.Column("offer_id", sa.String(), nullable=True),
        sa.Column("checkpoint_offer_id", sa.String(), nullable=True),
        sa.Column("progress_gpu_h", sa.Double(), nullable=False),
        sa.Column("checkpointed_gpu_h", sa.Double(), nullable=False),
        sa.Column("last_checkpoint_s", sa.Double(), nullable=True),
        sa.Column("ready_at_s", sa.Double(), nullable=True),
        sa.Column("usd", sa.Double(), nullable=False),
        sa.Column("kwh", sa.Double(), nullable=False),
        sa.Column("kwh_curtailed", sa.Double(), nullable=False),
        sa.Column("kg_co2", sa.Double(), nullable=False),
        sa.Column("kg_co2_marginal", sa.Double(), nullable=False),
        sa.Column("egress_usd", sa.Double(), nullable=False),
        sa.Column("migrations", sa.Integer(), nullable=False),
        sa.Column("preemptions", sa.Integer(), nullable=False),
        sa.Column("launches", sa.Integer(), nullable=False),
        sa.Column("finished_at_s", sa.Double(), nullable=True),
        sa.Column("preempted_offer_id", sa.String(), nullable=True),
        sa.Column("instance_id", sa.String(), nullable=True),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_state_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_job_state")),
    )
    op.create_table(
        "migrations",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("phase", sa.String(), nullable=False),
        sa.Column("src_offer_id", sa.String(), nullable=True),
        sa.Column("dst_offer_id", sa.String(), nullable=False),
        sa.Column("request_id", sa.String(), nullable=False),
        sa.Column("checkpoint_uri", sa.String(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("started_s", sa.Double(), nullable=False),
        sa.Column("updated_s", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_migrations_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_migrations")),
    )
    op.create_index(op.f("ix_migrations_job_id"), "migrations", ["job_id"], unique=False)
    # At most one open migration per job: two workers cannot both move one job.
    op.create_index(
        "uq_migrations_open_job",
        "migrations",
        ["job_id"],
        unique=True,
        sqlite_where=OPEN_MIGRATION,
        postgresql_where=OPEN_MIGRATION,
    )


def downgrade() -> None:
    for table in (
        "migrations",
        "job_state",
        "instances",
        "events",
        "signal_samples",
        "meta",
        "jobs",
    ):
        op.drop_table(table)
