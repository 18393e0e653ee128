"""The daemon's processes run on uvloop unless told otherwise."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from bouncer import event_loop


async def _loop_type() -> type[asyncio.AbstractEventLoop]:
    return type(asyncio.get_running_loop())


def test_run_uses_uvloop_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(event_loop.ENV, raising=False)
    assert issubclass(event_loop.run(_loop_type()), uvloop.Loop)


def test_the_standard_loop_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(event_loop.ENV, "asyncio")
    assert not issubclass(event_loop.run(_loop_type()), uvloop.Loop)
