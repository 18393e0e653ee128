"""The fault suite's table: every scenario's row, printed once at the end of the session
(``pytest tests/faults -s`` also shows each row as its scenario ends)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.harness import ROWS, table


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The daemon's data dir, also where its agents and Lambda runtimes look (MARK_DATA_DIR)."""
    monkeypatch.setenv("MARK_DATA_DIR", str(tmp_path))
    return tmp_path


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if ROWS:
        terminalreporter.write_sep("=", "fault scenarios")
        terminalreporter.write_line(table(ROWS))
