"""The dispatcher against agents that misbehave: each request ends once, in bounded time.

Every "agent" here is a real aiohttp server on loopback that misbehaves one way
(never answers, hangs or closes after its verdict, sends a huge line, a bad
verdict, or is drained mid-batch); the spill function is a small recording
``Serverless`` that counts invocations per request. Timing is asserted against
the dispatcher's stated bounds with generous slack, never tightly.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
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
    LineReader,
    decode_result,
    decode_verdict,
    encode_outputs,
    encode_verdict,
)
from mark.ports import SpillResult
from mark.serve.dispatcher import GRACE_FLOOR_S, Backend, Dispatcher, Outcome
from mark.serve.telemetry import Telemetry

SLACK_S = 2.0
"""Added to every upper bound: a shared, busy test machine schedules late, never early."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class RecordingServerless:
    """The spill function: answers each row with its sum, counting invocations per request
    (a request is known by its first value). ``hang`` holds every invocation until
    ``release``; ``fail`` is raised instead of answering; ``short`` drops the outputs."""

    def __init__(
        self,
        delay_s: float = 0.0,
        hang: bool = False,
        fail: Exception | None = None,
        short: bool = False,
    ) -> None:
        self.delay_s = delay_s
        self.hang = hang
        self.fail = fail
        self.short = short
        self.calls: Counter[float] = Counter()
        self.release = asyncio.Event()

    async def invoke(self, model: str, batch: Sequence[Any], dtype: str = "float32") -> SpillResult:
        for row in batch:
            self.calls[float(np.asarray(row).ravel()[0])] += 1
        if self.hang:
            await self.release.wait()
        await asyncio.sleep(self.delay_s)
        if self.fail is not None:
            raise self.fail
        outputs = [] if self.short else [[float(np.sum(row))] for row in batch]
        return SpillResult(outputs, 1.0, 1, 1024, False)

    async def warm_up(self, model: str, concurrency: int) -> None:
        return None


class Agents:
    """Misbehaving agents on loopback; whatever they hold is released at teardown."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.servers: list[TestServer] = []

    async def serve(self, handler: Handler) -> str:
        app = web.Application()
        app.router.add_post(BATCH_PATH, handler)
        server = TestServer(app)
        await server.start_server()
        self.servers.append(server)
        return str(server.make_url("")).rstrip("/")

    async def hold(self) -> None:
        """Hang like a stuck model, until the test ends."""
        await asyncio.wait_for(self.release.wait(), 60)

    async def close(self) -> None:
        self.release.set()
        for server in self.servers:
            await server.close()


@pytest.fixture
async def agents() -> AsyncIterator[Agents]:
    a = Agents()
    yield a
    await a.close()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def _stream(request: web.Request) -> tuple[web.StreamResponse, int]:
    """Start a streamed answer; the batch's size."""
    body = await request.json()
    resp = web.StreamResponse(headers={"Content-Type": NDJSON_TYPE})
    await resp.prepare(request)
    return resp, len(body["deadlines"])


def _dispatcher(
    session: aiohttp.ClientSession,
    serverless: RecordingServerless | None,
    rt_max_s: float = 0.2,
    **kwargs: Any,
) -> Dispatcher:
    d = Dispatcher(
        "tiny",
        rt_max_s,
        "float32",
        time.time,
        session,
        serverless,
        Telemetry("tiny", rt_max_ms=rt_max_s * 1000, sample_window_s=5),
        **kwargs,
    )
    d.start()
    return d


def _backend(iid: str, url: str, n_batch: int = 8) -> Backend:
    return Backend(iid, "c5.large", url, BatchLatency.from_mapping({1: 0.01, 8: 0.02}), n_batch)


def _rows(n: int) -> np.ndarray[Any, Any]:
    """Row i is (i, 0.5): its first value names it in the Lambda's count."""
    return np.array([[float(i), 0.5] for i in range(n)], dtype=np.float32)


def _handed_off_by(d: Dispatcher) -> float:
    """When, after arrival, a request is at the latest handed to Lambda (the spill
    function here answers at once): the outcome bound without the spill timeout."""
    return d.outcome_bound_s - d.spill_timeout_s


def _assert_counted_once(d: Dispatcher, outcomes: Sequence[Outcome], n: int) -> None:
    assert len(outcomes) == n
    assert d.telemetry is not None and sum(d.telemetry.counts.values()) == n


async def test_an_agent_that_never_answers_is_hung_after_a_grace(
    agents: Agents, session: aiohttp.ClientSession
) -> None:
    got = asyncio.Event()

    async def silent(request: web.Request) -> web.StreamResponse:
        await request.read()
        got.set()
        await agents.hold()  # accepted the connection, never answers
        return web.StreamResponse()

    lam = RecordingServerless()
    d = _dispatcher(session, lam)
    d.set_backends([_backend("i-1", await agents.serve(silent))])
    try:
        outs = await d.submit(_rows(3))
        assert got.is_set()
        assert all(o.ok and o.spilled for o in outs)
        assert [o.output for o in outs] == [[0.5], [1.5], [2.5]]
        assert lam.calls == {0.0: 1, 1.0: 1, 2.0: 1}
        assert all(d.grace_s * 0.9 <= o.latency_s < _handed_off_by(d) + SLACK_S for o in outs)
        _assert_counted_once(d, outs, 3)
        # Penalised: the next request goes straight to Lambda, without waiting a grace.
        assert d.backends["i-1"].penalised_until > time.time()
        (o,) = await d.submit(_rows(1))
        assert o.spilled and o.latency_s < d.grace_s
    finally:
        await d.close()


async def test_an_agent_that_hangs_after_its_verdict_is_hung_past_its_finish(
    agents: Agents, session: aiohttp.ClientSession
) -> None:
    async def stuck(request: web.Request) -> web.StreamResponse:
        resp, n = await _stream(request)
        await resp.write(encode_verdict(range(n), (), time.time() + 0.05))
        await agents.hold()  # the model is stuck
        return resp

    lam = RecordingServerless()
    d = _dispatcher(session, lam)
    d.set_backends([_backend("i-1", await agents.serve(stuck))])
    try:
        outs = await d.submit(_rows(2))
        assert all(o.ok and o.spilled for o in outs)
        assert lam.calls == {0.0: 1, 1.0: 1}
        assert all(d.grace_s * 0.9 <= o.latency_s < _handed_off_by(d) + SLACK_S for o in outs)
        _assert_counted_once(d, outs, 2)
    finally:
        await d.close()


async def test_the_next_batches_go_to_another_instance_after_a_hang(
    agents: Agents, session: aiohttp.ClientSession
) -> None:
    async def stuck(request: web.Request) -> web.StreamResponse:
        resp, n = await _stream(request)
        await resp.write(encode_verdict(range(n), (), time.time() + 0.05))
        await agents.hold()
        return resp

    async def good(request: web.Request) -> web.StreamResponse:
        resp, n = await _stream(request)
        await resp.write(encode_verdict(range(n), (), time.time() + 0.01))
        await resp.write(encode_outputs([[7.0]] * n))
        await resp.write_eof()
        return resp

    lam = RecordingServerless()
    d = _dispatcher(session, lam)
    # Equal profiles, both idle: the tie goes to the smaller id, the stuck one.
    d.set_backends(
        [_backend("i-a", await agents.serve(stuck)), _backend("i-b", await agents.serve(good))]
    )
    try:
        (first,) = await d.submit(_rows(1))
        assert first.ok and first.spilled
        (second,) = await d.submit(_rows(1))
        assert second.ok and second.served_by == "i-b" and second.output == [7.0]
        assert lam.calls == {0.0: 1}
    finally:
        await d.close()


async def test_an_agent_that_closes_after_its_verdict_spills_each_request_once(
    agents: Agents, session: aiohttp.ClientSession
) -> None:
    async def dies(request: web.Request) -> web.StreamResponse:
        resp, n = await _stream(request)
        await resp.write(encode_verdict([0], list(range(1, n)), time.time() + 0.05))
        assert request.transport is not None
        request.transport.close()  # the process dies mid-batch
        return resp

    # The rejected requests' invocations are still running when the agent dies: the
    # failure must not hand them to Lambda a second time.
    lam = RecordingServerless(delay_s=0.3)
    d = _dispatcher(session, lam)
    d.set_backends([_backend("i-1", await agents.serve(dies))])
    try:
        outs = await d.submit(_rows(2))
        assert all(o.ok and o.spilled for o in outs)
        assert lam.calls == {0.0: 1, 1.0: 1}  # two invocations for two requests, not three
        assert all(o.latency_s < _handed_off_by(d) + lam.delay_s + SLACK_S for o in outs)
        _assert_counted_once(d, outs, 2)
        assert d.backends["i-1"].penalised_until > 0
    finally:
        await d.close()


async def test_a_malformed_verdict_spills_every_request_once(
    agents: Agents, session: aiohttp.ClientSession
) -> None:
    async def garbled(request: web.Request) -> web.StreamResponse:
        resp, _ = await _stream(request)
        await resp.write(b"[1, 2]\n")  # JSON, not a verdict
        await resp.write_eof()
        return resp

    lam = RecordingServerless()
    d = _dispatcher(session, lam)
    d.set_backends([_backend("i-1", await agents.serve(garbled))])
    try:
        outs = await d.submit(_rows(3))
        assert all(o.ok and o.spilled for o in outs)
        assert lam.calls == {0.0: 1, 1.0: 1, 2.0: 1}
        _assert_counted_once(d, outs, 3)
    finally:
        await d.close()


async def test_a_result_line_of_megabytes_is_read_whole(
    agents: Agents, session: aiohttp.ClientSession
) -> None:
    width = 300_000
    line = encode_outputs([[0.5] * width, [0.25] * width])
    assert len(line) > 2 * 1024 * 1024  # far past aiohttp's readline limit

    async def big(request: web.Request) -> web.StreamResponse:
        resp, n = await _stream(request)
        await resp.write(encode_verdict(range(n), (), time.time() + 0.05))
        await resp.write(line)
        await resp.write_eof()
        return resp

    lam = RecordingServerless()
    d = _dispatcher(session, lam, rt_max_s=2.0)
    d.set_backends([_backend("i-1", await agents.serve(big))])
    try:
        outs = await d.submit(_rows(2))
        assert all(o.ok and o.served_by == "i-1" for o in outs)
        outputs = [o.output for o in outs if o.output is not None]
        assert [len(x) for x in outputs] == [width, width]
        assert outputs[1][0] == 0.25
        assert not lam.calls
    finally:
        await d.close()


async def test_an_instance_that_leaves_the_backends_has_its_batch_spilled_at_once(
    agents: Agents, session: aiohttp.ClientSession
) -> None:
    admitted = asyncio.Event()

    async def slow(request: web.Request) -> web.StreamResponse:
        resp, n = await _stream(request)
        await resp.write(encode_verdict(range(n), (), time.time() + 4.0))
        admitted.set()
        await agents.hold()
        return resp

    # RT_max 5 s: the hang rule would wait until about 4 s + a 5 s grace.
    lam = RecordingServerless()
    d = _dispatcher(session, lam, rt_max_s=5.0)
    url = await agents.serve(slow)
    d.set_backends([_backend("i-1", url)])
    try:
        pending = asyncio.create_task(d.submit(_rows(2)))
        await asyncio.wait_for(admitted.wait(), 5)
        d.set_backends([_backend("i-1", url)])  # the same instance again: nothing happens
        await asyncio.sleep(0.1)
        assert not pending.done() and not lam.calls
        removed = time.monotonic()
        d.set_backends([])  # drained by the control plane
        outs = await asyncio.wait_for(pending, 10)
        assert time.monotonic() - removed < SLACK_S  # not the hang rule's ~9 s
        assert all(o.ok and o.spilled for o in outs)
        assert lam.calls == {0.0: 1, 1.0: 1}
        _assert_counted_once(d, outs, 2)
    finally:
        await d.close()


async def test_a_spill_function_that_hangs_ends_with_an_explicit_error(
    session: aiohttp.ClientSession,
) -> None:
    lam = RecordingServerless(hang=True)
    d = _dispatcher(session, lam, spill_timeout_s=0.3)
    try:
        outs = await d.submit(_rows(2))
        assert all(not o.ok and o.error == "spill failed: no answer within 0.3 s" for o in outs)
        assert all(o.latency_s < d.outcome_bound_s + SLACK_S for o in outs)
        assert lam.calls == {0.0: 1, 1.0: 1}
        _assert_counted_once(d, outs, 2)
    finally:
        await d.close()


@pytest.mark.parametrize(
    ("lam", "error"),
    [
        (
            RecordingServerless(
                fail=aiohttp.ClientPayloadError("Response payload is not completed")
            ),
            "spill failed: Response payload is not completed",
        ),
        (RecordingServerless(fail=RuntimeError()), "spill failed: RuntimeError"),
        (RecordingServerless(short=True), "spill failed: 0 outputs for 1 requests"),
    ],
    ids=["payload-read-error", "unexpected-exception", "too-few-outputs"],
)
async def test_a_failed_spill_ends_with_an_explicit_error(
    session: aiohttp.ClientSession, lam: RecordingServerless, error: str
) -> None:
    d = _dispatcher(session, lam)
    try:
        outs = await d.submit(_rows(2))
        assert [o.error for o in outs] == [error, error]
        assert all(o.served_by == "lambda" for o in outs)
        assert lam.calls == {0.0: 1, 1.0: 1}
        _assert_counted_once(d, outs, 2)
    finally:
        await d.close()


async def test_the_give_up_is_a_backstop_and_a_late_answer_is_counted_once(
    session: aiohttp.ClientSession,
) -> None:
    lam = RecordingServerless(hang=True)
    d = _dispatcher(session, lam, give_up_after_s=0.3, spill_timeout_s=30.0)
    try:
        (o,) = await d.submit(_rows(1))
        assert not o.ok and o.error == "no result within 0.3 s" and o.served_by == "none"
        lam.release.set()  # Lambda answers after all: the outcome stands, counted once
        await asyncio.sleep(0.1)
        assert lam.calls == {0.0: 1}
        _assert_counted_once(d, [o], 1)
    finally:
        await d.close()


async def test_the_give_up_default_is_derived_from_rt_max(
    session: aiohttp.ClientSession,
) -> None:
    small = Dispatcher("m", 0.2, "float32", time.time, session, None)
    assert small.grace_s == GRACE_FLOOR_S
    assert small.give_up_after_s == pytest.approx(0.2 + 3 * GRACE_FLOOR_S + 60.0)
    large = Dispatcher("m", 3.0, "float32", time.time, session, None, spill_timeout_s=10.0)
    assert large.grace_s == 3.0
    assert large.outcome_bound_s == pytest.approx(3 * 3.0 + 10.0)
    assert large.give_up_after_s == pytest.approx(4 * 3.0 + 10.0)
    fixed = Dispatcher("m", 3.0, "float32", time.time, session, None, None, 5.0)  # as before
    assert fixed.give_up_after_s == 5.0


class _Pieces:
    """A body that arrives in the given pieces (the ``Chunks`` protocol)."""

    def __init__(self, *pieces: bytes) -> None:
        self.pieces = list(pieces)

    async def readany(self) -> bytes:
        return self.pieces.pop(0) if self.pieces else b""


async def test_the_line_reader_splits_lines_across_and_within_pieces() -> None:
    lines = LineReader(_Pieces(b'{"a":', b'1}\n{"b"', b":2}\n{", b'"c":3}\n', b"tail"))
    assert [await lines.line() for _ in range(5)] == [
        b'{"a":1}\n',
        b'{"b":2}\n',
        b'{"c":3}\n',
        b"tail",
        b"",
    ]
    with pytest.raises(ValueError, match="exceeds 4 bytes"):
        await LineReader(_Pieces(b"abc", b"def", b"\n"), limit=4).line()


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b"", "ended before its verdict"),
        (b"[1, 2]\n", "not a JSON object"),
        (b'{"admitted": [0]}\n', "bad verdict line"),
        (b'{"admitted": [0, 2], "rejected": [], "finish": 1}\n', "outside a batch of 2"),
        (b'{"admitted": [0], "rejected": [0], "finish": 1}\n', "or twice"),
        (b'{"admitted": [0], "rejected": [], "finish": "inf"}\n', "finish is inf"),
    ],
)
def test_a_malformed_verdict_is_a_value_error(line: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        decode_verdict(line, 2)


def test_a_result_with_the_wrong_count_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="1 outputs for 2 admitted"):
        decode_result(encode_outputs([[1.0]]), 2)
    with pytest.raises(ValueError, match="ended before its result"):
        decode_result(b"", 2)


async def test_an_agent_whose_results_come_back_late_is_given_earlier_deadlines(
    agents: Agents, session: aiohttp.ClientSession
) -> None:
    """Its Bouncer would admit up to the deadline and the hop back would miss it; the
    dispatcher learns how late the results come and takes that off the deadlines."""
    late_s = 0.08
    given: list[float] = []  # the deadline the agent was given for each batch

    async def slow_hop(request: web.Request) -> web.StreamResponse:
        given.append(float((await request.json())["deadlines"][0]))
        resp, n = await _stream(request)  # the body is read once and kept
        finish = time.time() + 0.01
        await resp.write(encode_verdict(range(n), (), finish))
        await asyncio.sleep(0.01 + late_s)  # the result arrives late_s past the finish
        await resp.write(encode_outputs([[1.0]] * n))
        return resp

    d = _dispatcher(session, RecordingServerless(), rt_max_s=1.0)
    d.set_backends([_backend("i-1", await agents.serve(slow_hop), n_batch=1)])
    try:
        arrivals = []
        for _ in range(6):
            arrivals.append(time.time())
            (o,) = await d.submit(_rows(1))
            assert o.ok and not o.spilled
        allowance = d.backends["i-1"].allowance_s
        assert late_s * 0.9 < allowance < 0.5  # learned, and capped at RT_max / 2
        # The first batch went with the request's own deadline; later ones with less.
        first_gap = arrivals[0] + 1.0 - given[0]
        last_gap = arrivals[-1] + 1.0 - given[-1]
        assert abs(first_gap) < 0.05
        assert last_gap > late_s * 0.8
    finally:
        await d.close()
