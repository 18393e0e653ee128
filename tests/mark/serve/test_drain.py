"""Graceful drain and a synced start, through the real daemon ``start``/``stop``/``serve``.

The daemon runs in-process with its real store, API, dispatchers and telemetry, and
real aiohttp clients; only the world is a stand-in (``open_world`` patched): a spill
function held at a gate, and agents that are real aiohttp servers on loopback
speaking ``bouncer.wire``. Requests in flight when the daemon stops: every one sent
is answered exactly once (its result, or an explicit error), and no row runs twice.
Times are asserted as upper bounds with generous slack, never tightly.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from bouncer.latency import BatchLatency
from bouncer.wire import (
    BATCH_PATH,
    NDJSON_TYPE,
    batch_size,
    decode_batch,
    encode_outputs,
    encode_verdict,
)
from mark import daemon
from mark.catalog import Catalog, Market
from mark.config import Settings, load_settings
from mark.daemon import Running
from mark.ports import InstanceInfo, InstanceRole, InstanceState, SpillResult
from mark.serve.auth import KEY_FILE
from mark.serve.dispatcher import SHUTTING_DOWN, Backend, Dispatcher
from mark.serve.intake import Phase
from mark.serve.telemetry import Telemetry
from mark.state.records import LedgerEntry

SLACK_S = 5.0
"""Added to every upper bound: a shared, busy test machine schedules late, never early."""
AGENT_OUTPUT = 7.0
"""What a test agent answers for every row; the spill function answers a row's sum."""
PREDICT = "/v1/models/tiny:predict"
INFER = "/v2/models/tiny/infer"


# -- the world: a gated spill function, agents on loopback -------------------------------


class GatedLambda:
    """The spill function: each row's sum once ``gate`` is set, counting invocations per
    row (a row is known by its first value)."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.gate.set()
        self.calls: Counter[float] = Counter()

    async def invoke(self, model: str, batch: Sequence[Any], dtype: str = "float32") -> SpillResult:
        for row in batch:
            self.calls[float(np.asarray(row).ravel()[0])] += 1
        await self.gate.wait()
        return SpillResult([[float(np.sum(row))] for row in batch], 1.0, 1, 1024, False)

    async def warm_up(self, model: str, concurrency: int) -> None:
        return None

    def take_charges(self) -> list[LedgerEntry]:
        return []


@dataclass
class FakeAgent:
    instance: InstanceInfo
    url: str
    latency: BatchLatency
    variants: dict[str, BatchLatency] = field(default_factory=dict)


class FakeAgents:
    """The world's agents: ``serving`` become the backends at each sync; a sync waits
    for ``gate``."""

    def __init__(self) -> None:
        self.serving: dict[str, FakeAgent] = {}
        self.agents: dict[str, FakeAgent] = {}
        self.instance_ids: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.syncs = 0

    async def sync(self) -> None:
        await self.gate.wait()
        self.agents = dict(self.serving)
        self.instance_ids = list(self.serving)
        self.syncs += 1


class FakeWorld:
    """What the daemon needs of a world, and nothing it would launch."""

    fleet = None
    interruptions = None
    boot_s = 0.0
    control_loop = False
    agents_measure = False

    def __init__(self, serverless: GatedLambda, agents: FakeAgents | None = None) -> None:
        self.serverless = serverless
        self.agents = agents
        self.closed = False

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        self.closed = True

    async def prices(self, catalog: Catalog, instance_types: Sequence[str]) -> Catalog:
        return catalog

    async def emulated_latency(self, *_: Any) -> dict[str, BatchLatency]:
        return {}

    def jobs(self, catalog: Catalog, leads: Callable[[], bool]) -> list[Any]:
        return []

    def observe(self, *_: Any) -> None:
        return None

    def fixed_hourly(self, catalog: Catalog) -> float:
        return 0.0


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class AgentServer:
    """An agent on loopback that admits every batch and answers ``AGENT_OUTPUT`` per row
    once ``release`` is set; ``got`` is set when a batch arrives."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.release.set()
        self.got = asyncio.Event()
        self.rows = 0
        self._server: TestServer | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post(BATCH_PATH, self._batch)
        self._server = TestServer(app)
        await self._server.start_server()
        return str(self._server.make_url("")).rstrip("/")

    async def _batch(self, request: web.Request) -> web.StreamResponse:
        rows, _ = decode_batch(await request.read())
        n = batch_size(rows)
        self.rows += n
        resp = web.StreamResponse(headers={"Content-Type": NDJSON_TYPE})
        await resp.prepare(request)
        await resp.write(encode_verdict(range(n), (), time.time() + 0.01))
        self.got.set()
        await asyncio.wait_for(self.release.wait(), 60)
        await resp.write(encode_outputs([[AGENT_OUTPUT]] * n))
        await resp.write_eof()
        return resp

    async def close(self) -> None:
        self.release.set()
        if self._server is not None:
            await self._server.close()


def _agent(iid: str, url: str) -> FakeAgent:
    inst = InstanceInfo(
        iid, "tiny", "c5.large", Market.ON_DEMAND, InstanceState.RUNNING, InstanceRole.SERVING, 0.0
    )
    return FakeAgent(inst, url, BatchLatency.from_mapping({1: 0.002, 8: 0.004}))


# -- the daemon ---------------------------------------------------------------------------


def _settings(tmp_path: Path, rt_max_ms: float = 200.0, **api: Any) -> Settings:
    return load_settings(
        overrides={
            "data_dir": str(tmp_path),
            "api": {"port": 0, **api},
            "models": [
                {
                    "name": "tiny",
                    "source": "torch.nn:Flatten",
                    "input": {"shape": [2]},
                    "slo": {"rt_max_ms": rt_max_ms, "sl_min": 0.99},
                }
            ],
        }
    )


@asynccontextmanager
async def _daemon(
    monkeypatch: pytest.MonkeyPatch, world: FakeWorld, settings: Settings
) -> AsyncIterator[Running]:
    monkeypatch.setattr(daemon, "open_world", lambda *_: world)
    run = await daemon.start(settings)
    try:
        yield run
    finally:
        if not world.closed:
            if world.serverless is not None:
                world.serverless.gate.set()
            await daemon.stop(run)


def _client(run: Running) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        base_url=run.url, headers={"Authorization": f"Bearer {run.api_key}"}
    )


@dataclass
class Answer:
    status: int
    body: dict[str, Any]
    retry_after: str | None


async def _post(client: aiohttp.ClientSession, path: str, body: dict[str, Any]) -> Answer:
    async with client.post(path, json=body) as r:
        return Answer(r.status, await r.json(), r.headers.get("Retry-After"))


def _v1(rows: list[list[float]]) -> tuple[str, dict[str, Any]]:
    return PREDICT, {"instances": rows}


def _v2(rows: list[list[float]]) -> tuple[str, dict[str, Any]]:
    flat = [v for row in rows for v in row]
    tensor = {"name": "input", "shape": [len(rows), 2], "datatype": "FP32", "data": flat}
    return INFER, {"inputs": [tensor]}


def _requests(n: int) -> list[tuple[str, dict[str, Any], list[float]]]:
    """``n`` requests of 1 to 3 rows, V1 and V2 in turn; row values name the rows; each
    with the sums the spill function answers."""
    out = []
    value = 1.0
    for i in range(n):
        rows = []
        for _ in range(1 + i % 3):
            rows.append([value, 0.5])
            value += 1.0
        path, body = (_v1 if i % 2 == 0 else _v2)(rows)
        out.append((path, body, [r[0] + r[1] for r in rows]))
    return out


def _outputs(answer: Answer) -> list[float]:
    if "predictions" in answer.body:
        return [p[0] for p in answer.body["predictions"]]
    return [float(v) for v in answer.body["outputs"][0]["data"]]


async def _until(what: Callable[[], bool], within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while not what():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.01)


async def _status(client: aiohttp.ClientSession, path: str) -> tuple[int, dict[str, Any]]:
    async with client.get(path) as r:
        return r.status, await r.json()


async def _refused_while_draining(client: aiohttp.ClientSession) -> None:
    """Readiness false, liveness true, new inference 503 + Retry-After, models not ready."""
    assert (await _status(client, "/v2/health/ready"))[0] == 503
    assert (await _status(client, "/v2/health/live"))[0] == 200
    for path, body in (_v1([[0.0, 0.0]]), _v2([[0.0, 0.0]])):
        late = await _post(client, path, body)
        assert late.status == 503 and late.retry_after is not None
        assert "shutting down" in late.body["error"]
    status, ready = await _status(client, "/v2/models/tiny/ready")
    assert status == 400 and ready["ready"] is False and "shutting down" in ready["error"]
    _, v1 = await _status(client, "/v1/models/tiny")
    assert v1["model_version_status"][0]["state"] == "UNLOADING"


# -- SIGTERM: drain ---------------------------------------------------------------------


async def test_sigterm_drains_what_is_in_flight_and_refuses_what_comes_after(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    lam = GatedLambda()
    lam.gate.clear()  # every request waits in its spill when SIGTERM comes
    world = FakeWorld(lam)
    monkeypatch.setattr(daemon, "open_world", lambda *_: world)
    started: list[Running] = []
    serving = asyncio.create_task(daemon.serve(_settings(tmp_path), on_ready=started.append))
    await _until(lambda: bool(started) or serving.done(), 60)
    run = started[0]
    sent = _requests(12)
    rows = sum(len(expected) for _, _, expected in sent)
    async with _client(run) as client:
        assert (await _status(client, "/v2/health/ready"))[0] == 200
        calls = [asyncio.create_task(_post(client, path, body)) for path, body, _ in sent]
        await _until(lambda: sum(lam.calls.values()) == rows)  # all taken, all spilling
        assert run.intake.in_flight == len(sent)

        os.kill(os.getpid(), signal.SIGTERM)
        await _until(lambda: run.intake.phase is Phase.DRAINING)
        await _refused_while_draining(client)
        assert not any(c.done() for c in calls)  # nothing taken was dropped or cut short

        stopped_at = time.monotonic()
        lam.gate.set()
        answers = await asyncio.gather(*calls)
        await asyncio.wait_for(serving, SLACK_S)
    assert time.monotonic() - stopped_at < SLACK_S
    # Sent = answered, each once, with its own result; no row ran twice.
    assert len(answers) == len(sent)
    for answer, (_, _, expected) in zip(answers, sent, strict=True):
        assert answer.status == 200, answer.body
        assert _outputs(answer) == pytest.approx(expected)
    assert set(lam.calls.values()) == {1}
    tel = run.models["tiny"].telemetry
    assert tel is not None and tel.counts["spilled"] == rows and tel.counts["error"] == 0
    assert world.closed


async def test_a_second_signal_cuts_the_drain_short_and_every_request_gets_an_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    lam = GatedLambda()
    lam.gate.clear()  # the spill function never answers
    world = FakeWorld(lam)
    monkeypatch.setattr(daemon, "open_world", lambda *_: world)
    started: list[Running] = []
    serving = asyncio.create_task(daemon.serve(_settings(tmp_path), on_ready=started.append))
    await _until(lambda: bool(started) or serving.done(), 60)
    run = started[0]
    sent = _requests(6)
    rows = sum(len(expected) for _, _, expected in sent)
    try:
        async with _client(run) as client:
            calls = [asyncio.create_task(_post(client, path, body)) for path, body, _ in sent]
            await _until(lambda: sum(lam.calls.values()) == rows)
            os.kill(os.getpid(), signal.SIGTERM)
            await _until(lambda: run.intake.phase is Phase.DRAINING)
            t0 = time.monotonic()
            os.kill(os.getpid(), signal.SIGINT)  # the default drain would wait over a minute
            answers = await asyncio.gather(*calls)
            await asyncio.wait_for(serving, SLACK_S + daemon.ANSWER_WAIT_S)
        assert time.monotonic() - t0 < SLACK_S
    finally:
        lam.gate.set()
    assert len(answers) == len(sent)
    for answer in answers:
        assert answer.status == 503 and answer.retry_after is not None
        assert "shutting down" in answer.body["error"]
    assert set(lam.calls.values()) == {1}
    tel = run.models["tiny"].telemetry
    assert tel is not None and tel.counts["error"] == rows


async def test_what_the_drain_bound_leaves_is_answered_with_an_explicit_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    lam = GatedLambda()
    lam.gate.clear()
    world = FakeWorld(lam)
    drain_s = 0.5
    async with _daemon(monkeypatch, world, _settings(tmp_path, drain_s=drain_s)) as run:
        assert daemon.drain_bound(run.settings, run.models) == drain_s
        sent = _requests(5)
        async with _client(run) as client:
            calls = [asyncio.create_task(_post(client, path, body)) for path, body, _ in sent]
            await _until(lambda: run.intake.in_flight == len(sent))
            t0 = time.monotonic()
            await daemon.stop(run)
            took = time.monotonic() - t0
            answers = await asyncio.gather(*calls)
    assert drain_s * 0.9 <= took < drain_s + SLACK_S
    assert len(answers) == len(sent)
    for answer in answers:
        assert answer.status == 503 and answer.retry_after is not None
        assert "shutting down" in answer.body["error"]
    assert run.intake.in_flight == 0


async def test_a_batch_in_flight_on_an_instance_finishes_during_the_drain(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    agent = AgentServer()
    agent.release.clear()
    agents = FakeAgents()
    agents.serving = {"i-1": _agent("i-1", await agent.start())}
    world = FakeWorld(GatedLambda(), agents)
    # RT_max 5 s: a grace of 5 s, so the held batch is not declared hung meanwhile.
    try:
        async with _daemon(monkeypatch, world, _settings(tmp_path, rt_max_ms=5000)) as run:
            dispatcher = run.models["tiny"].dispatcher
            assert dispatcher is not None and set(dispatcher.backends) == {"i-1"}
            async with _client(run) as client:
                path, body = _v2([[1.0, 1.0], [2.0, 2.0]])
                call = asyncio.create_task(_post(client, path, body))
                await asyncio.wait_for(agent.got.wait(), 10)
                stopping = asyncio.create_task(daemon.stop(run))
                await _until(lambda: run.intake.phase is Phase.DRAINING)
                await _refused_while_draining(client)
                assert not call.done() and not stopping.done()
                agent.release.set()
                answer = await asyncio.wait_for(call, SLACK_S)
                await asyncio.wait_for(stopping, SLACK_S)
    finally:
        await agent.close()
    assert answer.status == 200 and _outputs(answer) == [AGENT_OUTPUT, AGENT_OUTPUT]
    assert agent.rows == 2 and sum(world.serverless.calls.values()) == 0


# -- start: ready once the backends are synced -------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_readiness_and_inference_wait_for_the_first_agent_sync(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    agent = AgentServer()
    agents = FakeAgents()
    agents.serving = {"i-1": _agent("i-1", await agent.start())}
    agents.gate.clear()  # the first sync hangs until the test lets it end
    lam = GatedLambda()
    world = FakeWorld(lam, agents)
    port = _free_port()
    monkeypatch.setattr(daemon, "open_world", lambda *_: world)
    starting = asyncio.create_task(daemon.start(_settings(tmp_path, port=port)))
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(base_url=url) as client:

            async def listening() -> bool:
                try:
                    return (await _status(client, "/v2/health/live"))[0] == 200
                except aiohttp.ClientConnectionError:
                    return False

            deadline = time.monotonic() + 60
            while not await listening():
                assert time.monotonic() < deadline and not starting.done()
                await asyncio.sleep(0.05)
            assert (await _status(client, "/v2/health/ready"))[0] == 503
            key = {"Authorization": f"Bearer {(tmp_path / KEY_FILE).read_text().strip()}"}
            async with client.get("/v2/models/tiny/ready", headers=key) as r:
                assert r.status == 400 and "not synced" in (await r.json())["error"]
            early = await _post(client, *_v1([[1.0, 2.0]]))  # refused before the key check
            assert early.status == 503 and early.retry_after is not None
            assert "starting" in early.body["error"]
            assert not starting.done() and agents.syncs == 0

            agents.gate.set()
            run = await asyncio.wait_for(starting, SLACK_S)
        try:
            async with _client(run) as client:
                assert (await _status(client, "/v2/health/ready"))[0] == 200
                answer = await _post(client, *_v1([[1.0, 2.0]]))
            assert answer.status == 200 and _outputs(answer) == [AGENT_OUTPUT]
            assert agent.rows == 1 and not lam.calls  # served by the synced instance
        finally:
            await daemon.stop(run)
    finally:
        if not starting.done():
            starting.cancel()
        await agent.close()


async def test_a_first_sync_that_hangs_delays_readiness_only_by_sync_wait_s(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    agents = FakeAgents()
    agents.gate.clear()  # never ends
    lam = GatedLambda()
    world = FakeWorld(lam, agents)
    monkeypatch.setattr(daemon, "open_world", lambda *_: world)
    wait_s = 0.5
    t0 = time.monotonic()
    run = await daemon.start(_settings(tmp_path, sync_wait_s=wait_s))
    try:
        assert wait_s * 0.9 <= time.monotonic() - t0 < 60  # the store and API start too
        async with _client(run) as client:
            assert (await _status(client, "/v2/health/ready"))[0] == 200
            answer = await _post(client, *_v1([[1.0, 2.0]]))
        assert answer.status == 200 and _outputs(answer) == [3.0]  # spilled meanwhile
    finally:
        t1 = time.monotonic()
        await daemon.stop(run)  # the hung sync is cancelled, not waited for
        assert time.monotonic() - t1 < SLACK_S


async def test_without_agents_the_api_is_ready_as_it_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    world = FakeWorld(GatedLambda())  # a world without agents: spill serving
    gc.unfreeze()
    async with _daemon(monkeypatch, world, _settings(tmp_path)) as run:
        assert run.intake.phase is Phase.OPEN
        # What lives as long as the daemon is kept out of cyclic collections, from
        # before the first request (``daemon.freeze_long_lived``) to the stop.
        assert gc.get_freeze_count() > 0
        async with _client(run) as client:
            assert (await _status(client, "/v2/health/ready"))[0] == 200
    assert gc.get_freeze_count() == 0


# -- the dispatcher's close ----------------------------------------------------------------


async def test_close_answers_the_batch_being_formed_and_every_later_submit() -> None:
    async with aiohttp.ClientSession() as session:
        d = Dispatcher("tiny", 0.2, "float32", time.time, session, None, Telemetry("tiny", 200))
        # A long window: the batch is still being formed when the dispatcher closes; the
        # agent is never reached (nothing listens there).
        slow = Backend(
            "i-1", "c5.large", "http://127.0.0.1:9", BatchLatency.from_mapping({1: 0.01}), 8, 30.0
        )
        d.set_backends([slow])
        d.start()
        rows = np.array([[1.0, 0.5], [2.0, 0.5]], dtype=np.float32)
        waiting = asyncio.create_task(d.submit(rows))
        await _until(lambda: len(d._forming) == 2)
        t0 = time.monotonic()
        await d.close()
        outcomes = await asyncio.wait_for(waiting, SLACK_S)
        assert time.monotonic() - t0 < SLACK_S  # not the give-up, a minute later
        assert [o.error for o in outcomes] == [SHUTTING_DOWN, SHUTTING_DOWN]
        late = await asyncio.wait_for(d.submit(rows[:1]), 1)
        assert [o.error for o in late] == [SHUTTING_DOWN]
        assert d.telemetry is not None and d.telemetry.counts["error"] == 3
