"""End to end in the local world: EC2 on a real moto server, agent processes, awslambdaric spill."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from bouncer.wire import SERVED_BY_HEADER
from mark.catalog import Market
from mark.config import Settings, load_settings
from mark.daemon import Running, start, stop
from mark.demo import load_digits_tensors
from mark.ports import InstanceState, LaunchRequest
from mark.serve.auth import create_key
from tests.processes import left_behind
from tests.runners import source_runner


async def admin_key(run: Running) -> str:
    """A key that may also see who served each request, known to the endpoint at once."""
    assert run.keys is not None
    _, token = await create_key(run.store, "tests", ["inference", "admin"], time.time())
    await run.keys.refresh()
    return token


def _spill_everything(settings: Settings) -> Settings:
    """No declines (``slo.decline_share`` 0): every request over capacity goes to Lambda, so
    a test can count spills. Declining is tested where the budget is (test_dispatcher)."""
    models = tuple(
        m.model_copy(update={"slo": m.slo.model_copy(update={"decline_share": 0.0})})
        for m in settings.models
    )
    return settings.model_copy(update={"models": models})


@pytest.mark.slow
async def test_burst_over_capacity_spills_to_lambda_and_loses_nothing(
    tmp_path: Path, children_before: frozenset[int]
) -> None:
    settings = load_settings(
        overrides={
            "data_dir": str(tmp_path),
            "api": {"port": 0},
            # c5.large emulated 300x slower than this machine: a few ms+ per batch, so a
            # burst of 300 is well over what it can finish within RT_max (100 ms)
            "local": {
                "control_loop": False,
                "boot_delay_s": 0,
                "lambda_concurrency": 2,
                "slowdown": {"c5.large": 300},
            },
        }
    )
    run = await start(_spill_everything(settings))
    try:
        from mark.cloud.local.world import LocalWorld

        assert isinstance(run.world, LocalWorld)
        fleet = run.world.fleet
        assert fleet is not None
        (inst,) = await fleet.launch(LaunchRequest("digits", "c5.large", Market.ON_DEMAND))
        listed = await fleet.list()  # the instance exists in the EC2 API, tagged as ours
        assert [i.instance_id for i in listed] == [inst.instance_id]
        assert listed[0].state in (InstanceState.PENDING, InstanceState.RUNNING)
        dispatcher = run.models["digits"].dispatcher
        assert dispatcher is not None
        deadline = time.monotonic() + 90
        while not dispatcher.backends:
            assert time.monotonic() < deadline, "the agent never came up"
            await asyncio.sleep(0.5)

        x, _ = load_digits_tensors()
        n = 300
        images = x[:n].numpy()
        expected = source_runner(run.world.models["digits"].source).run(images)
        who: list[str] = []
        key = {"Authorization": f"Bearer {await admin_key(run)}"}  # to see X-Mark-Served-By
        async with aiohttp.ClientSession(headers=key) as session:

            async def one(i: int) -> list[float]:
                body = {"instances": [images[i].tolist()]}
                async with session.post(f"{run.url}/v1/models/digits:predict", json=body) as r:
                    assert r.status == 200, await r.text()
                    who.append(r.headers[SERVED_BY_HEADER])
                    return (await r.json())["predictions"][0]  # type: ignore[no-any-return]

            got = await asyncio.gather(*(one(i) for i in range(n)))
        assert np.allclose(np.asarray(got), expected, atol=1e-4)  # every request, right answer
        tel = run.models["digits"].telemetry
        assert tel is not None
        assert tel.counts["error"] == 0
        assert tel.counts["served"] > 0, "the instance served nothing"
        assert tel.counts["spilled"] > 0, "a burst over capacity must spill to Lambda"
        assert tel.counts["served"] + tel.counts["spilled"] == n
        # The response header names who answered, and agrees with telemetry.
        assert who.count(inst.instance_id) == tel.counts["served"]
        assert who.count("lambda") == tel.counts["spilled"]
        assert run.world.serverless is not None and run.world.serverless.cold_starts >= 1
    finally:
        await stop(run)
    assert left_behind(os.getpid(), children_before) == []  # no agent or Lambda runtime


@pytest.mark.slow
async def test_spot_interruption_event_starts_the_standby_and_no_request_is_lost(
    tmp_path: Path, children_before: frozenset[int]
) -> None:
    import json
    from datetime import UTC, datetime

    from aiobotocore.session import get_session

    from mark.ports import InstanceRole

    settings = load_settings(
        overrides={
            "data_dir": str(tmp_path),
            "api": {"port": 0},
            "offerings": {
                "types": ["c5.large"],
                "markets": ["spot", "on-demand"],
                "standby_types": ["t3.large"],
            },
            "local": {"boot_delay_s": 0, "lambda_concurrency": 2},
            # The spot instance is launched by hand and idle until the load starts: keep
            # it past the default cool-down (the boot time, seconds here).
            "timings": {"cooldown_s": 600},
        }
    )
    settings = _spill_everything(settings)  # the gap until the standby serves spills
    run = await start(settings)
    try:
        fleet = run.world.fleet
        assert fleet is not None and run.controller is not None
        # The planner rates each offering from the very profile the agents emulate.
        from mark.cloud.local.agents import default_slowdown
        from mark.cloud.local.world import LocalWorld
        from mark.control import build_options

        assert isinstance(run.world, LocalWorld)
        profile = run.world.profiles["digits"]
        stretch = default_slowdown(run.controller.catalog, settings.local.slowdown)
        expected_options = build_options(
            settings.models[0],
            run.controller.catalog,
            ["c5.large"],
            [Market.SPOT, Market.ON_DEMAND],
            {"c5.large": profile.scaled(stretch("c5.large"))},
            boot_s=run.controller.boot_s,
        )
        assert run.controller.options["digits"] == expected_options
        # A retirement drains the request path first (``mark.ports.Draining``).
        from mark.serve.dispatcher import Dispatchers

        draining = run.controller.draining
        assert isinstance(draining, Dispatchers)
        assert list(draining.each) == [run.models["digits"].dispatcher]
        (spot,) = await fleet.launch(LaunchRequest("digits", "c5.large", Market.SPOT))
        (standby,) = await fleet.launch(
            LaunchRequest("digits", "t3.large", Market.ON_DEMAND, 1, InstanceRole.STANDBY)
        )
        await fleet.stop([standby.instance_id])
        dispatcher = run.models["digits"].dispatcher
        assert dispatcher is not None
        deadline = time.monotonic() + 90
        while set(dispatcher.backends) != {spot.instance_id}:
            assert time.monotonic() < deadline, "the spot instance's agent never came up"
            await asyncio.sleep(0.5)

        x, _ = load_digits_tensors()
        images = x[:64].numpy()
        expected = source_runner(run.world.models["digits"].source).run(images)
        results: list[tuple[int, list[float]]] = []
        stop_load = asyncio.Event()

        async def load() -> None:
            key = {"Authorization": f"Bearer {run.api_key}"}
            async with aiohttp.ClientSession(headers=key) as session:
                i = 0
                while not stop_load.is_set():
                    k = i % len(images)
                    body = {"instances": [images[k].tolist()]}
                    async with session.post(f"{run.url}/v1/models/digits:predict", json=body) as r:
                        assert r.status == 200, await r.text()
                        results.append((k, (await r.json())["predictions"][0]))
                    i += 1
                    await asyncio.sleep(0.02)

        loader = asyncio.create_task(load())
        await asyncio.sleep(1.0)
        event = {
            "version": "0",
            "id": "e1",
            "detail-type": "EC2 Spot Instance Interruption Warning",
            "source": "aws.ec2",
            "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "region": "us-east-1",
            "resources": [f"arn:aws:ec2:us-east-1:123456789012:instance/{spot.instance_id}"],
            "detail": {"instance-id": spot.instance_id, "instance-action": "terminate"},
        }
        async with get_session().create_client(
            "sqs", region_name="us-east-1", endpoint_url=run.world.endpoint
        ) as sqs:
            url = (await sqs.get_queue_url(QueueName=run.world.queue_name))["QueueUrl"]
            await sqs.send_message(QueueUrl=url, MessageBody=json.dumps(event))

        async def a_standby_serves() -> bool:
            # The one launched here, or one the controller's own pool launched at its first
            # step (which of them the notice starts depends on when that step ran).
            ids = {i.instance_id for i in await fleet.list() if i.role is InstanceRole.STANDBY}
            return bool(ids & set(dispatcher.backends))

        deadline = time.monotonic() + 90
        while not await a_standby_serves():  # started, agent up, serving
            if time.monotonic() > deadline:
                why = "\n".join(
                    f"{d.at:.1f} {d.action} {d.instance_type} {d.instance_id}: {d.reason[:160]}"
                    for d in await run.store.decisions(0, 1e12)
                )
                raise AssertionError(f"the standby never started serving; decisions:\n{why}")
            await asyncio.sleep(0.5)
        await asyncio.sleep(1.0)
        stop_load.set()
        await loader
        decisions = [d.action for d in await run.store.decisions(0, 1e12)]
        assert "start-standby" in decisions
        assert results, "no request was sent"
        for k, out in results:  # every request got the right answer
            assert np.allclose(out, expected[k], atol=1e-4)
    finally:
        await stop(run)
    assert left_behind(os.getpid(), children_before) == []


@pytest.mark.slow
async def test_a_retired_instance_waits_stopped_and_serves_again_when_the_load_returns(
    tmp_path: Path, children_before: frozenset[int]
) -> None:
    """The warm pool in the local world: moto stops and starts the instance, its agent goes
    and comes back, the request path drains it and then sends to it again, and every
    request is answered right; the controller steps by hand, on the wall clock (its own
    loop steps once at the start, with no load)."""
    settings = load_settings(
        overrides={
            "data_dir": str(tmp_path),
            "api": {"port": 0},
            "offerings": {"types": ["c5.large"], "markets": ["on-demand"]},
            "predictor": {"model": "last"},
            # A launch boots 5 s here and a start 1 s: stopping pays (provisioner.warm_pool).
            "local": {"boot_delay_s": 5, "lambda_concurrency": 2},
            # The loop's own steps an hour apart, none early: the test steps by hand.
            "timings": {
                "warm_start_s": 1,
                "billing_minimum_s": 0,
                "update_period_s": 3600,
                "early_steps": False,
            },
        }
    )
    run = await start(_spill_everything(settings))
    try:
        fleet = run.world.fleet
        ctl = run.controller
        dispatcher = run.models["digits"].dispatcher
        assert fleet is not None and ctl is not None and dispatcher is not None
        (inst,) = await fleet.launch(LaunchRequest("digits", "c5.large", Market.ON_DEMAND))
        iid = inst.instance_id

        async def until(
            what: str, ok: Callable[[], Awaitable[bool]], limit_s: float = 90.0
        ) -> None:
            deadline = time.monotonic() + limit_s
            while not await ok():
                if time.monotonic() > deadline:
                    why = "\n".join(
                        f"{d.at:.1f} {d.action} {d.instance_id}: {d.reason[:160]}"
                        for d in await run.store.decisions(0, 1e12)
                    )
                    raise AssertionError(f"{what}; decisions:\n{why}")
                await asyncio.sleep(0.5)

        async def serving() -> bool:
            return iid in dispatcher.backends

        async def state() -> InstanceState:
            return next(i.state for i in await fleet.list() if i.instance_id == iid)

        async def stopped() -> bool:
            return await state() is InstanceState.STOPPED and iid not in dispatcher.backends

        await until("the agent never came up", serving)
        from mark.cloud.local.world import LocalWorld

        assert isinstance(run.world, LocalWorld)
        # No load: the plan wants nothing, and past a start's cool-down it is stopped.
        await asyncio.sleep(1.5)
        (idle,) = await ctl.step(time.time())
        assert idle.stopped == [iid] and idle.retired == [], idle
        await until("the instance never stopped", stopped)

        x, _ = load_digits_tensors()
        images = x[:32].numpy()
        expected = source_runner(run.world.models["digits"].source).run(images)
        answers: list[tuple[int, list[float], str]] = []
        done = asyncio.Event()
        key = {"Authorization": f"Bearer {await admin_key(run)}"}  # to see X-Mark-Served-By

        async def load() -> None:
            async with aiohttp.ClientSession(headers=key) as session:
                i = 0
                while not done.is_set():
                    k = i % len(images)
                    body = {"instances": [images[k].tolist()]}
                    async with session.post(f"{run.url}/v1/models/digits:predict", json=body) as r:
                        assert r.status == 200, await r.text()
                        out = (await r.json())["predictions"][0]
                        answers.append((k, out, r.headers[SERVED_BY_HEADER]))
                    i += 1
                    await asyncio.sleep(0.02)

        loader = asyncio.create_task(load())
        try:
            await asyncio.sleep(2 * settings.timings.sample_window_s + 1)  # windows stored
            await ctl.step(time.time())
            await until("the started instance never served again", serving)
            await until(
                "no request reached the started instance",
                lambda: asyncio.sleep(0, any(w == iid for *_, w in answers[-20:])),
            )
        finally:
            done.set()
            await loader
        for k, out, _ in answers:  # every request answered, right, by Lambda or the instance
            assert np.allclose(out, expected[k], atol=1e-4)
        actions = [d.action for d in await run.store.decisions(0, 1e12)]
        assert "retire-warm" in actions and "warm-start" in actions
        assert [i.instance_id for i in await fleet.list()] == [iid]  # nothing launched anew
    finally:
        await stop(run)
    assert left_behind(os.getpid(), children_before) == []
