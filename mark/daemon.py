"""The daemon's lifecycle: open the store, serve the API, stop cleanly on a signal."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable

from aiohttp import web

from mark.api.app import build_app
from mark.config import Settings
from mark.state import open_store


async def serve(settings: Settings, on_ready: Callable[[str], None] | None = None) -> None:
    """Run until SIGINT/SIGTERM; every resource opened here is closed on the way out."""
    store = await open_store(settings.db_url, upgrade=True)
    runner = web.AppRunner(build_app(settings), handle_signals=False)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await runner.setup()
        site = web.TCPSite(runner, settings.api.host, settings.api.port)
        await site.start()
        if on_ready is not None:
            host, port = runner.addresses[0][:2]
            on_ready(f"http://{host}:{port}")
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
        await runner.cleanup()
        await store.close()
