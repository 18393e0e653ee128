"""This process's id as one of a cluster's frontends: the lease holder, the source of its
telemetry rows, its row among the frontends."""

from __future__ import annotations

import os
import secrets
import socket

_FRONTEND_ID = f"{socket.gethostname()[:64]}:{os.getpid()}:{secrets.token_hex(4)}"


def frontend_id() -> str:
    """Host, pid and a random part (a pid is reused across restarts and containers), the
    same for the process's life and unique to it."""
    return _FRONTEND_ID
