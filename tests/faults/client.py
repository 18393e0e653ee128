"""The fault suite's client, in a process of its own so it does not share the daemon's loop.

``python -m tests.faults.client URL PROFILE SEED TIMEOUT OUT`` sends the seeded
Poisson arrivals of ``PROFILE`` (open loop, as ``mark.demo.loadgen.run_load``
does, from the same ``arrival_times``) to the ``digits`` model's V2 endpoint.
Unlike ``run_load`` it gives every request an id (``r<k>``, sent as the V2
``id`` and echoed back) and keeps what each answer said, so the harness can
tell a request answered twice, or answered with another input's output, from
one answered once. It prints ``START`` when the first arrival is due (the
harness times its fault from that line) and writes to OUT, as JSON, the rows
it sent (``bodies``), how many requests it planned (``planned``) and one
outcome per answer (``outcomes``). The key is ``MARK_API_KEY`` (an admin key:
who served each request comes back in ``X-Mark-Served-By``).

An optional sixth argument, ``LAG`` seconds, makes the client behave as a load
balancer in front of the daemon: it polls ``/v2/health/ready`` every
``READY_POLL_S`` and sends nothing more ``LAG`` seconds after the readiness
first fails (its arrivals from then on are not sent, counted in ``withheld``;
``planned`` is then what it sent). A request refused at the TCP level
(connection refused: the daemon no longer listens, nothing was taken) is
recorded with status ``REFUSED`` and its reason, not as a request without an
answer: the client knows at once it was not taken.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import aiohttp
import numpy as np
import orjson

from bouncer.wire import SERVED_BY_HEADER
from mark.demo.loadgen import endpoint, fetch_model_input, find_api_key
from mark.demo.rate_profile import RateProfile, arrival_times

MODEL = "digits"
BODIES = 64
READY_POLL_S = 0.02
REFUSED = -1
"""The status of a request whose connection was refused (never taken by the daemon)."""


async def run(
    url: str, profile: str, seed: int, timeout_s: float, lag_s: float | None = None
) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    key = find_api_key()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    outcomes: list[dict[str, Any]] = []
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),  # open loop: the client is never the queue
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        headers=headers,
    ) as session:
        inp = await fetch_model_input(session, url, MODEL)
        rows = [inp.random_row(rng) for _ in range(BODIES)]
        inputs = [
            {
                "name": inp.name,
                "shape": [1, *inp.shape],
                "datatype": inp.datatype,
                "data": row.reshape(-1).tolist(),
            }
            for row in rows
        ]
        due = arrival_times(RateProfile.parse(profile), rng)
        target = endpoint(url, MODEL, "v2")
        loop = asyncio.get_running_loop()

        async def one(k: int, due_s: float) -> None:
            rid = f"r{k}"
            body = orjson.dumps({"id": rid, "inputs": [inputs[k % BODIES]]})
            sent = loop.time() - t0
            out: dict[str, Any] = {"id": rid, "body": k % BODIES, "due_s": due_s, "sent_s": sent}
            out["sent_at"] = time.time()  # wall clock, to compare with the harness's
            status, served, error, echo, output = 0, None, None, None, None
            retry_after = None
            try:
                async with session.post(
                    target, data=body, headers={"Content-Type": "application/json"}
                ) as r:
                    raw = await r.read()
                    status = r.status
                    payload = orjson.loads(raw) if raw else None
                    served = r.headers.get(SERVED_BY_HEADER)
                    retry_after = r.headers.get("Retry-After")
                    if isinstance(payload, dict):
                        echo = payload.get("id")
                        if status == 200:
                            output = payload["outputs"][0]["data"]
                        else:
                            error = payload.get("error")
                    if status != 200 and not error:
                        error = raw[:200].decode(errors="replace")
            except aiohttp.ClientConnectorError as exc:
                refused = isinstance(exc.os_error, ConnectionRefusedError)
                status = REFUSED if refused else 0  # refused: nothing taken, known at once
                what = "connection refused (nothing taken)" if refused else type(exc).__name__
                error = f"{what}: {exc}"
            except (TimeoutError, aiohttp.ClientError) as exc:
                error = f"{type(exc).__name__}: {exc}"  # no answer: status stays 0
            except (orjson.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
                error = f"malformed answer: {type(exc).__name__}: {exc}"
            out.update(
                latency_s=loop.time() - t0 - sent,
                status=status,
                served_by=served,
                error=error,
                echo=echo,
                output=output,
                retry_after=retry_after,
            )
            outcomes.append(out)

        unready_at: list[float] = []  # when the readiness first failed (lag_s given)

        async def watch_readiness() -> None:
            while True:
                try:
                    async with session.get(f"{url}/v2/health/ready") as r:
                        ok = r.status == 200
                except (TimeoutError, aiohttp.ClientError):
                    ok = False
                if not ok:
                    unready_at.append(loop.time())
                    return
                await asyncio.sleep(READY_POLL_S)

        tasks: list[asyncio.Task[None]] = []
        t0 = loop.time()
        watcher = asyncio.create_task(watch_readiness()) if lag_s is not None else None
        print("START", flush=True)
        for k, d in enumerate(due):
            wait = t0 + float(d) - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            elif k % 64 == 0:
                await asyncio.sleep(0)  # behind schedule: still let answers in
            if lag_s is not None and unready_at and loop.time() >= unready_at[0] + lag_s:
                break  # the balancer has taken the daemon out: nothing more is sent to it
            tasks.append(asyncio.create_task(one(k, float(d))))
        if watcher is not None:
            watcher.cancel()
        await asyncio.gather(*tasks)
    return {
        "planned": len(tasks),
        "withheld": len(due) - len(tasks),
        "bodies": [row.tolist() for row in rows],
        "outcomes": outcomes,
    }


if __name__ == "__main__":
    url, profile, seed, timeout, out = sys.argv[1:6]
    lag = float(sys.argv[6]) if len(sys.argv) > 6 else None
    result = asyncio.run(run(url, profile, int(seed), float(timeout), lag))
    with open(out, "w") as f:
        json.dump(result, f)
