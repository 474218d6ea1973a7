"""Migrations keep the migration machine's full record; jobs keep the command they run.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("migrations") as batch:
        batch.add_column(sa.Column("detail", sa.Text(), nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("command", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("command")
    with op.batch_alter_table("migrations") as batch:
        batch.drop_column("detail")
