"""Open-loop load generator: Poisson arrivals at a rate that follows a profile.

Open loop on purpose: each request is sent when its arrival time comes,
whether or not earlier ones have been answered. A closed loop (send, wait,
send) slows down exactly when the server does, and so hides the overload a
capacity test is meant to show. Arrivals are a non-homogeneous Poisson
process (thinning of a homogeneous one at the profile's peak), so the 5 s
rate windows the daemon samples are as bursty as real independent clients.

The rate follows a piecewise-linear profile (``"0:5,60:40,180:40,240:5"``,
seconds:requests/s) or a trace file replayed faster than real time
(``mark.demo.rate_profile``). Bodies are valid inputs built from the model's
own metadata (``GET /v2/models/{name}``), for the V1 or V2 endpoint. Every
request's outcome is kept (when it was due, when it went out, latency, status,
who served it if the response says), and a summary gives sent / ok / errors,
percentiles, the fraction within RT_max and how many spilled to Lambda
(``mark.demo.load_results``).

Every request carries an API key (``find_api_key``: the one given, else
``MARK_API_KEY``, else the one ``mark up`` saved in ``<data_dir>/api-key``).
Who served each request is told to admin keys only, and the spill count is read
from ``/metrics`` (the ``metrics`` scope); with a key that has neither, the
summary's spill count is "unknown".
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp
import numpy as np
import orjson
from numpy.typing import NDArray

from bouncer.wire import SERVED_BY_HEADER
from mark.demo.load_results import RequestResult, Summary, summarize
from mark.demo.rate_profile import LoadgenError, RateProfile, arrival_times
from mark.serve.auth import KEY_FILE, read_key_file

Api = Literal["v1", "v2"]

_V2_DTYPES: dict[str, str] = {
    "FP32": "float32",
    "FP64": "float64",
    "INT64": "int64",
    "INT32": "int32",
    "UINT8": "uint8",
    "BOOL": "bool",
}
# Where a response may name what served it; the first one present wins.
SERVED_BY_HEADERS = (SERVED_BY_HEADER, "X-Served-By")
_SPILLED_METRIC = re.compile(
    r'^mark_requests_total\{model="(?P<model>[^"]+)",outcome="spilled"\}\s+(?P<n>[0-9.eE+-]+)$',
    re.MULTILINE,
)


# -- what the model takes ------------------------------------------------------


@dataclass(frozen=True)
class ModelInput:
    """One model's input as its V2 metadata describes it (batch dimension dropped)."""

    model: str
    name: str
    datatype: str
    shape: tuple[int, ...]
    rt_max_ms: float | None = None

    @property
    def dtype(self) -> str:
        return _V2_DTYPES[self.datatype]

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> ModelInput:
        """Read ``GET /v2/models/{name}``; mark adds its SLO, other servers may not."""
        try:
            inp = meta["inputs"][0]
            shape = [int(d) for d in inp["shape"]]
            datatype = str(inp["datatype"])
            name = str(meta["name"])
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise LoadgenError(
                f"model metadata lacks inputs[0] name/shape/datatype ({exc})"
            ) from None
        if datatype not in _V2_DTYPES:
            raise LoadgenError(
                f"input datatype {datatype!r} is not supported; allowed: {', '.join(_V2_DTYPES)}"
            )
        if shape and shape[0] == -1:
            shape = shape[1:]
        if not shape or any(d <= 0 for d in shape):
            raise LoadgenError(f"input shape {inp['shape']} has a variable or empty dimension")
        slo = meta.get("slo")
        rt = float(slo["rt_max_ms"]) if isinstance(slo, Mapping) and "rt_max_ms" in slo else None
        return cls(name, str(inp.get("name", "input")), datatype, tuple(shape), rt)

    def random_row(self, rng: np.random.Generator) -> NDArray[Any]:
        """A valid instance: floats in [0, 1) (the demo model's scaled pixels), small ints."""
        if self.dtype.startswith("float"):
            return rng.random(self.shape).astype(self.dtype)
        if self.dtype == "bool":
            return rng.random(self.shape) < 0.5
        high = 256 if self.dtype == "uint8" else 10
        return rng.integers(0, high, self.shape).astype(self.dtype)

    def body(self, row: NDArray[Any], api: Api) -> bytes:
        """One request carrying one instance, as the chosen protocol wants it."""
        if api == "v1":
            return orjson.dumps({"instances": [row.tolist()]})
        return orjson.dumps(
            {
                "inputs": [
                    {
                        "name": self.name,
                        "shape": [1, *self.shape],
                        "datatype": self.datatype,
                        "data": row.reshape(-1).tolist(),
                    }
                ]
            }
        )


API_KEY_ENV = "MARK_API_KEY"


def find_api_key(data_dir: Path | None = None) -> str | None:
    """The key to send: ``MARK_API_KEY``, else ``<data_dir>/api-key`` (the one ``mark up``
    saved; ``data_dir`` defaults to the configured one, ``MARK_DATA_DIR`` included)."""
    key = os.environ.get(API_KEY_ENV, "").strip()
    if key:
        return key
    if data_dir is None:
        from mark.config import load_settings

        try:
            data_dir = load_settings().data_dir
        except Exception:  # a broken configuration: no saved key to find, not a failed run
            return None
    return read_key_file(data_dir / KEY_FILE)


def endpoint(base_url: str, model: str, api: Api) -> str:
    base = base_url.rstrip("/")
    if api == "v1":
        return f"{base}/v1/models/{model}:predict"
    return f"{base}/v2/models/{model}/infer"


async def fetch_model_input(
    session: aiohttp.ClientSession, base_url: str, model: str
) -> ModelInput:
    url = f"{base_url.rstrip('/')}/v2/models/{model}"
    try:
        async with session.get(url) as r:
            if r.status != 200:
                hint = _KEY_HINT if r.status in (401, 403) else ""
                raise LoadgenError(f"GET {url} answered {r.status}: {(await r.text())[:200]}{hint}")
            meta = await r.json()
    except aiohttp.ClientError as exc:
        raise LoadgenError(f"cannot reach {url}: {exc}") from None
    return ModelInput.from_metadata(meta)


_KEY_HINT = (
    f" (pass --api-key, set {API_KEY_ENV}, or run where <data_dir>/{KEY_FILE} holds the key "
    "`mark up` made; `mark keys create` makes others)"
)


async def spilled_count(session: aiohttp.ClientSession, base_url: str, model: str) -> int | None:
    """The daemon's own count of requests spilled to Lambda (``/metrics``), if it has one."""
    try:
        async with session.get(f"{base_url.rstrip('/')}/metrics") as r:
            if r.status != 200:
                return None
            text = await r.text()
    except aiohttp.ClientError:
        return None
    for m in _SPILLED_METRIC.finditer(text):
        if m["model"] == model:
            return int(float(m["n"]))
    return None


@dataclass
class LoadResult:
    profile: RateProfile
    model: ModelInput
    api: Api
    started_at: float  # wall-clock epoch seconds of offset 0
    outcomes: list[RequestResult] = field(default_factory=list)
    summary: Summary | None = None


def _served_by(headers: Mapping[str, str], payload: Any) -> str | None:
    for h in SERVED_BY_HEADERS:
        if h in headers:
            return headers[h]
    if isinstance(payload, dict):
        for holder in (payload, payload.get("parameters")):
            if isinstance(holder, dict) and isinstance(holder.get("served_by"), str):
                return str(holder["served_by"])
    return None


# -- the run ---------------------------------------------------------------------


ProgressFn = Callable[[float, int, int, int], None]
"""Called about twice a second with (offset s, sent, ok, errors)."""


async def run_load(
    base_url: str,
    model: str,
    profile: RateProfile,
    *,
    api: Api = "v2",
    seed: int = 0,
    timeout_s: float = 30.0,
    body_pool: int = 64,
    progress: ProgressFn | None = None,
    api_key: str | None = None,
) -> LoadResult:
    """Send the profile's Poisson arrivals to one model; return every outcome and a summary.

    ``api_key``: the key every request carries; None: ``find_api_key()``'s.
    """
    if api not in ("v1", "v2"):
        raise LoadgenError(f"api {api!r} is not supported; allowed: v1, v2")
    rng = np.random.default_rng(seed)
    key = api_key or find_api_key()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    conn = aiohttp.TCPConnector(limit=0)  # open loop: the client must never be the queue
    async with aiohttp.ClientSession(
        connector=conn, timeout=aiohttp.ClientTimeout(total=timeout_s), headers=headers
    ) as session:
        inp = await fetch_model_input(session, base_url, model)
        bodies = [inp.body(inp.random_row(rng), api) for _ in range(body_pool)]
        url = endpoint(base_url, model, api)
        spilled_before = await spilled_count(session, base_url, model)
        due = arrival_times(profile, rng)
        loop = asyncio.get_running_loop()
        result = LoadResult(profile, inp, api, started_at=time.time())
        t0 = loop.time()
        counts = {"ok": 0, "err": 0}

        async def one(k: int, due_s: float) -> None:
            sent = loop.time() - t0
            status, served, error = 0, None, None
            try:
                async with session.post(
                    url, data=bodies[k % len(bodies)], headers={"Content-Type": "application/json"}
                ) as r:
                    raw = await r.read()
                    status = r.status
                    payload = orjson.loads(raw) if raw else None
                    served = _served_by(r.headers, payload)
                    if status != 200:
                        msg = payload.get("error") if isinstance(payload, dict) else None
                        error = str(msg or raw[:200])
            except (TimeoutError, aiohttp.ClientError, orjson.JSONDecodeError) as exc:
                error = f"{type(exc).__name__}: {exc}"
            latency = loop.time() - t0 - sent
            o = RequestResult(due_s, sent, latency, status, served, error)
            result.outcomes.append(o)
            counts["ok" if o.ok else "err"] += 1

        async def report() -> None:
            assert progress is not None
            while True:
                progress(loop.time() - t0, len(tasks), counts["ok"], counts["err"])
                await asyncio.sleep(0.5)

        tasks: list[asyncio.Task[None]] = []
        reporter = asyncio.create_task(report()) if progress is not None else None
        try:
            for k, d in enumerate(due):
                wait = t0 + float(d) - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                elif k % 64 == 0:
                    await asyncio.sleep(0)  # behind schedule: still let answers in
                tasks.append(asyncio.create_task(one(k, float(d))))
            rest = t0 + profile.duration - loop.time()
            if rest > 0:
                await asyncio.sleep(rest)
            await asyncio.gather(*tasks)
        finally:
            if reporter is not None:
                reporter.cancel()
            if progress is not None:
                progress(loop.time() - t0, len(tasks), counts["ok"], counts["err"])
        spilled_after = await spilled_count(session, base_url, model)
    result.outcomes.sort(key=lambda o: o.due_s)
    spilled = (
        spilled_after - spilled_before
        if spilled_before is not None and spilled_after is not None
        else None
    )
    result.summary = summarize(result.outcomes, inp.rt_max_ms, spilled)
    return result


def rich_progress(total_s: float, profile: RateProfile) -> tuple[Any, ProgressFn]:
    """A rich progress bar over the run's seconds, and the callback that advances it."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(
        TextColumn("[bold]load[/]"),
        BarColumn(),
        TextColumn("{task.completed:>5.0f}/{task.total:.0f} s"),
        TextColumn("{task.fields[rate]:>6.1f} r/s"),
        TextColumn("sent {task.fields[sent]}  ok {task.fields[ok]}  errors {task.fields[err]}"),
        TimeRemainingColumn(),
    )
    task = bar.add_task("load", total=total_s, rate=0.0, sent=0, ok=0, err=0)

    def advance(t: float, sent: int, ok: int, err: int) -> None:
        rate = float(profile.rate(min(t, profile.duration)))
        bar.update(task, completed=min(t, total_s), rate=rate, sent=sent, ok=ok, err=err)

    return bar, advance
