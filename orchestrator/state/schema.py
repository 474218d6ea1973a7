"""The tables of the state store (SQLAlchemy Core). Alembic's head must match this metadata:
`tests/state` checks that autogenerate finds no difference. Change a table here, then add a
revision under `migrations/versions/` (see `migrations/README`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)


class UTCDateTime(sa.TypeDecorator[datetime]):
    """A timestamp that is always tz-aware UTC in Python.

    PostgreSQL: TIMESTAMP WITH TIME ZONE. SQLite: naive UTC text (it has no time zones), so
    text order is time order.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: Heliotrope stores tz-aware UTC times")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


#: An autoincrementing 64-bit key (SQLite only autoincrements INTEGER PRIMARY KEY).
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("id", sa.String(), primary_key=True),
    sa.Column("seq", sa.Integer(), nullable=False, unique=True),  # submission order
    sa.Column("work_gpu_hours", sa.Double(), nullable=False),
    sa.Column("gpus", sa.Integer(), nullable=False),
    sa.Column("start", UTCDateTime(), nullable=False),
    sa.Column("deadline", UTCDateTime(), nullable=False),
    sa.Column("checkpoint_size_gb", sa.Double(), nullable=False),
    sa.Column("cold_start_h", sa.Double(), nullable=False),
    sa.Column("home_region", sa.String(), nullable=False),
    sa.Column("gpu_types", sa.JSON(), nullable=False),  # sorted list of names
    sa.Column("throughput", sa.JSON(), nullable=False),  # {gpu_type: relative throughput}
    sa.Column("budget_usd", sa.Double(), nullable=True),
    sa.Column("checkpoint_interval_h", sa.Double(), nullable=False),
    sa.Column("command", sa.JSON(), nullable=True),  # argv a live instance runs
    sa.Column("submitted_at", UTCDateTime(), nullable=False),
    sa.Column("status", sa.String(), nullable=False),  # active | cancelled
    sa.Column("held_until_s", sa.Float(), nullable=True),  # `jobs hold`: until when (0004)
    sa.Column("carbon_usd_per_tonne", sa.Double(), nullable=True),  # the job's own (0005)
    sa.Column("launcher", sa.String(), nullable=True),  # torchrun (NULL) | none (0006)
)

job_state = sa.Table(
    "job_state",
    metadata,
    sa.Column(
        "job_id", sa.String(), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    ),
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
    sa.Column("version", sa.BigInteger(), nullable=False),  # commits that wrote this row
)

instances = sa.Table(
    "instances",
    metadata,
    sa.Column("id", sa.String(), primary_key=True),
    sa.Column("provider", sa.String(), nullable=False),
    sa.Column("cluster", sa.String(), nullable=False, index=True),
    sa.Column(
        "job_id",
        sa.String(),
        sa.ForeignKey("jobs.id", ondelete="SET NULL"),
        nullable=True,
        index=True,
    ),
    sa.Column("offer_id", sa.String(), nullable=False),
    sa.Column("state", sa.String(), nullable=False),
    sa.Column("launched_at", UTCDateTime(), nullable=False),
    sa.Column("request_id", sa.String(), nullable=False, unique=True),
)

migrations = sa.Table(
    "migrations",
    metadata,
    sa.Column("id", sa.String(), primary_key=True),
    sa.Column(
        "job_id",
        sa.String(),
        sa.ForeignKey("jobs.id", ondelete="CASCADE"),
        nullable=False,
        index=True,
    ),
    sa.Column("phase", sa.String(), nullable=False),
    sa.Column("src_offer_id", sa.String(), nullable=True),
    sa.Column("dst_offer_id", sa.String(), nullable=False),
    sa.Column("request_id", sa.String(), nullable=False),
    sa.Column("checkpoint_uri", sa.String(), nullable=True),
    sa.Column("error", sa.Text(), nullable=True),
    sa.Column("started_s", sa.Double(), nullable=False),
    sa.Column("updated_s", sa.Double(), nullable=False),
    sa.Column("detail", sa.Text(), nullable=True),  # the machine's full record, JSON
)

#: At most one open migration per job: two workers cannot both move one job.
OPEN_MIGRATION_WHERE = sa.text("lower(phase) NOT IN ('done', 'failed')")
sa.Index(
    "uq_migrations_open_job",
    migrations.c.job_id,
    unique=True,
    sqlite_where=OPEN_MIGRATION_WHERE,
    postgresql_where=OPEN_MIGRATION_WHERE,
)

events = sa.Table(
    "events",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("time_s", sa.Double(), nullable=False),
    sa.Column("job_id", sa.String(), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    sa.Column("kind", sa.String(), nullable=False),
    sa.Column("offer_id", sa.String(), nullable=False),
    sa.Column("instance_id", sa.String(), nullable=False),
    sa.Column("detail", sa.Text(), nullable=False),
    sa.Column("data", sa.JSON(), nullable=False),
    sa.Index("ix_events_job_id_id", "job_id", "id"),
)

signal_samples = sa.Table(
    "signal_samples",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("time", UTCDateTime(), nullable=False),
    sa.Column("source", sa.String(), nullable=False),
    sa.Column("key", sa.String(), nullable=False),
    sa.Column("kind", sa.String(), nullable=False),
    sa.Column("value", sa.Double(), nullable=True),  # NULL: unknown (NaN in Python)
    sa.Column("unit", sa.String(), nullable=False),
    sa.Column("observed_at", UTCDateTime(), nullable=False),
    sa.Column("valid_until", UTCDateTime(), nullable=True),
    sa.UniqueConstraint("kind", "key", "time", "source", "observed_at"),
    sa.Index("ix_signal_samples_observed_at", "observed_at"),  # the live view's reads
)

#: One row (id 1): the fleet version, bumped by every commit (compare-and-swap).
meta = sa.Table(
    "meta",
    metadata,
    sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
    sa.Column("version", sa.BigInteger(), nullable=False),
    # Until when the fleet's dollars, energy, carbon and progress are accrued (POSIX s):
    # a one-shot tick (Airflow), a restarted and a continuous controller accrue alike.
    sa.Column("accrued_until_s", sa.Float(), nullable=True),
)
