"""A model with two variants served end to end in this process: a real agent runs both
(two TorchScript models whose outputs differ, so each answer shows which ran), the
dispatcher chooses per batch (``bouncer.variants``), and the endpoint names the variant in
V1 and in V2 as tritonclient reads it; pins and per-request floors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import torch
import tritonclient.http.aio as triton
from aiohttp.test_utils import TestServer

from bouncer.agent import Agent
from bouncer.contract import ModelContract
from bouncer.latency import BatchLatency
from bouncer.runner import ModelRunner
from mark.config import ModelSpec, load_settings
from mark.demo import save_torchscript
from mark.ports import SpillResult
from mark.serve.auth import KeyCache, issue
from mark.serve.dispatcher import Backend, Dispatcher, Outcome
from mark.serve.endpoint import Served, build_app

KEY, TOKEN = issue("tests", ["inference"], 0.0)
METRICS_KEY, METRICS_TOKEN = issue("scraper", ["metrics"], 0.0)
LARGE_T, SMALL_T = 0.3, 0.03  # T_1 of each variant, as the agent's Bouncer admits by them
SLOWDOWN = 2.0  # the agent runs each batch for its T_1 (the rest of it a pause), as the
# local world's agents emulate a type's speed: its queue is real, not only predicted
RT_MAX = 0.5


def _net(seed: int, path: Path) -> str:
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(4, 2)).eval()
    return str(save_torchscript(net, path))


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> ModelSpec:
    d = tmp_path_factory.mktemp("variants")
    return ModelSpec.model_validate(
        {
            "name": "pair",
            "format": "torchscript",
            "inputs": [{"name": "input", "dtype": "float32", "shape": [4]}],
            "outputs": [{"name": "output", "dtype": "float32", "shape": [2]}],
            "slo": {"rt_max_ms": RT_MAX * 1000, "sl_min": 0.98, "accuracy_floor": 0.75},
            "variants": [
                {"name": "small", "source": _net(2, d / "s.pt"), "accuracy": 0.70, "metric": "m"},
                {"name": "large", "source": _net(1, d / "l.pt"), "accuracy": 0.80, "metric": "m"},
            ],
        }
    )


def _runner(contract: ModelContract, name: str) -> ModelRunner:
    return ModelRunner(contract.variant(name))


class PrimarySpill:
    """The spill function: the model's own artifact (the most accurate variant)."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.calls = 0

    async def invoke(self, model: str, batch: Sequence[Any], dtype: str = "float32") -> SpillResult:
        self.calls += 1
        out = self.runner.run({"input": np.asarray(batch, dtype=np.float32)})["output"]
        return SpillResult(out.tolist(), 1.0, 1, 1024, False)

    async def warm_up(self, model: str, concurrency: int) -> None:
        return None


class Pair:
    def __init__(self, dispatcher: Dispatcher, url: str, runners: dict[str, ModelRunner]) -> None:
        self.dispatcher, self.url, self.runners = dispatcher, url, runners

    def which(self, x: np.ndarray[Any, Any], out: Any) -> str:
        """The variant whose model gives ``out`` for the one row ``x``."""
        got = np.asarray(out, dtype=np.float32)
        for name, r in self.runners.items():
            if np.allclose(r.run({"input": x[None]})["output"][0], got, atol=1e-5):
                return name
        raise AssertionError(f"{got} is neither variant's output")


@pytest.fixture
async def pair(spec: ModelSpec) -> AsyncIterator[Pair]:
    contract = spec.contract()
    runners = {v.name: _runner(contract, v.name) for v in contract.variants}
    assert contract.variants[0].name == "large"  # the most accurate is the model's own
    agent = Agent(
        runner=ModelRunner(contract),
        latency=BatchLatency.from_mapping({1: LARGE_T / SLOWDOWN}),
        slowdown=SLOWDOWN,
        variants={"small": (runners["small"], BatchLatency.from_mapping({1: SMALL_T / SLOWDOWN}))},
    )
    agent_server = TestServer(agent.app())
    await agent_server.start_server()
    async with aiohttp.ClientSession() as session:
        disp = Dispatcher(
            "pair",
            RT_MAX,
            "float32",
            time.time,
            session,
            PrimarySpill(runners["large"]),
            variants=[(v.name, v.accuracy) for v in spec.variants],
            accuracy_floor=spec.accuracy_floor,
        )
        url = str(agent_server.make_url("")).rstrip("/")
        disp.set_backends(
            [
                Backend(
                    "i-1",
                    "c5.large",
                    url,
                    BatchLatency.from_mapping({1: LARGE_T}),
                    variants={"small": BatchLatency.from_mapping({1: SMALL_T})},
                )
            ]
        )
        disp.start()
        app = build_app(
            load_settings(),
            {"pair": Served(spec, disp, None)},
            keys=KeyCache.fixed([KEY, METRICS_KEY]),
        )
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        try:
            yield Pair(disp, f"127.0.0.1:{server.port}", runners)
        finally:
            await server.close()
            await disp.close()
    await agent_server.close()


def _rows(n: int, seed: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).random((n, 4), dtype=np.float32)


async def test_a_burst_moves_to_the_faster_variant_before_any_spill(pair: Pair) -> None:
    d = pair.dispatcher
    lull = _rows(6, seed=1)
    for i in range(6):  # one at a time, the instance idle: the accurate variant
        (o,) = await d.submit(lull[i : i + 1])
        assert o.ok and o.variant == "large" and pair.which(lull[i], o.output) == "large"
    burst = _rows(4, seed=2)
    outs: list[list[Outcome]] = await asyncio.gather(
        *(d.submit(burst[i : i + 1]) for i in range(4))
    )
    got = [o for (o,) in outs]
    # The first on the accurate variant; the accurate one would finish the next three
    # past RT_max (0.6 s and on), the fast one within it (0.33, 0.36, 0.39 s), and the
    # floor allows them.
    assert [o.variant for o in got] == ["large", "small", "small", "small"]
    assert all(o.ok and o.served_by == "i-1" for o in got)  # nothing spilled
    assert [pair.which(burst[i], o.output) for i, o in enumerate(got)] == [o.variant for o in got]
    delivered = d.ledger.delivered(time.time())
    assert delivered is not None and delivered >= 0.75 - 1e-9  # (7 x 0.8 + 3 x 0.7) / 10
    async with (
        aiohttp.ClientSession(headers={"X-Api-Key": METRICS_TOKEN}) as s,
        s.get(f"http://{pair.url}/metrics") as r,
    ):
        text = await r.text()
    assert 'mark_accuracy_floor{model="pair"} 0.75' in text
    assert f'mark_accuracy_delivered{{model="pair"}} {delivered:.6f}' in text


async def test_the_floor_keeps_the_accurate_variant_and_the_rest_spills(pair: Pair) -> None:
    d = pair.dispatcher
    for i in range(6):  # clients that pinned the fast variant spent the window: 0.70
        (o,) = await d.submit(_rows(1, seed=10 + i), pin="small")
        assert o.variant == "small"
    burst = _rows(4, seed=3)
    # Another request at 0.70 would keep the window below 0.75: all on the accurate one.
    outs = await asyncio.gather(*(d.submit(burst[i : i + 1]) for i in range(4)))
    got = [o for (o,) in outs]
    assert all(o.ok and o.variant == "large" for o in got)
    assert [o.spilled for o in got] == [False, True, True, True]  # 0.3 s each: one fits
    assert all(pair.which(burst[i], o.output) == "large" for i, o in enumerate(got))


async def test_a_pinned_variant_is_served_or_refused_explicitly(pair: Pair) -> None:
    d = pair.dispatcher
    x = _rows(1, seed=4)
    (o,) = await d.submit(x, pin="small")
    assert o.ok and o.variant == "small" and pair.which(x[0], o.output) == "small"
    d.set_backends([])  # no instance: the spill function runs only the accurate one
    (large,) = await d.submit(x, pin="large")
    assert large.ok and large.spilled and large.variant == "large"
    (small,) = await d.submit(x, pin="small")
    assert not small.ok and small.error is not None and "variant 'small'" in small.error


async def test_a_batch_its_instance_fails_is_counted_once_by_what_answers_it(
    pair: Pair, unused_tcp_port: int
) -> None:
    """Counted as sent, a batch whose instance fails is taken back: the ledger holds what
    answered each request (Lambda's accurate variant), or nothing for one that failed."""
    d = pair.dispatcher
    dead = Backend(
        "i-dead",
        "c5.large",
        f"http://127.0.0.1:{unused_tcp_port}",
        BatchLatency.from_mapping({1: LARGE_T}),
        variants={"small": BatchLatency.from_mapping({1: SMALL_T})},
    )
    d.set_backends([dead])
    (small,) = await d.submit(_rows(1, seed=6), pin="small")
    assert not small.ok and "variant 'small'" in (small.error or "")  # Lambda runs large
    assert d.ledger.delivered(time.time()) is None  # nothing was delivered
    d.set_backends([dead])
    (o,) = await d.submit(_rows(1, seed=7))
    assert o.ok and o.spilled and o.variant == "large"
    d.ledger.served(time.time(), 0.70, 1)  # one more at 0.70: (0.8 + 0.7) / 2 if counted once
    assert d.ledger.delivered(time.time()) == pytest.approx(0.75)


async def test_v1_and_tritonclient_name_the_variant_and_pins_and_floors_are_checked(
    pair: Pair,
) -> None:
    x = _rows(1, seed=5)
    headers = {"X-Api-Key": TOKEN}
    async with aiohttp.ClientSession(headers=headers) as s:
        url = f"http://{pair.url}/v1/models/pair:predict"
        async with s.post(url, json={"instances": x.tolist()}) as r:
            assert r.status == 200, await r.text()
            body = await r.json()
            assert body["variant"] == "large" and r.headers["X-Mark-Variant"] == "large"
        pinned = {"X-Mark-Variant": "small"}
        async with s.post(url, json={"instances": x.tolist()}, headers=pinned) as r:
            body = await r.json()
            assert body["variant"] == "small"
            assert pair.which(x[0], body["predictions"][0]) == "small"
        for bad, says in (
            ({"X-Mark-Variant": "tiny"}, "has no variant 'tiny' (its variants: large, small)"),
            ({"X-Mark-Accuracy-Floor": "0.9"}, "no variant of 'pair' reaches accuracy 0.9"),
            (
                {"X-Mark-Variant": "small", "X-Mark-Accuracy-Floor": "0.75"},
                "below the floor",
            ),
        ):
            async with s.post(url, json={"instances": x.tolist()}, headers=bad) as r:
                assert r.status == 400 and says in (await r.json())["error"]
    client = triton.InferenceServerClient(pair.url)
    try:
        inp = triton.InferInput("input", [1, 4], "FP32")
        inp.set_data_from_numpy(x)
        res = await client.infer("pair", [inp], headers=headers)
        assert res.get_response()["parameters"]["variant"] == "large"
        res = await client.infer("pair", [inp], headers=headers, parameters={"variant": "small"})
        assert res.get_response()["parameters"]["variant"] == "small"
        assert pair.which(x[0], res.as_numpy("output")[0]) == "small"
    finally:
        await client.close()
