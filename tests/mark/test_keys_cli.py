"""`mark keys` create / list / revoke against a real SQLite file, as typer runs them."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mark.cli.main import app
from mark.state import ApiKeyRecord, open_store


@pytest.fixture
def db(tmp_path: Path) -> list[str]:
    return ["--set", f"database_url=sqlite+aiosqlite:///{tmp_path}/keys.db"]


def _keys(db: list[str]) -> list[ApiKeyRecord]:
    async def go() -> list[ApiKeyRecord]:
        store = await open_store(db[1].split("=", 1)[1])
        try:
            return await store.api_keys()
        finally:
            await store.close()

    return asyncio.run(go())


def test_create_prints_the_key_once_and_stores_only_its_hash(db: list[str]) -> None:
    runner = CliRunner()
    out = runner.invoke(
        app,
        [*db, "keys", "create", "--name", "web", "--scopes", "inference,metrics", "--rate", "5"],
    )
    assert out.exit_code == 0, out.output
    assert "cannot be shown again" in out.output
    token = out.output.strip().splitlines()[-1]
    prefix, key_id, secret = token.split("_", 2)
    assert prefix == "mark" and len(secret) == 64
    (rec,) = _keys(db)
    assert (rec.id, rec.name, rec.scopes) == (key_id, "web", ("inference", "metrics"))
    assert (rec.rate_rps, rec.max_concurrency, rec.revoked_at) == (5.0, None, None)
    assert rec.hash == hashlib.sha256(secret.encode()).hexdigest()

    listed = runner.invoke(app, [*db, "keys", "list"])
    assert listed.exit_code == 0, listed.output
    assert (
        key_id in listed.output and "web" in listed.output and "inference,metrics" in listed.output
    )
    assert secret not in listed.output and rec.hash not in listed.output


def test_revoke_marks_the_key_and_list_shows_when(db: list[str]) -> None:
    runner = CliRunner()
    made = runner.invoke(
        app, [*db, "keys", "create", "--name", "ops", "--scopes", "admin", "--concurrency", "2"]
    )
    assert made.exit_code == 0, made.output
    key_id = made.output.strip().splitlines()[-1].split("_", 2)[1]
    out = runner.invoke(app, [*db, "keys", "revoke", key_id])
    assert out.exit_code == 0 and f"API key {key_id} revoked" in out.output
    (rec,) = _keys(db)
    assert rec.revoked_at is not None and rec.max_concurrency == 2
    again = runner.invoke(app, [*db, "keys", "revoke", key_id])
    assert again.exit_code == 0 and "already revoked" in again.output
    row = next(
        x for x in runner.invoke(app, [*db, "keys", "list"]).output.splitlines() if key_id in x
    )
    assert row.count("-") >= 4  # created and revoked dates


def test_unknown_scope_and_unknown_id_are_clear_errors(db: list[str]) -> None:
    runner = CliRunner()
    bad = runner.invoke(app, [*db, "keys", "create", "--name", "x", "--scopes", "inference,root"])
    assert bad.exit_code == 2
    assert "unknown scope root; allowed: inference, metrics, admin" in bad.output
    assert _keys_or_empty(db) == []
    missing = runner.invoke(app, [*db, "keys", "revoke", "deadbeef"])
    assert missing.exit_code == 2 and "unknown API key id 'deadbeef'" in missing.output
    empty = runner.invoke(app, [*db, "keys", "list"])
    assert empty.exit_code == 0 and "no API keys" in empty.output


def _keys_or_empty(db: list[str]) -> list[ApiKeyRecord]:
    try:
        return _keys(db)
    except Exception:  # nothing created the database
        return []
