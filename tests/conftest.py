"""Shared fixtures: a real SQLite file and a real PostgreSQL database per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
import pytest

from tests.processes import live_children

pytest_plugins = ["tests.faults.session_table"]  # the fault scenarios' table, under -n too


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``pytest -n`` (scripts/test.sh), the slow tests first, so the workers start
    the long wall-clock runs at once and fill the time beside them with the short ones,
    rather than finishing on one long test. One process keeps the files' order."""
    if os.environ.get("PYTEST_XDIST_WORKER"):  # xdist's workers collect: they set the order
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


PG_HOST = os.environ.get("MARK_TEST_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("MARK_TEST_PG_PORT", "5432"))
PG_USER = os.environ.get("MARK_TEST_PG_USER", "postgres")


@asynccontextmanager
async def fresh_pg_database() -> AsyncIterator[str]:
    """Create a uniquely named database, yield its URL, drop it. In CI a missing server fails."""
    try:
        admin = await asyncpg.connect(
            host=PG_HOST, port=PG_PORT, user=PG_USER, database="postgres", timeout=5
        )
    except Exception as exc:  # asyncpg raises OSError and its own types
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL at {PG_HOST}:{PG_PORT} is required in CI: {exc}")
        pytest.skip(f"PostgreSQL at {PG_HOST}:{PG_PORT} unavailable: {exc}")
    name = f"mark_test_{uuid.uuid4().hex[:12]}"
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+asyncpg://{PG_USER}@{PG_HOST}:{PG_PORT}/{name}"
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@pytest.fixture
async def pg_url() -> AsyncIterator[str]:
    async with fresh_pg_database() as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path}/state/mark.db"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """Each store test runs against both backends."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path}/state/mark.db"
        return
    async with fresh_pg_database() as url:
        yield url


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test reads the developer's MARK_* variables or writes to their data dir."""
    for key in list(os.environ):
        if key.startswith("MARK_") and not key.startswith("MARK_TEST_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("MARK_DATA_DIR", str(tmp_path / "data"))


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """A real moto server on loopback (aiobotocore cannot use in-process mock_aws)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, moto_endpoint: str) -> str:
    """Fake credentials so no test can reach real AWS; returns the moto endpoint."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return moto_endpoint


@pytest.fixture
def children_before() -> frozenset[int]:
    """This process's children alive as the test begins (``tests/processes.py``)."""
    return frozenset(live_children(os.getpid()))
