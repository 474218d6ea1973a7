"""Alembic environment for the state store.

`orchestrator.state.upgrade()` passes an open connection in ``config.attributes``; the
``alembic`` command line (``alembic -x url=... upgrade head`` with a config whose
``script_location`` is this directory) gets one from ``-x url=``, ``sqlalchemy.url`` or
$HELIOTROPE_DB_URL.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from orchestrator.state.schema import metadata

config = context.config


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        compare_type=True,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite cannot ALTER much
    )
    with context.begin_transaction():
        context.run_migrations()


def _url() -> str | None:
    return context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option(
        "sqlalchemy.url"
    )


def run() -> None:
    if context.is_offline_mode():
        from orchestrator.state.sql import resolve_url

        context.configure(url=resolve_url(_url()), target_metadata=metadata, literal_binds=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        return
    from orchestrator.state.sql import make_engine

    engine = make_engine(_url())
    try:
        with engine.begin() as conn:
            _configure(conn)
    finally:
        engine.dispose()


run()
