"""A watched child ends when the process that started it dies, even by SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bouncer.parent_watch import ENV, watch_parent_from_env

ROOT = Path(__file__).resolve().parents[2]

# The middle process starts a watched grandchild, prints its pid, then waits to be killed.
MIDDLE = f"""
import os, subprocess, sys, time
child = subprocess.Popen(
    [sys.executable, "-c",
     "from bouncer.parent_watch import watch_parent_from_env; import time; "
     "watch_parent_from_env(0.1); time.sleep(600)"],
    env={{**os.environ, "{ENV}": str(os.getpid())}},
    start_new_session=True,
)
print(child.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_a_watched_child_ends_when_its_parent_is_killed() -> None:
    middle = subprocess.Popen(
        [sys.executable, "-c", MIDDLE], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert middle.stdout is not None
    child = int(middle.stdout.readline())
    try:
        time.sleep(0.5)
        assert _alive(child), "the watched child ended while its parent lived"
        middle.send_signal(signal.SIGKILL)
        middle.wait()
        deadline = time.monotonic() + 20
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), "the watched child outlived its killed parent"
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
        if middle.poll() is None:
            middle.kill()


def test_no_watch_without_the_variable_and_a_clear_error_for_junk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert watch_parent_from_env() is None
    monkeypatch.setenv(ENV, "not-a-pid")
    with pytest.raises(ValueError, match=ENV):
        watch_parent_from_env()
