"""The CLI as a user runs it: a real process, real exit codes, no tracebacks."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

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


def test_config_show_has_the_spend_rails_and_they_can_be_set() -> None:
    out = run("config", "show")
    assert out.returncode == 0, out.stderr
    assert "max_hourly_per_model: 5.0" in out.stdout and "max_hourly_cluster: 10.0" in out.stdout
    off = run("--set", "budget.max_hourly_cluster=null", "config", "show")
    assert off.returncode == 0, off.stderr
    assert "max_hourly_cluster: null" in off.stdout
    bad = run("--set", "budget.max_hourly_per_model=-1", "config", "show")
    assert bad.returncode == 2 and "max_hourly_per_model" in bad.stderr


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


def test_config_show_masks_the_database_password() -> None:
    url = "postgresql://mark:s3cret@db.internal:5432/mark"
    for fmt in ("yaml", "json"):
        out = run("--set", f"database_url={url}", "config", "show", "--format", fmt)
        assert out.returncode == 0, out.stderr
        assert "s3cret" not in out.stdout and "mark:***@db.internal:5432/mark" in out.stdout


def test_db_upgrade_migrates_a_postgres_database_by_url(pg_url: str) -> None:
    before = run("--set", f"database_url={pg_url}", "db", "current")
    assert "database: empty" in before.stdout
    up = run("--set", f"database_url={pg_url}", "db", "upgrade")
    assert up.returncode == 0, up.stderr
    after = run("--set", f"database_url={pg_url}", "db", "current")
    assert "database: 0007; code expects: 0007" in after.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: object, key: str) -> dict[str, Any]:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        reply: dict[str, Any] = json.load(r)
        return reply


def test_up_serves_real_predictions_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    """The README's main command: the printed curl returns a real prediction (V1 and V2)."""
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
        assert proc.stdout is not None
        printed = ""
        deadline = time.monotonic() + 120
        while "Press Ctrl-C" not in printed:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            printed += line
            assert time.monotonic() < deadline
        curl = next(x for x in printed.splitlines() if "predict:" in x)
        payload = json.loads(curl.split(" -d '", 1)[1].rstrip("'"))
        # the printed curl carries the key mark up made and saved (0600) in the data dir
        key = curl.split('-H "Authorization: Bearer ', 1)[1].split('"', 1)[0]
        assert (tmp_path / "api-key").read_text().strip() == key
        assert (tmp_path / "api-key").stat().st_mode & 0o777 == 0o600
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(f"{url}/v2/models/digits", timeout=5)
        assert denied.value.code == 401
        # the printed example is the first image of scikit-learn's digits: a zero
        v1 = _post(f"{url}/v1/models/digits:predict", payload, key)
        (logits,) = v1["predictions"]
        assert max(range(10), key=lambda i: logits[i]) == 0
        flat = [v for row in payload["instances"][0][0] for v in row]
        v2 = _post(
            f"{url}/v2/models/digits/infer",
            {
                "id": "r1",
                "inputs": [
                    {"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": flat}
                ],
            },
            key,
        )
        (out,) = v2["outputs"]
        assert v2["id"] == "r1" and out["shape"] == [1, 10] and out["datatype"] == "FP32"
        assert out["data"] == pytest.approx(logits, rel=1e-5)
        scrape = urllib.request.Request(f"{url}/metrics", headers={"X-Api-Key": key})
        with urllib.request.urlopen(scrape, timeout=5) as r:
            metrics = r.read().decode()
        assert 'mark_requests_total{model="digits",outcome="spilled"} 2' in metrics
        assert (tmp_path / "mark.db").is_file()  # the store was migrated on start
        children = subprocess.run(
            ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True
        ).stdout.split()
        assert children  # the Lambda runtime that served the requests
    finally:
        proc.send_signal(signal.SIGINT)
        out_text, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "mark stopped." in out_text
    assert (
        subprocess.run(["pgrep", "-f", f"MARK_DATA_DIR={tmp_path}"], capture_output=True).stdout
        == b""
    )


def test_plan_explain_and_status_read_the_store(tmp_path: Path) -> None:
    import asyncio

    from mark.state import (
        Decision,
        InstanceRecord,
        LatencyRollup,
        PlanRecord,
        ProfileRecord,
        open_store,
    )

    url = f"sqlite+aiosqlite:///{tmp_path}/m.db"
    now = time.time()

    async def seed() -> None:
        store = await open_store(url, upgrade=True)
        await store.record_plan(
            PlanRecord(
                "digits",
                now,
                "greedy",
                [12.0, 15.5],
                0.17,
                {
                    "lines": ["buy c5.large/on-demand: $0.0001/req over steps 5-59"],
                    "held": [],
                    "offerings": [["c5.large/on-demand", 41.5, "measured"]],
                    "rated": "in a pool (spill answers in time, or as configured)",
                },
                [
                    Decision(
                        "digits",
                        now,
                        "forecast-clipped",
                        "forecast peak 368.1 r/s is above 2× the observed peak 28.8 r/s",
                    ),
                    Decision(
                        "digits", now, "launch", "cheapest per request", "c5.large", "on-demand", 2
                    ),
                ],
            )
        )
        await store.upsert_instance(
            InstanceRecord(
                "i-0abc",
                "digits",
                "c5.large",
                "on-demand",
                "serving",
                "ready",
                0.085,
                now - 100,
                now,
            )
        )
        await store.put_profile(
            ProfileRecord("digits", "c5.large", "measured", ((1, 0.004),), now - 90)
        )
        await store.add_latency_rollup(
            LatencyRollup("digits", (now // 60 - 1) * 60, 200, 20.0, 60.0, 90.0, 196, 4, 3, 0)
        )
        await store.close()

    asyncio.run(seed())
    out = run("--set", f"database_url={url}", "plan", "--explain")
    assert out.returncode == 0, out.stderr
    assert "launch: 2× c5.large/on-demand — cheapest per request" in out.stdout
    assert "forecast-clipped — forecast peak 368.1 r/s is above 2×" in out.stdout
    assert (
        "offering c5.large/on-demand: 41.5 r/s within the SLO alone, profile measured" in out.stdout
    )
    assert "each instance rated in a pool (spill answers in time" in out.stdout
    assert "buy c5.large/on-demand" in out.stdout and "15.5 r/s" in out.stdout
    st = run("--set", f"database_url={url}", "status")
    assert st.returncode == 0, st.stderr
    assert "i-0abc" in st.stdout and "98.00%" in st.stdout
    row = next(line for line in st.stdout.splitlines() if "i-0abc" in line)
    assert "ready" in row and "measured" in row
    none = run("--set", f"database_url={url}", "plan", "--model", "nope")
    assert none.returncode == 2 and "unknown model 'nope'" in none.stderr


def test_profile_times_real_inference_and_tunes_batching(tmp_path: Path) -> None:
    out_file = tmp_path / "p.json"
    out = run(
        "profile",
        "--runs",
        "2",
        "--batches",
        "1,4",
        "--out",
        str(out_file),
        env={"MARK_DATA_DIR": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr
    prof = json.loads(out_file.read_text())
    assert set(prof["batch_latency_s"]) == {"1", "4"}
    assert all(t > 0 for t in prof["batch_latency_s"].values())
    assert prof["n_batch"] in (1, 4) and "batching: N_batch" in out.stdout
    # The hardware it was measured on; off EC2 it is labelled "local", which rates no type.
    assert prof["hardware"]["vcpus"] >= 1 and prof["hardware"]["cpu"]
    if prof["instance_type"] == "local":
        assert "rates no instance type" in out.stdout
    bad = run("profile", "--batches", "one,two")
    assert bad.returncode == 2 and "comma-separated integers" in bad.stderr


def test_profile_spill_times_the_local_lambda_and_keeps_the_instance_profile(
    tmp_path: Path,
) -> None:
    out_file = tmp_path / "p.json"
    env = {"MARK_DATA_DIR": str(tmp_path)}
    first = run("profile", "--runs", "1", "--batches", "1", "--out", str(out_file), env=env)
    assert first.returncode == 0, first.stderr
    out = run(
        "profile", "--spill", "--runs", "2", "--batches", "1,4", "--out", str(out_file), env=env
    )
    assert out.returncode == 0, out.stderr
    assert "(lambda-2048mb, local world)" in out.stdout  # the title, wrapped
    entries = json.loads(out_file.read_text())["profiles"]
    kinds = {e["instance_type"]: e for e in entries}
    assert len(entries) == 2 and "lambda-2048mb" in kinds  # the instance profile kept
    assert set(kinds["lambda-2048mb"]["batch_latency_s"]) == {"1", "4"}
    again = run(
        "profile", "--spill", "--runs", "1", "--batches", "2", "--out", str(out_file), env=env
    )
    assert again.returncode == 0, again.stderr
    kinds = {e["instance_type"]: e for e in json.loads(out_file.read_text())["profiles"]}
    assert len(kinds) == 2 and set(kinds["lambda-2048mb"]["batch_latency_s"]) == {"2"}
    both = run("profile", "--spill", "--type", "c5.large")
    assert both.returncode == 2 and "--spill times the spill function" in both.stderr


def test_config_check_says_which_types_a_model_cannot_use(tmp_path: Path) -> None:
    out = run("config", "check")
    assert out.returncode == 0, out.stderr
    assert (
        "digits: inf1.xlarge not planned: Inferentia needs a compiled Neuron artifact "
        "(models[].neuron_artifact)" in out.stdout
    )
    assert "g4dn.xlarge not planned" not in out.stdout and "c5.large not planned" not in out.stdout
    cfg = tmp_path / "c.yaml"
    model = "input: {shape: [1, 8, 8]}, slo: {rt_max_ms: 100, sl_min: 0.98}"
    cfg.write_text(
        "offerings: {types: [inf1.xlarge]}\nmodels:\n"
        f"  - {{name: plain, source: 'mark.demo:digits_model', {model}}}\n"
        f"  - {{name: compiled, source: 'mark.demo:digits_model', {model},\n"
        "      neuron_artifact: m.pt}\n"
    )
    only_inf = run("--config", str(cfg), "config", "check")
    assert "plain: inf1.xlarge not planned" in only_inf.stdout
    assert "compiled:" not in only_inf.stdout
    assert (
        only_inf.returncode == 1
        and "no configured instance type can serve plain" in only_inf.stderr
    )


def test_profile_times_a_variant_under_its_own_name(tmp_path: Path) -> None:
    import torch
    import yaml

    d = tmp_path / "pair"
    (d / "1").mkdir(parents=True)
    for name, width in (("large", 64), ("small", 4)):
        net = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Linear(width, 2)).eval()
        torch.jit.save(torch.jit.script(net), str(d / "1" / f"{name}.pt"))
    manifest = {
        "format": "torchscript",
        "inputs": [{"name": "input", "dtype": "float32", "shape": [4]}],
        "outputs": [{"name": "output", "dtype": "float32", "shape": [2]}],
        "slo": {"rt_max_ms": 100, "sl_min": 0.98, "accuracy_floor": 0.75},
        "variants": [
            {"name": "large", "artifact": "large.pt", "accuracy": 0.8, "metric": "m"},
            {"name": "small", "artifact": "small.pt", "accuracy": 0.7, "metric": "m"},
        ],
    }
    (d / "model.yaml").write_text(yaml.safe_dump(manifest))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"models: [{{path: {d}}}]\n")
    out_file = tmp_path / "small.json"
    env = {"MARK_DATA_DIR": str(tmp_path)}
    args = ("--config", str(cfg), "profile", "--runs", "1", "--batches", "1,2")
    out = run(*args, "--variant", "small", "--out", str(out_file), env=env)
    assert out.returncode == 0, out.stderr
    prof = json.loads(out_file.read_text())
    assert prof["model"] == "small" and set(prof["batch_latency_s"]) == {"1", "2"}
    bad = run(*args, "--variant", "tiny", env=env)
    assert (
        bad.returncode == 2 and "has no variant 'tiny' (its variants: large, small)" in bad.stderr
    )
