"""What every command shares: the configuration options and how errors end a command."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import typer
from rich.console import Console

from bouncer import event_loop
from mark.config import Settings, load_settings, parse_overrides

T = TypeVar("T")

# Piped output is not wrapped at 80 columns: tables stay one row per line for grep and less.
console = Console(width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 200)


@dataclass
class CliState:
    """Set by the top-level callback; settings are loaded on first use."""

    config_file: Path | None = None
    overrides: list[str] = field(default_factory=list)
    _settings: Settings | None = None

    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = load_settings(self.config_file, parse_overrides(self.overrides))
        return self._settings


def state(ctx: typer.Context) -> CliState:
    obj = ctx.find_root().obj
    if not isinstance(obj, CliState):
        obj = CliState()
        ctx.find_root().obj = obj
    return obj


def fail(message: str, code: int = 2) -> NoReturn:
    """End the command with a one-line message on stderr and a non-zero exit."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    return event_loop.run(coro)


async def cancelled_on_sigterm(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro``; SIGTERM cancels it as Ctrl-C does, so its ``finally`` runs: a
    command that started agents, runtimes or a cloud instance stops or ends them.

    Without this SIGTERM (``kill``, a job's timeout) ends the process at once and
    leaves them behind: a demo's agents in their own sessions, the instance ``mark
    profile --type`` launched, billed until someone notices. The caller gets the
    ``CancelledError`` and ends with ``SIGTERM_EXIT``.
    """
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await coro
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


SIGTERM_EXIT = 128 + signal.SIGTERM
"""The exit code of a command SIGTERM ended (as a shell reports one it killed)."""


def is_interactive() -> bool:
    return sys.stdout.isatty()
