"""Fixtures for the local Lambda tests: where the project is, the fixture models, live runtimes."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]  # the runtimes import `tests.lambda_rt.*` from here


def _awslambdaric_children() -> list[int]:
    """Pids of live processes started by this test process that run awslambdaric."""
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == me and b"awslambdaric" in cmdline:
            found.append(int(entry.name))
    return found


@pytest.fixture
def project_root() -> Path:
    return ROOT


@pytest.fixture
def runtime_children() -> Callable[[], list[int]]:
    """Call it to list this process's awslambdaric children that are still alive."""
    return _awslambdaric_children


@pytest.fixture(scope="session")
def fixture_models() -> ModuleType:
    """``fixtures_model`` loaded by path, the same code the runtimes import by name."""
    spec = importlib.util.spec_from_file_location(
        "lambda_rt_fixtures_model", Path(__file__).with_name("fixtures_model.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
