"""`/metrics` counts every decision: launches, retirements, spills by cause, Bouncer
rejects, SLO attainment, the fleet's $/h; and the whole exposition parses."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from bouncer.latency import BatchLatency
from bouncer.wire import BATCH_PATH, decode_batch, encode_outputs, encode_verdict
from mark.billing import ebs_per_hour
from mark.catalog import Market, load_catalog
from mark.clock import ManualClock
from mark.config import load_settings
from mark.control import Controller, build_options
from mark.ports import SpillResult
from mark.serve.dispatcher import Backend, Dispatcher
from mark.serve.telemetry import Telemetry
from mark.sim.fleet import SimFleet
from mark.state import ArrivalWindow, open_store
from tests.prometheus_text import parse_exposition, value

T0 = 1_700_000_000.0


def test_the_parser_rejects_what_a_scrape_would() -> None:
    assert parse_exposition('a_total{x="1"} 2\nb 3.5\n') == {
        ("a_total", frozenset({("x", "1")})): 2.0,
        ("b", frozenset()): 3.5,
    }
    for bad in ('a{x="1"} 2\na{x="1"} 3\n', "a b\n", "a{x=1} 2\n", 'a{x="1",x="2"} 1\n'):
        with pytest.raises(AssertionError):
            parse_exposition(bad)


async def test_a_step_and_its_retirements_are_counted_by_reason_offering_and_cost(
    tmp_path: Path,
) -> None:
    settings = load_settings(
        overrides={
            "offerings": {"types": ["c5.large"], "markets": ["on-demand"]},
            "timings": {"cooldown_s": 600},
        }
    )
    spec = settings.models[0]
    catalog = load_catalog()
    lat = {"c5.large": BatchLatency.from_mapping({1: 0.020, 8: 0.080})}
    options = build_options(spec, catalog, ["c5.large"], [Market.ON_DEMAND], lat, 90.0)
    clock = ManualClock(T0)
    fleet = SimFleet(catalog, clock.now, boot_delay_s=lambda _t: 60.0)
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    try:
        rate = 2 * options[0].capacity_rps
        await store.add_arrivals(
            [ArrivalWindow(spec.name, T0 - 3600 + 5 * k, 5.0, int(rate * 5)) for k in range(720)]
        )
        ctl = Controller(settings, fleet, store, {spec.name: options})
        (res,) = await ctl.step(clock.now())
        n = len(res.launched)
        assert res.error is None and n >= 2
        price = catalog.offering("c5.large", "on-demand").price_per_hour
        m = parse_exposition(ctl.prometheus())
        on = {"model": spec.name, "type": "c5.large", "market": "on-demand"}
        assert value(m, "mark_launches_total", reason="launch", **on) == n
        assert value(m, "mark_decisions_total", model=spec.name, action="launch") >= 1
        assert value(m, "mark_fleet_instances", role="serving", **on) == n
        assert value(
            m, "mark_fleet_cost_per_hour_dollars", model=spec.name, market="on-demand"
        ) == pytest.approx(n * price)
        assert value(m, "mark_retirements_total") == 0

        clock.advance(3600 + 600)  # the load is gone and the cool-down over: all retire
        (res2,) = await ctl.step(clock.now())
        # stopped into the warm pool (the default), counted as retired, billed no more
        assert sorted(res2.stopped) == sorted(i.instance_id for i in res.launched)
        m = parse_exposition(ctl.prometheus())
        assert value(m, "mark_retirements_total", reason="retire-warm", **on) == n
        assert value(m, "mark_launches_total", reason="launch", **on) == n  # not again
        assert value(m, "mark_fleet_instances") == 0
        assert value(m, "mark_fleet_cost_per_hour_dollars") == 0
        billed = sum(e.cost for e in await store.ledger(model=spec.name))
        assert value(m, "mark_ec2_cost_dollars_total", model=spec.name) == pytest.approx(
            billed, abs=1e-5
        )
        # Stopped, their volumes are what EBS bills: counted, priced an hour, not yet billed.
        volume = ebs_per_hour(settings.offerings.volume_gb, catalog.ebs_gb_month)
        assert volume > 0
        assert value(m, "mark_stopped_instances", model=spec.name, type="c5.large") == n
        assert value(
            m, "mark_stopped_volume_cost_per_hour_dollars", model=spec.name
        ) == pytest.approx(n * volume, abs=1e-6)
        assert value(m, "mark_ebs_cost_dollars_total") == 0
        stopped_at = clock.now()

        clock.advance(7 * 86_400)  # far past the warm pool's hold: every volume ends
        (res3,) = await ctl.step(clock.now())
        assert sorted(res3.retired) == sorted(res2.stopped)
        m = parse_exposition(ctl.prometheus())
        assert value(m, "mark_stopped_instances") == 0
        assert value(m, "mark_ebs_cost_dollars_total", model=spec.name) == pytest.approx(
            n * volume * (clock.now() - stopped_at) / 3600.0, rel=1e-4
        )
        # Label values are a bounded vocabulary: never an instance or request id.
        assert all(not v.startswith("i-") for _, ls in m for _, v in ls)
    finally:
        await store.close()


class _Lambda:
    """The Serverless port answering zeros: only the dispatcher's counting is under test."""

    def __init__(self) -> None:
        self.rows = 0

    async def invoke(self, model: str, batch: Sequence[Any], dtype: str = "float32") -> SpillResult:
        self.rows += len(batch)
        return SpillResult([[0.0]] * len(batch), 1.0, 1, 1024, False)

    async def warm_up(self, model: str, concurrency: int) -> None:
        return None


async def _rejecting_agent() -> TestServer:
    """An agent whose Bouncer admits only the first request of each batch."""

    async def batch(request: web.Request) -> web.StreamResponse:
        rows, _ = decode_batch(await request.read())
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(encode_verdict([0], list(range(1, len(rows))), time.time()))
        await resp.write(encode_outputs([[1.0]]))
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post(BATCH_PATH, batch)
    server = TestServer(app)
    await server.start_server()
    return server


async def test_spills_are_counted_by_cause_and_rejects_by_type() -> None:
    lam = _Lambda()
    tel = Telemetry("tiny", rt_max_ms=10_000.0)
    server = await _rejecting_agent()
    async with aiohttp.ClientSession() as session:
        d = Dispatcher("tiny", 10.0, "float32", time.time, session, lam, tel)
        d.start()
        try:
            rows = np.zeros((3, 2), dtype=np.float32)
            outs = await d.submit(rows)  # no instance yet: all three spill
            assert all(o.ok and o.spilled for o in outs)
            url = str(server.make_url("")).rstrip("/")
            lat = BatchLatency.from_mapping({1: 0.001, 8: 0.001})
            d.set_backends([Backend("i-1", "c5.large", url, lat, n_batch=4, w_batch_s=0.5)])
            outs = await d.submit(np.zeros((4, 2), dtype=np.float32))  # one batch of four
            assert sum(o.served_by == "i-1" for o in outs) == 1
            assert sum(o.spilled for o in outs) == 3
            outs = await d.submit(rows[:2], spill_now=True)  # the endpoint's retry
        finally:
            await d.close()
            await server.close()
    m = parse_exposition(tel.prometheus())
    assert value(m, "mark_spills_total", cause="no-backend") == 3
    assert value(m, "mark_spills_total", cause="rejected") == 3
    assert value(m, "mark_spills_total", cause="retry") == 2
    assert value(m, "mark_spills_total", cause="failure") == 0
    assert value(m, "mark_bouncer_rejects_total", model="tiny", type="c5.large") == 3
    assert lam.rows == 8
    # Nine requests ended, all within RT_max (10 s); the histogram's +Inf bucket is the count.
    assert value(m, "mark_requests_within_slo_total", model="tiny") == 9
    assert value(m, "mark_requests_over_slo_total", model="tiny") == 0
    assert value(m, "mark_request_latency_seconds_bucket", le="+Inf") == 9
    assert value(m, "mark_request_latency_seconds_count") == 9


def test_slo_attainment_and_lambda_cost_are_counted() -> None:
    tel = Telemetry("m", rt_max_ms=100.0)
    tel.outcome(T0, 0.05, ok=True, spilled=False)
    tel.outcome(T0, 0.5, ok=True, spilled=True)
    tel.outcome(T0, 0.01, ok=False, spilled=False)  # an error never meets the SLO
    tel.lambda_charged(0.25)
    tel.lambda_charged(0.5)
    m = parse_exposition(tel.prometheus())
    assert value(m, "mark_requests_within_slo_total") == 1
    assert value(m, "mark_requests_over_slo_total") == 2
    assert value(m, "mark_recent_slo_attainment") == pytest.approx(1 / 3, abs=1e-4)
    assert value(m, "mark_lambda_cost_dollars_total", model="m") == pytest.approx(0.75)
    assert value(m, "mark_request_latency_seconds_bucket", le="0.05") == 2
    assert value(m, "mark_request_latency_seconds_bucket", le="0.5") == 3
