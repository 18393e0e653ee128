"""How much latency the frontend adds, and the highest rate it sustains, on loopback.

Three processes: an instance agent serving a tiny TorchScript model, the
frontend (the daemon's own request path: ``mark.daemon.serving`` +
``start_api``, telemetry included) in front of it, and wrk as the client — a
C load generator, so the client is not what saturates first (an aiohttp client
in Python topped out below the frontend's rate).

1. Latency at ``--rate``: wrk's connections each wait an exponential think time
   between requests (mean chosen so the total is the target rate; one
   calibration run corrects it), small V1 requests. The same stream is sent
   straight to the agent (one-request batches, what the frontend sends at low
   load) and through the frontend, alternating ``--repeats`` times; the
   difference of the median p50/p99 is what the frontend adds.
2. Maximum sustained rate: closed-loop wrk with ``--connections`` connections
   for ``--seconds``; the completed requests per second, with their p99.

    apt-get install wrk
    .venv/bin/python benchmarks/bench_frontend.py [--seconds 10] [--rate 1000]
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bouncer.agent_token import TOKEN_ENV

ROOT = Path(__file__).resolve().parents[1]

LUA = r"""
local rate = tonumber(os.getenv("BENCH_RATE") or "0")
local conns = tonumber(os.getenv("BENCH_CONNS") or "1")
wrk.method = "POST"
wrk.body = os.getenv("BENCH_BODY")
wrk.headers["Content-Type"] = "application/json"
local key = os.getenv("BENCH_KEY")
if key then wrk.headers["Authorization"] = "Bearer " .. key end
local agent_token = os.getenv("BENCH_AGENT_TOKEN")
if agent_token then wrk.headers["X-Mark-Agent-Token"] = agent_token end
math.randomseed(tonumber(os.getenv("BENCH_SEED") or "1"))
if rate > 0 then
  function delay()
    return -math.log(1 - math.random()) * conns / rate * 1000
  end
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %d %.6f %.1f %.1f %.1f %d\n",
    summary.requests, summary.duration / 1e6, latency:percentile(50),
    latency:percentile(99), latency.max,
    e.status + e.connect + e.read + e.write + e.timeout))
end
"""


def _tiny_model(path: Path) -> None:
    import torch

    from mark.demo import save_torchscript

    torch.manual_seed(0)
    save_torchscript(torch.nn.Sequential(torch.nn.Linear(4, 2)).eval(), path)


def _spawn(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("READY "):
            return proc, f"http://127.0.0.1:{line.split()[1]}"
    raise RuntimeError(f"{args} exited before it was ready")


async def _frontend(agent_url: str) -> None:
    """The daemon's request path with one backend: the agent."""
    import asyncio

    import aiohttp

    from bouncer.agent_token import token_headers
    from bouncer.latency import BatchLatency
    from mark.clock import WallClock
    from mark.config import load_settings
    from mark.daemon import serving, start_api
    from mark.serve.auth import KeyCache, hash_secret, split_token
    from mark.serve.dispatcher import Backend
    from mark.state import ApiKeyRecord

    settings = load_settings(
        overrides={
            "api": {"host": "127.0.0.1", "port": 0},
            "models": [
                {
                    "name": "tiny",
                    "source": "unused",
                    "input": {"shape": [4]},
                    "slo": {"rt_max_ms": 1000, "sl_min": 0.98},
                }
            ],
        }
    )
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
    models = serving(settings, WallClock().now, session, None)
    async with session.get(f"{agent_url}/health", headers=token_headers()) as r:
        r.raise_for_status()
        table = {int(b): float(t) for b, t in (await r.json())["batch_latency_s"]}
    disp = models["tiny"].dispatcher
    assert disp is not None
    disp.set_backends(
        [Backend("i-bench", "local", agent_url, BatchLatency.from_mapping(table), 16, 0.0)]
    )
    # The API key every request carries (BENCH_KEY): its check is part of what is measured.
    parts = split_token(os.environ["BENCH_KEY"])
    assert parts is not None
    key = ApiKeyRecord(parts[0], "bench", ("inference",), hash_secret(parts[1]), 0.0)
    _, (_, port) = await start_api(settings, models, KeyCache.fixed([key]))
    print(f"READY {port}", flush=True)
    await asyncio.Event().wait()


def _wrk(
    script: Path, url: str, body: str, seconds: float, conns: int, rate: float
) -> dict[str, float]:
    env = {
        **os.environ,
        "BENCH_BODY": body,
        "BENCH_RATE": str(rate),
        "BENCH_CONNS": str(conns),
    }
    if "/v1/batch" in url:  # straight to the agent: it answers only the frontend's token
        env["BENCH_AGENT_TOKEN"] = os.environ[TOKEN_ENV]
    out = subprocess.run(
        ["wrk", "-t1", f"-c{conns}", f"-d{seconds:g}s", "--timeout", "10s", "-s", str(script), url],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    m = re.search(r"RESULT (\d+) ([\d.]+) ([\d.]+) ([\d.]+) ([\d.]+) (\d+)", out)
    if m is None:
        raise RuntimeError(f"wrk printed no result:\n{out}")
    n, dur, p50, p99, mx, errors = (float(g) for g in m.groups())
    return {
        "rps": n / dur,
        "p50_ms": p50 / 1000,
        "p99_ms": p99 / 1000,
        "max_ms": mx / 1000,
        "errors": errors,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=10.0, help="length of each wrk run")
    p.add_argument("--rate", type=float, default=1000.0, help="offered rate for the latency test")
    p.add_argument("--repeats", type=int, default=3, help="direct/frontend pairs at --rate")
    p.add_argument("--think-connections", type=int, default=64, help="connections at --rate")
    p.add_argument("--connections", type=int, default=32, help="connections for the max rate")
    p.add_argument("--serve-frontend", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_frontend:
        from bouncer import event_loop

        event_loop.run(_frontend(args.serve_frontend))
        return
    if shutil.which("wrk") is None:
        sys.exit("bench_frontend needs wrk, a C HTTP load generator: apt-get install wrk")

    from mark.serve.auth import issue

    os.environ["BENCH_KEY"] = issue("bench", ["inference"], 0.0)[1]  # frontend and wrk read it
    # The agent answers only requests that carry this (the frontend's, and wrk's direct ones).
    os.environ[TOKEN_ENV] = secrets.token_urlsafe(32)
    tmp = Path(tempfile.mkdtemp())
    script = tmp / "bench.lua"
    script.write_text(LUA)
    _tiny_model(tmp / "tiny.pt")
    agent, agent_url = _spawn(
        ["-m", "bouncer.agent", "--model-source", str(tmp / "tiny.pt"), "--input-shape", "4"]
    )
    front, front_url = _spawn([__file__, "--serve-frontend", agent_url])
    try:
        x = "[0.1, 0.2, 0.3, 0.4]"
        v1 = f'{{"instances": [{x}]}}'
        # A deadline a day away: the agent admits everything, as it would a fresh request.
        direct = f'{{"instances": [{x}], "dtype": "float32", "deadlines": [{time.time() + 86400}]}}'
        targets = {
            "direct to agent": (f"{agent_url}/v1/batch", direct),
            "through frontend": (f"{front_url}/v1/models/tiny:predict", v1),
        }
        c = args.think_connections
        _wrk(script, targets["through frontend"][0], v1, 2, c, 0)  # warm-up, both paths
        _wrk(script, targets["direct to agent"][0], direct, 2, c, 0)
        # Think time makes the rate fall short by the latency; one run per path calibrates.
        offered = {}
        for name, (url, body) in targets.items():
            r = _wrk(script, url, body, min(args.seconds, 5), c, args.rate)
            offered[name] = args.rate * args.rate / max(r["rps"], 1.0)
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in targets}
        for _ in range(args.repeats):
            for name, (url, body) in targets.items():
                runs[name].append(_wrk(script, url, body, args.seconds, c, offered[name]))
        print(
            f"at ~{args.rate:.0f} req/s, {args.repeats} × {args.seconds:g} s each "
            f"(small payload, loopback; median of runs):"
        )
        med = {}
        for name, rs in runs.items():
            med[name] = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            m = med[name]
            print(
                f"  {name:17s} p50 {m['p50_ms']:6.2f} ms  p99 {m['p99_ms']:6.2f} ms  "
                f"rate {m['rps']:6.0f} req/s  errors {sum(r['errors'] for r in rs):.0f}   "
                f"(p99 per run: {', '.join(format(r['p99_ms'], '.2f') for r in rs)})"
            )
        d, f = med["direct to agent"], med["through frontend"]
        print(
            f"  frontend adds     p50 {f['p50_ms'] - d['p50_ms']:6.2f} ms  "
            f"p99 {f['p99_ms'] - d['p99_ms']:6.2f} ms"
        )
        r = _wrk(script, targets["through frontend"][0], v1, args.seconds, args.connections, 0)
        print(
            f"maximum sustained rate through the frontend ({args.connections} connections, "
            f"closed loop): {r['rps']:.0f} req/s, p50 {r['p50_ms']:.2f} ms, "
            f"p99 {r['p99_ms']:.2f} ms, errors {r['errors']:.0f}"
        )
    finally:
        for proc in (front, agent):
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
