"""The fault scenarios' fixtures, and each scenario's row put on its test's report, from
which ``tests/faults/session_table.py`` prints the table at the end of the session
(``pytest tests/faults -s`` also shows each row as its scenario ends)."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pytest

from tests.faults.harness import take_recorded
from tests.faults.session_table import PROPERTY


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The daemon's data dir, also where its agents and Lambda runtimes look (MARK_DATA_DIR)."""
    monkeypatch.setenv("MARK_DATA_DIR", str(tmp_path))
    return tmp_path


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None]:
    """The test's rows onto its "call" report, passed or failed: the report's
    ``user_properties`` reach the controller under ``pytest -n``, a worker's globals do not."""
    try:
        return (yield)
    finally:
        item.user_properties += [(PROPERTY, t.summary()) for t in take_recorded()]
