"""The processes a test leaves behind: a daemon's ``stop`` must leave none of its own.

Counted against the children alive when the test began (``children_before`` in
``tests/conftest.py``): under ``pytest -n`` one worker runs many tests, and what a
earlier test left running is not this test's to answer for.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path


def live_children(pid: int) -> list[int]:
    """The pids of ``pid``'s children that are alive (not zombies)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(") ", 1)[1].split()
                state, ppid = fields[0], int(fields[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid and state != "Z":
                out.append(int(entry.name))
    return out


def command_line(pid: int) -> str:
    """What ``pid`` runs, for a message ("?" once it has gone)."""
    try:
        raw = (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:160]


def left_behind(pid: int, before: Collection[int]) -> list[str]:
    """``pid``'s live children that were not alive in ``before``: pid and command line."""
    return [f"{p} {command_line(p)}" for p in live_children(pid) if p not in before]
