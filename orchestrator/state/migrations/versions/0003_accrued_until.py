"""The fleet remembers until when it is accrued, so one-shot ticks accrue like a loop;
signal samples are indexed by when they were observed (the live signal view reads so).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("meta") as batch:
        batch.add_column(sa.Column("accrued_until_s", sa.Float(), nullable=True))
    op.create_index("ix_signal_samples_observed_at", "signal_samples", ["observed_at"])


def downgrade() -> None:
    op.drop_index("ix_signal_samples_observed_at", table_name="signal_samples")
    with op.batch_alter_table("meta") as batch:
        batch.drop_column("accrued_until_s")
