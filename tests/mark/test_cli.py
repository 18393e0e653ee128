"""The CLI as a user runs it: a real process, real exit codes, no tracebacks."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

MARK = [sys.executable, "-m", "mark.cli.main"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MARK, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_help_lists_the_commands_that_exist() -> None:
    out = run("--help")
    assert out.returncode == 0
    for cmd in ("catalog", "config", "db", "up"):
        assert cmd in out.stdout


def test_catalog_inferentia_json_lists_inf1_and_inf2_in_both_markets() -> None:
    out = run("catalog", "--accelerator", "inferentia", "--format", "json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    kinds = {(r["instance_type"].split(".")[0], r["market"]) for r in rows}
    assert kinds == {(f, m) for f in ("inf1", "inf2") for m in ("on-demand", "spot")}
    prices = {(r["instance_type"], r["market"]): r["price_per_hour"] for r in rows}
    assert prices[("inf2.xlarge", "on-demand")] == 0.7582
    assert prices[("inf2.xlarge", "spot")] == 0.1257


def test_catalog_table_and_filters() -> None:
    out = run("catalog", "--family", "c5", "--market", "spot", "--max-price", "0.1")
    assert out.returncode == 0, out.stderr
    assert "c5.large" in out.stdout and "c5.xlarge" in out.stdout
    assert "c5.2xlarge" not in out.stdout  # 0.1511 > 0.1
    none = run("catalog", "--family", "c5", "--accelerator", "gpu")
    assert none.returncode == 1 and "no offering matches" in none.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--set", "offerings.types=[c5.huge]", "config", "check"), "'c5.huge'"),
        (("--set", "slo_monitor.instance_type=zz.top", "config", "show"), "zz.top"),
        (("--config", "/nonexistent.yaml", "config", "show"), "does not exist"),
        (("catalog", "--type", "c5.huge"), "unknown instance type"),
        (("--set", "database_url=postgresql://postgres@127.0.0.1:1/x", "db", "upgrade"), "cannot"),
    ],
)
def test_user_errors_end_in_one_line_and_exit_2(args: tuple[str, ...], needle: str) -> None:
    out = run(*args)
    assert out.returncode == 2
    assert needle in out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_config_show_reflects_every_source(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("world: sim\ntimings: {cooldown_s: 90}\n")
    out = run(
        "--config",
        str(cfg),
        "--set",
        "api.port=9999",
        "config",
        "show",
        "--format",
        "json",
        env={"MARK_AWS__REGION": "eu-west-1"},
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["world"] == "sim" and data["timings"]["cooldown_s"] == 90
    assert data["api"]["port"] == 9999 and data["aws"]["region"] == "eu-west-1"
    assert data["database_url"].startswith("sqlite+aiosqlite:///")


def test_db_upgrade_migrates_a_postgres_database_by_url(pg_url: str) -> None:
    before = run("--set", f"database_url={pg_url}", "db", "current")
    assert "database: empty" in before.stdout
    up = run("--set", f"database_url={pg_url}", "db", "upgrade")
    assert up.returncode == 0, up.stderr
    after = run("--set", f"database_url={pg_url}", "db", "current")
    assert "database: 0001; code expects: 0001" in after.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_up_serves_health_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    port = _free_port()
    proc = subprocess.Popen(
        [*MARK, "up", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "MARK_DATA_DIR": str(tmp_path)},
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=2) as r:
                    assert json.load(r) == {"ready": True}
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
        with urllib.request.urlopen(f"{url}/v2/models/digits", timeout=2) as r:
            meta = json.load(r)
        assert meta["inputs"][0]["shape"] == [-1, 1, 8, 8]
        assert (tmp_path / "mark.db").is_file()  # the store was migrated on start
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "mark is up" in out and "mark stopped." in out
