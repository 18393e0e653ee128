"""A model with two variants in the local world: one instance (an agent process that loads
both), a lull served by the accurate variant, then a burst beyond what it can finish in
time on it: batches move to the fast variant before anything spills, the accuracy
delivered stays at or above the floor, and every answer names its variant (tritonclient
and V1). Each variant is a different seeded MLP, so an answer shows which one ran."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import torch
import tritonclient.http.aio as triton
import yaml

from mark.catalog import Market
from mark.cli.model_checks import checked
from mark.config import load_settings
from mark.daemon import Running, start, stop
from mark.ports import LaunchRequest
from tests.e2e.test_local_world import admin_key
from tests.processes import left_behind

LARGE_T = "1:0.01,8:0.02"  # the accurate variant's T_b here; c5.large emulates it 4x slower
FLOOR = 0.75


def _mlp(seed: int, path: Path) -> torch.nn.Module:
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(4, 2)).eval()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.save(torch.jit.script(net), str(path))
    return net


def _repository(root: Path) -> dict[str, torch.nn.Module]:
    nets = {"large": _mlp(1, root / "pair" / "1" / "large.pt")}
    nets["small"] = _mlp(2, root / "pair" / "1" / "small.pt")
    manifest = {
        "format": "torchscript",
        "inputs": [{"name": "input", "dtype": "float32", "shape": [4]}],
        "outputs": [{"name": "output", "dtype": "float32", "shape": [2]}],
        "slo": {"rt_max_ms": 150, "sl_min": 0.9, "accuracy_floor": FLOOR},
        "variants": [
            {"name": "large", "artifact": "large.pt", "accuracy": 0.80, "metric": "top-1"},
            {"name": "small", "artifact": "small.pt", "accuracy": 0.70, "metric": "top-1"},
        ],
    }
    (root / "pair" / "model.yaml").write_text(yaml.safe_dump(manifest))
    return nets


def _which(nets: dict[str, torch.nn.Module], x: np.ndarray[Any, Any], out: Any) -> str:
    got = np.asarray(out, dtype=np.float32)
    with torch.inference_mode():
        for name, net in nets.items():
            if np.allclose(net(torch.from_numpy(x)).numpy(), got, atol=1e-5):
                return name
    raise AssertionError(f"{got} is neither variant's output")


class _Key:
    def __init__(self, token: str) -> None:
        self.token = token

    def __call__(self, request: Any) -> None:
        request.headers["X-Api-Key"] = self.token


async def _v1(run: Running, token: str, x: np.ndarray[Any, Any]) -> tuple[str, Any, str]:
    async with (
        aiohttp.ClientSession(headers={"X-Api-Key": token}) as s,
        s.post(f"{run.url}/v1/models/pair:predict", json={"instances": x.tolist()}) as r,
    ):
        body = await r.json()
        assert r.status == 200, body
        return body["variant"], body["predictions"], r.headers["X-Mark-Served-By"]


@pytest.mark.slow
async def test_a_burst_moves_to_the_fast_variant_before_anything_spills(
    tmp_path: Path, children_before: frozenset[int]
) -> None:
    nets = _repository(tmp_path / "models")
    settings = load_settings(
        overrides={
            "data_dir": str(tmp_path),
            "repository": str(tmp_path / "models"),
            "api": {"port": 0},
            "local": {
                "control_loop": False,
                "boot_delay_s": 0,
                "lambda_concurrency": 2,
                "reference_profile": {"pair": LARGE_T},
            },
        }
    )
    run = await start(checked(settings))
    try:
        token = await admin_key(run)
        from mark.cloud.local.world import LocalWorld

        assert isinstance(run.world, LocalWorld) and run.world.fleet is not None
        await run.world.fleet.launch(LaunchRequest("pair", "c5.large", Market.ON_DEMAND))
        dispatcher = run.models["pair"].dispatcher
        assert dispatcher is not None
        deadline = time.monotonic() + 120
        while not dispatcher.backends:
            assert time.monotonic() < deadline, "the agent never came up"
            await asyncio.sleep(0.5)
        (backend,) = dispatcher.backends.values()
        assert set(backend.variants) == {"small"}  # the agent loaded and profiled both

        rng = np.random.default_rng(0)
        for _ in range(16):  # a lull: one at a time, the accurate variant
            x = rng.random((1, 4), dtype=np.float32)
            variant, out, who = await _v1(run, token, x)
            assert variant == "large" and _which(nets, x, out) == "large" and who.startswith("i-")

        client = triton.InferenceServerClient(run.url.removeprefix("http://"))
        client.register_plugin(_Key(token))
        burst = rng.random((24, 1, 4), dtype=np.float32)
        try:

            async def one(x: np.ndarray[Any, Any]) -> Any:
                t = triton.InferInput("input", [1, 4], "FP32")
                t.set_data_from_numpy(x)
                return await client.infer("pair", [t])

            results = await asyncio.gather(*(one(x) for x in burst))
        finally:
            await client.close()
        named = [r.get_response()["parameters"]["variant"] for r in results]
        ran = [_which(nets, x, r.as_numpy("output")) for x, r in zip(burst, results, strict=True)]
        assert named == ran  # each answer names the variant that computed it
        assert "small" in named  # the burst moved to the fast variant...
        tel = run.models["pair"].telemetry
        assert tel is not None and tel.counts["spilled"] == 0  # ...before anything spilled
        delivered = dispatcher.ledger.delivered(time.time())
        assert delivered is not None and delivered >= FLOOR - 1e-9
    finally:
        await stop(run)
    assert left_behind(os.getpid(), children_before) == []
