"""A pytest plugin, registered from ``tests/conftest.py``: the fault scenarios' table at the
end of the session, with or without ``pytest -n``.

Under xdist the scenarios run in the workers and the terminal summary is the controller's,
which collects nothing and so, run from ``testpaths``, loads no ``tests/faults/conftest.py``
(only the conftests of the command line's paths and of ``tests/test*``). The rows come on
the tests' reports instead (``user_properties``, put there by that conftest)."""

from __future__ import annotations

from typing import Any

import pytest

PROPERTY = "fault_tally"
"""The ``user_properties`` name of a scenario's ``Tally.summary()``."""


class SessionTable:
    """The summaries from this session's reports, in the order the tests ended."""

    def __init__(self) -> None:
        self.summaries: list[dict[str, Any]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call":
            props = report.user_properties
            self.summaries += [v for k, v in props if k == PROPERTY and isinstance(v, dict)]

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.summaries:
            # The harness imports the daemon: only once there is a row to print.
            from tests.faults.harness import Tally, table

            terminalreporter.write_sep("=", "fault scenarios")
            terminalreporter.write_line(table(Tally.from_summary(s) for s in self.summaries))


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SessionTable(), "fault-session-table")
