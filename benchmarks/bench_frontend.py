"""How much latency the frontend adds, and the highest rate it sustains, on loopback.

Three processes: an instance agent serving a tiny TorchScript model, the
frontend (REST API + dispatcher) in front of it, and this load generator
sending an open-loop Poisson stream of small V1 requests. The same stream is
sent straight to the agent (one-request batches, as the frontend would send at
low load) and through the frontend; the difference of the percentiles is what
the frontend adds. Then the rate is raised until the frontend stops keeping up.

    .venv/bin/python benchmarks/bench_frontend.py [--seconds 10] [--rate 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]


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
    """Serve the API + dispatcher with one backend: the agent."""
    from aiohttp import web

    from bouncer.latency import BatchLatency
    from mark.api.app import Served, build_app
    from mark.config import load_settings
    from mark.dispatcher import Backend, Dispatcher

    settings = load_settings(
        overrides={
            "models": [
                {
                    "name": "tiny",
                    "source": "unused",
                    "input": {"shape": [4]},
                    "slo": {"rt_max_ms": 1000, "sl_min": 0.98},
                }
            ]
        }
    )
    spec = settings.models[0]
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64))
    disp = Dispatcher("tiny", 1.0, "float32", time.time, session, None)
    async with session.get(f"{agent_url}/health") as r:
        table = {int(b): float(t) for b, t in (await r.json())["batch_latency_s"]}
    disp.set_backends(
        [Backend("i-bench", "local", agent_url, BatchLatency.from_mapping(table), 16, 0.0)]
    )
    disp.start()
    runner = web.AppRunner(build_app(settings, {"tiny": Served(spec, disp, None)}), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(f"READY {runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


async def _load(url: str, body_of: object, rate: float, seconds: float) -> dict[str, float]:
    """Open-loop Poisson arrivals at ``rate``; latency of each request, errors counted."""
    rng = np.random.default_rng(0)
    gaps = rng.exponential(1.0 / rate, size=int(rate * seconds * 1.2) + 10)
    lat: list[float] = []
    errors = 0
    conn = aiohttp.TCPConnector(limit=512)
    async with aiohttp.ClientSession(connector=conn) as s:

        async def one() -> None:
            nonlocal errors
            t0 = time.perf_counter()
            try:
                async with s.post(url, data=body_of()) as r:  # type: ignore[operator]
                    await r.read()
                    if r.status != 200:
                        errors += 1
                        return
            except aiohttp.ClientError:
                errors += 1
                return
            lat.append(time.perf_counter() - t0)

        tasks = []
        start = time.perf_counter()
        due = start
        for gap in gaps:
            due += gap
            if due - start > seconds:
                break
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one()))
        sent_in = time.perf_counter() - start
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
    arr = np.asarray(lat) * 1000 if lat else np.asarray([np.nan])
    return {
        "target_rps": rate,
        "sent_rps": len(tasks) / sent_in,
        "done_rps": len(lat) / elapsed,
        "p50_ms": float(np.percentile(arr, 50)),
        "p99_ms": float(np.percentile(arr, 99)),
        "errors": errors,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--rate", type=float, default=1000.0)
    p.add_argument("--max-rates", default="1000,2000,3000,4000,5000")
    p.add_argument("--serve-frontend", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_frontend:
        asyncio.run(_frontend(args.serve_frontend))
        return

    tmp = Path(tempfile.mkdtemp())
    _tiny_model(tmp / "tiny.pt")
    agent, agent_url = _spawn(
        ["-m", "bouncer.agent", "--model-source", str(tmp / "tiny.pt"), "--input-shape", "4"]
    )
    front, front_url = _spawn([__file__, "--serve-frontend", agent_url])
    try:
        x = [0.1, 0.2, 0.3, 0.4]
        v1 = json.dumps({"instances": [x]}).encode()

        def direct_body() -> bytes:
            return json.dumps(
                {"instances": [x], "dtype": "float32", "deadlines": [time.time() + 10]}
            ).encode()

        asyncio.run(_load(f"{front_url}/v1/models/tiny:predict", lambda: v1, 200, 2))  # warm-up
        direct = asyncio.run(_load(f"{agent_url}/v1/batch", direct_body, args.rate, args.seconds))
        via = asyncio.run(
            _load(f"{front_url}/v1/models/tiny:predict", lambda: v1, args.rate, args.seconds)
        )
        print(f"at {args.rate:.0f} req/s for {args.seconds:.0f} s (small payload, loopback):")
        for name, r in (("direct to agent", direct), ("through frontend", via)):
            print(
                f"  {name:17s} p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  "
                f"done {r['done_rps']:7.0f} req/s  errors {r['errors']:.0f}"
            )
        print(
            f"  frontend adds     p50 {via['p50_ms'] - direct['p50_ms']:7.2f} ms  "
            f"p99 {via['p99_ms'] - direct['p99_ms']:7.2f} ms"
        )
        best = 0.0
        for rate in [float(r) for r in args.max_rates.split(",")]:
            r = asyncio.run(
                _load(f"{front_url}/v1/models/tiny:predict", lambda: v1, rate, args.seconds)
            )
            kept_up = r["errors"] == 0 and r["done_rps"] >= 0.95 * rate and r["p99_ms"] < 100
            print(
                f"  offered {rate:6.0f} req/s: sent {r['sent_rps']:6.0f}, done "
                f"{r['done_rps']:6.0f}, p99 {r['p99_ms']:8.2f} ms -> "
                f"{'sustained' if kept_up else 'not sustained'}"
            )
            if not kept_up:
                break
            best = rate
        print(f"maximum sustained rate through the frontend: {best:.0f} req/s")
    finally:
        for proc in (front, agent):
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
