"""The state stores' `backend` fixture (memory, SQLite, PostgreSQL) for the live tests."""

from tests.state.conftest import backend  # noqa: F401
