"""The dispatcher against real agents (real HTTP, real TorchScript model)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import torch
from aiohttp.test_utils import TestServer

from bouncer.agent import Agent
from bouncer.latency import BatchLatency
from bouncer.miss_budget import MissBudget
from bouncer.runner import ModelRunner
from mark.demo import save_torchscript
from mark.ports import SpillResult
from mark.serve.dispatcher import DECLINED, Backend, Dispatcher, Outcome
from mark.serve.telemetry import Telemetry
from tests.model_zoo import two_io_contract, two_io_onnx, two_io_reference
from tests.runners import SourceRunner, source_runner


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2)).eval()
    return save_torchscript(net, tmp_path_factory.mktemp("m") / "tiny.pt")


class InProcessServerless:
    """The Serverless port served by the same model in this process (the e2e tests use
    the real awslambdaric runtime; here only the dispatcher's logic is under test)."""

    def __init__(self, runner: SourceRunner) -> None:
        self.runner = runner
        self.calls: list[int] = []

    async def invoke(self, model: str, batch: Sequence[Any], dtype: str = "float32") -> SpillResult:
        self.calls.append(len(batch))
        out = self.runner.run(np.asarray(batch, dtype=np.float32))
        return SpillResult(out.tolist(), 1.0, 1, 1024, False)

    async def warm_up(self, model: str, concurrency: int) -> None:
        return None


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def _agent(model_path: Path, t: float, slowdown: float = 1.0) -> tuple[Agent, TestServer]:
    agent = Agent(
        runner=source_runner(str(model_path)),
        latency=BatchLatency.from_mapping({1: t, 8: t}),
        slowdown=slowdown,
    )
    server = TestServer(agent.app())
    await server.start_server()
    return agent, server


def _backend(server: TestServer, agent: Agent, **batching: Any) -> Backend:
    """The one c5.large ``i-1`` that ``agent`` serves behind ``server``."""
    url = str(server.make_url("")).rstrip("/")
    return Backend("i-1", "c5.large", url, agent.latency, **batching)


def _dispatcher(
    session: aiohttp.ClientSession,
    serverless: Any,
    rt_max_s: float = 1.0,
    budget: MissBudget | None = None,
    clock: Any = time.time,
) -> Dispatcher:
    d = Dispatcher(
        "tiny",
        rt_max_s,
        "float32",
        clock,
        session,
        serverless,
        Telemetry("tiny", rt_max_ms=rt_max_s * 1000, sample_window_s=5),
        budget=budget,
    )
    d.start()
    return d


def _rows(n: int, seed: int = 0) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).random((n, 2, 2), dtype=np.float32)


async def test_concurrent_requests_share_a_batch_up_to_n_batch(
    model_path: Path, session: aiohttp.ClientSession
) -> None:
    agent, server = await _agent(model_path, 0.01)
    runner = source_runner(str(model_path))
    d = _dispatcher(session, InProcessServerless(runner))
    d.set_backends([_backend(server, agent, n_batch=4, w_batch_s=0.2)])
    try:
        x = _rows(4)
        outs = await asyncio.gather(*(d.submit(x[i : i + 1]) for i in range(4)))
        flat = [o for group in outs for o in group]
        assert all(o.ok and o.served_by == "i-1" for o in flat)
        assert np.allclose(np.array([o.output for o in flat]), runner.run(x), atol=1e-6)
        assert agent.stats.batches == 1  # four requests, one batch
    finally:
        await d.close()
        await server.close()


async def test_a_lone_request_waits_at_most_w_batch(
    model_path: Path, session: aiohttp.ClientSession
) -> None:
    agent, server = await _agent(model_path, 0.001)
    d = _dispatcher(session, None)
    d.set_backends([_backend(server, agent, n_batch=8, w_batch_s=0.15)])
    try:
        t0 = time.perf_counter()
        (o,) = await d.submit(_rows(1))
        waited = time.perf_counter() - t0
        assert o.ok and 0.14 <= waited < 0.6
    finally:
        await d.close()
        await server.close()


async def test_no_instances_means_everything_spills_with_correct_results(
    model_path: Path, session: aiohttp.ClientSession
) -> None:
    runner = source_runner(str(model_path))
    lam = InProcessServerless(runner)
    d = _dispatcher(session, lam)
    try:
        x = _rows(5)
        outs = await d.submit(x)
        assert all(o.ok and o.spilled for o in outs)
        assert np.allclose(np.array([o.output for o in outs]), runner.run(x), atol=1e-6)
        assert d.telemetry is not None and d.telemetry.counts["spilled"] == 5
    finally:
        await d.close()


async def test_overload_spills_what_the_bouncer_rejects_and_loses_nothing(
    model_path: Path, session: aiohttp.ClientSession
) -> None:
    # Each batch takes 0.2 s on the instance; with RT_max 0.3 s a queue of more
    # than one batch cannot finish in time, so the Bouncer must turn work away.
    agent, server = await _agent(model_path, 0.2)
    runner = source_runner(str(model_path))
    lam = InProcessServerless(runner)
    d = _dispatcher(session, lam, rt_max_s=0.3)
    d.set_backends([_backend(server, agent, n_batch=2, w_batch_s=0.0)])
    try:
        x = _rows(12, seed=3)
        outs = await asyncio.gather(*(d.submit(x[i : i + 1]) for i in range(12)))
        flat = [g[0] for g in outs]
        assert all(o.ok for o in flat)  # every request got a result
        assert np.allclose(np.array([o.output for o in flat]), runner.run(x), atol=1e-6)
        spilled = sum(o.spilled for o in flat)
        served = sum(o.served_by == "i-1" for o in flat)
        assert spilled > 0 and served > 0 and spilled + served == 12
        assert agent.stats.served == served
    finally:
        await d.close()
        await server.close()


async def test_a_dead_instance_is_routed_around_via_lambda(
    model_path: Path, session: aiohttp.ClientSession
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    lam = InProcessServerless(source_runner(str(model_path)))
    d = _dispatcher(session, lam)
    d.set_backends([Backend("i-dead", "c5.large", dead, BatchLatency.from_mapping({1: 0.01}))])
    try:
        outs = await d.submit(_rows(3))
        assert all(o.ok and o.spilled for o in outs)
    finally:
        await d.close()


async def test_without_capacity_or_spill_the_error_is_explicit(
    session: aiohttp.ClientSession,
) -> None:
    d = _dispatcher(session, None)
    try:
        (o,) = await d.submit(_rows(1))
        assert not o.ok and "no serving capacity" in (o.error or "")
    finally:
        await d.close()


async def test_batches_reuse_the_connection_to_an_agent(model_path: Path) -> None:
    # An agent in another process sends the end of its chunked body in a later
    # segment than the outputs. A response released before that end closes the
    # connection, and every batch then pays a new TCP handshake. This server holds
    # the end back for a while, so only a client that reads to the end reuses it.
    from aiohttp import web

    admit = True

    async def batch(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = len(body["deadlines"])
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        ids = list(range(n))
        head = {"admitted": ids if admit else [], "rejected": [] if admit else ids, "finish": 0}
        await resp.write(json.dumps(head).encode() + b"\n")
        if admit:
            await resp.write(json.dumps({"outputs": [[1.0, 2.0]] * n}).encode() + b"\n")
        await asyncio.sleep(0.05)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/batch", batch)
    server = TestServer(app)
    await server.start_server()
    opened: list[object] = []

    async def count(_: object, __: object, params: object) -> None:
        opened.append(params)

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(count)
    lam = InProcessServerless(source_runner(str(model_path)))
    async with aiohttp.ClientSession(trace_configs=[trace]) as s:
        d = _dispatcher(s, lam)
        url = str(server.make_url("")).rstrip("/")
        d.set_backends(
            [Backend("i-1", "c5.large", url, BatchLatency.from_mapping({1: 0.001}), 1, 0.0)]
        )
        try:
            for i in range(5):  # one at a time: each its own batch
                (o,) = await d.submit(_rows(1, seed=i))
                assert o.ok and o.served_by == "i-1" and o.output == [1.0, 2.0]
                await asyncio.sleep(0.1)  # the end of the body arrives; the connection is free
            admit = False
            for i in range(3):
                (o,) = await d.submit(_rows(1, seed=i))
                assert o.ok and o.spilled
                await asyncio.sleep(0.1)
            assert len(opened) == 1
        finally:
            await d.close()
            await server.close()


class _ManualClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


async def _one_row_each(d: Dispatcher, rows: np.ndarray[Any, Any]) -> list[Outcome]:
    """Each row its own request, all at once (a request of several rows is never declined)."""
    groups = await asyncio.gather(*(d.submit(rows[i : i + 1]) for i in range(rows.shape[0])))
    return [o for g in groups for o in g]


async def test_the_miss_budget_declines_what_would_spill_while_it_lasts(
    model_path: Path, session: aiohttp.ClientSession
) -> None:
    # No instance: all 100 requests would spill. SL_min 90 %, share 0.5: 5 of 100 may
    # be declined, each at once with the explicit error; the other 95 go to Lambda.
    lam = InProcessServerless(source_runner(str(model_path)))
    d = _dispatcher(session, lam, budget=MissBudget(sl_min=0.9, share=0.5))
    try:
        outs = await _one_row_each(d, _rows(100))
        declined = [o for o in outs if o.declined]
        assert len(outs) == 100 and len(declined) == 5
        assert all(o.error == DECLINED and o.served_by == "none" for o in declined)
        assert sum(o.ok and o.served_by == "lambda" for o in outs) == 95 == sum(lam.calls)
        tel = d.telemetry
        assert tel is not None and tel.counts["declined"] == 5
        assert len(tel.take_latencies()) == 95  # the SLO monitor does not see declines
    finally:
        await d.close()


async def test_a_share_of_zero_declines_nothing(
    model_path: Path, session: aiohttp.ClientSession
) -> None:
    lam = InProcessServerless(source_runner(str(model_path)))
    d = _dispatcher(session, lam, budget=MissBudget(sl_min=0.9, share=0.0))
    try:
        outs = await _one_row_each(d, _rows(50))
        assert all(o.ok and o.served_by == "lambda" for o in outs) and sum(lam.calls) == 50
    finally:
        await d.close()


async def test_a_request_of_several_rows_is_never_declined(
    model_path: Path, session: aiohttp.ClientSession
) -> None:
    # A declined row fails its whole request: the budget (5 of 100 here) is not spent on
    # one, and every row of it goes to Lambda.
    lam = InProcessServerless(source_runner(str(model_path)))
    budget = MissBudget(sl_min=0.9, share=0.5)
    d = _dispatcher(session, lam, budget=budget)
    try:
        outs = await d.submit(_rows(100))
        assert all(o.ok and o.served_by == "lambda" for o in outs) and sum(lam.calls) == 100
        assert budget.declined_total == 0
    finally:
        await d.close()


async def test_late_spills_spend_the_budget_before_anything_more_is_declined(
    model_path: Path, session: aiohttp.ClientSession
) -> None:
    # Lambda answers 2 s after each invocation, past RT_max (1 s): every spill is a miss.
    # SL_min 90 %, share 1: the first 10 arrivals allow 1 decline and 9 late spills
    # follow; the next 10 (20 in all, 2 allowed, 10 missed) get no decline.
    clock = _ManualClock()

    class LateServerless(InProcessServerless):
        async def invoke(
            self, model: str, batch: Sequence[Any], dtype: str = "float32"
        ) -> SpillResult:
            clock.t += 2.0
            return await super().invoke(model, batch, dtype)

    budget = MissBudget(sl_min=0.9, share=1.0)
    lam = LateServerless(source_runner(str(model_path)))
    d = _dispatcher(session, lam, budget=budget, clock=clock)
    try:
        first = await _one_row_each(d, _rows(10))
        assert sum(o.declined for o in first) == 1
        assert all(o.ok and o.latency_s > 1.0 for o in first if not o.declined)
        second = await _one_row_each(d, _rows(10, seed=1))
        assert not any(o.declined for o in second)
        assert budget.missed == 20 and budget.declined_total == 1
    finally:
        await d.close()


async def test_what_a_real_bouncer_rejects_is_declined_within_the_budget(
    model_path: Path, session: aiohttp.ClientSession
) -> None:
    # The agent's profile says a batch takes 5 s, past RT_max: its Bouncer rejects every
    # request. With SL_min 80 % and share 0.5, 2 of 20 are declined and 18 spill.
    agent, server = await _agent(model_path, 5.0)
    lam = InProcessServerless(source_runner(str(model_path)))
    d = _dispatcher(session, lam, budget=MissBudget(sl_min=0.8, share=0.5))
    d.set_backends([_backend(server, agent)])
    try:
        outs = await _one_row_each(d, _rows(20))
        assert sum(o.declined for o in outs) == 2
        assert sum(o.ok and o.served_by == "lambda" for o in outs) == 18 == sum(lam.calls)
        assert d.telemetry is not None and d.telemetry.spills["rejected"] == 18
    finally:
        await d.close()
        await server.close()


async def test_a_retired_instance_finishes_its_batch_and_gets_no_new_one(
    model_path: Path, session: aiohttp.ClientSession
) -> None:
    """``retire`` (the controller's, before it terminates): the batch on the instance is
    answered by it, ``retire`` returns only then, and what comes after goes elsewhere,
    also across backend syncs that list the instance, or drop it and list it again;
    ``keep`` undoes it."""
    agent, server = await _agent(model_path, 0.05, slowdown=6.0)  # 0.3 s a batch
    lam = InProcessServerless(source_runner(str(model_path)))
    d = _dispatcher(session, lam)
    d.set_backends([_backend(server, agent)])
    offered = asyncio.Event()
    offer = agent.offer

    def offer_seen(deadlines: list[float], variant: str | None = None) -> Any:
        offered.set()
        return offer(deadlines, variant)

    agent.offer = offer_seen  # type: ignore[method-assign]
    try:
        first = asyncio.create_task(d.submit(_rows(1, seed=1)))
        await offered.wait()  # the batch is on the instance
        assert not first.done()
        await d.retire(["i-1"])
        assert first.done()  # retire waited for the batch in flight
        assert d.retiring == {"i-1"}
        (o,) = first.result()
        assert o.ok and o.served_by == "i-1"
        d.set_backends([_backend(server, agent)])  # an agent sync between retire and terminate
        (after,) = await d.submit(_rows(1, seed=2))
        assert after.ok and after.spilled  # the instance is still up, but is sent nothing
        d.set_backends([])  # its agent missed a probe: dropped by one sync...
        d.set_backends([_backend(server, agent)])  # ...and listed again by the next
        (relisted,) = await d.submit(_rows(1, seed=4))
        assert relisted.ok and relisted.spilled  # still retiring
        assert agent.stats.batches == 1
        d.keep(["i-1"])  # the cloud refused to terminate it
        assert d.retiring == set()
        (again,) = await d.submit(_rows(1, seed=3))
        assert again.ok and again.served_by == "i-1"
    finally:
        await d.close()
        await server.close()


async def test_rows_batch_only_with_rows_of_their_shape(
    session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """Named inputs with a variable sequence length: requests queued together batch by
    shape (the first of another shape starts the next batch), and each gets its outputs."""
    contract = two_io_contract("onnx", two_io_onnx(tmp_path / "two_io.onnx"))
    agent = Agent(
        runner=ModelRunner(contract), latency=BatchLatency.from_mapping({1: 0.001, 8: 0.001})
    )
    server = TestServer(agent.app())
    await server.start_server()
    d = _dispatcher(session, None)
    d.set_backends([_backend(server, agent, n_batch=8, w_batch_s=0.2)])
    rng = np.random.default_rng(0)
    requests = [
        {"tokens": rng.random((1, seq, 8), dtype=np.float32), "scale": np.ones((1, 1), np.float32)}
        for seq in (2, 2, 5, 5, 2)
    ]
    try:
        answers = await asyncio.gather(*(d.submit(r) for r in requests))
    finally:
        await d.close()
        await server.close()
    for req, (outcome,) in zip(requests, answers, strict=True):
        assert outcome.ok and outcome.output is not None, outcome.error
        want = two_io_reference(req["tokens"], req["scale"])
        for name in ("pooled", "norm"):
            np.testing.assert_allclose(outcome.output[name], want[name][0], rtol=1e-5)
    assert agent.stats.batches == 3  # [2, 2], [5, 5], [2]: in arrival order
