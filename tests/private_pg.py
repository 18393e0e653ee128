"""A private PostgreSQL server a test may stop and start (never the shared one).

``initdb`` and ``pg_ctl`` from ``/usr/lib/postgresql/*/bin`` (or ``MARK_TEST_PG_BIN``),
run as the current user, or as ``postgres`` through ``runuser`` when the tests run as
root (``initdb`` refuses root); a data directory of its own in a fresh temporary
folder, a free port on 127.0.0.1, trust authentication, no fsync. ``available()`` says
why it cannot run here, for ``pytest.skip``.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _bin_dir() -> Path | None:
    env = os.environ.get("MARK_TEST_PG_BIN")
    found = [env] if env else sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for d in found:
        if (Path(d) / "initdb").exists() and (Path(d) / "pg_ctl").exists():
            return Path(d)
    return None


def _as_user() -> list[str]:
    """The command prefix that runs PostgreSQL's tools as a user other than root."""
    if os.geteuid() != 0:
        return []
    return ["runuser", "-u", "postgres", "--"]


def available() -> str | None:
    """None when a private server can run here, else why not."""
    if _bin_dir() is None:
        return "no PostgreSQL server binaries (initdb, pg_ctl) in /usr/lib/postgresql/*/bin"
    if os.geteuid() == 0 and (shutil.which("runuser") is None or not _has_user("postgres")):
        return "running as root without runuser or a postgres user to run initdb as"
    return None


def _has_user(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivatePostgres:
    """One server: ``start``, ``stop`` (fast shutdown: connections are cut), ``url``."""

    def __init__(self) -> None:
        bin_dir = _bin_dir()
        assert bin_dir is not None, available()
        self.bin = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="mark-pg-"))
        self.port = _free_port()
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run(
            [*_as_user(), str(self.bin / tool), *args],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=60,
        )

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = str(self.root / "log")
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", log, "-w", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def remove(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError):
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    """A started private server, stopped and removed on the way out."""
    pg = PrivatePostgres()
    try:
        pg.start()
        yield pg
    finally:
        pg.remove()
