"""End this process when the process that started it is gone.

The local world's instances are agent processes the daemon starts (and its
Lambda runtimes likewise). A daemon that dies without stopping them (kill -9,
OOM) would leave them serving nobody, holding ports and memory, and a restarted
daemon starts agents of its own for the fleet it adopts. So a child started
with a watch asks to be told: a thread polls the parent's pid (portable, unlike
Linux's ``PR_SET_PDEATHSIG``, which also fires when merely the *thread* that
forked exits) and sends this process SIGTERM, its normal stop, once the parent
has changed. On EC2 an agent runs under systemd with no watch.
"""

from __future__ import annotations

import os
import signal
import threading
import time

ENV = "MARK_EXIT_WITH_PARENT"
"""Set to the parent's pid by whoever starts a watched child."""


def parent_is(pid: int) -> bool:
    return os.getppid() == pid


def watch_parent(pid: int, every_s: float = 0.5) -> threading.Thread:
    """SIGTERM to this process once its parent is no longer ``pid`` (checked now, then every
    ``every_s``). Returns the watching thread (a daemon thread: it never holds up an exit)."""

    def watch() -> None:
        while parent_is(pid):
            time.sleep(every_s)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread


def watch_parent_from_env(every_s: float = 0.5) -> threading.Thread | None:
    """``watch_parent`` for the pid in ``$MARK_EXIT_WITH_PARENT``; None when it is unset."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return None
    try:
        pid = int(value)
    except ValueError:
        raise ValueError(f"{ENV} must be a process id, got {value!r}") from None
    return watch_parent(pid, every_s)
