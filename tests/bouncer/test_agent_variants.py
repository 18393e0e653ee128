"""An agent built from a contract with variants loads and profiles each, reports their
T_b, and runs a batch on the variant it names (``X-Mark-Variant``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
from aiohttp.test_utils import TestClient, TestServer

from bouncer.agent import build_agent
from bouncer.latency import BatchLatency
from bouncer.wire import health_variants
from mark.config import ModelSpec
from mark.demo import save_torchscript


def _spec(tmp_path: Path) -> ModelSpec:
    paths = {}
    for seed, name in ((1, "large"), (2, "small")):
        torch.manual_seed(seed)
        net = torch.nn.Sequential(torch.nn.Linear(4, 2)).eval()
        paths[name] = str(save_torchscript(net, tmp_path / f"{name}.pt"))
    return ModelSpec.model_validate(
        {
            "name": "pair",
            "format": "torchscript",
            "inputs": [{"name": "input", "dtype": "float32", "shape": [4]}],
            "outputs": [{"name": "output", "dtype": "float32", "shape": [2]}],
            "slo": {"rt_max_ms": 500, "sl_min": 0.98},
            "variants": [
                {"name": "large", "source": paths["large"], "accuracy": 0.8, "metric": "m"},
                {"name": "small", "source": paths["small"], "accuracy": 0.7, "metric": "m"},
            ],
        }
    )


async def test_an_agent_runs_the_variant_a_batch_names(tmp_path: Path) -> None:
    contract = _spec(tmp_path).contract()
    agent = build_agent(contract, 1.0, BatchLatency.from_mapping({1: 0.01}))
    assert agent.primary == "large" and set(agent.variants) == {"small"}
    x = np.random.default_rng(0).random((2, 4), dtype=np.float32)
    body = {"instances": x.tolist(), "deadlines": [time.time() + 5] * 2}
    small = agent.variants["small"][0].run({"input": x})["output"]
    async with TestClient(TestServer(agent.app())) as client:
        health = await (await client.get("/health")).json()
        assert set(health_variants(health)) == {"small"}  # profiled on this machine
        outs = {}
        for name in (None, "large", "small"):
            headers = {"X-Mark-Variant": name} if name else {}
            resp = await client.post("/v1/batch", json=body, headers=headers)
            assert resp.status == 200
            lines = [json.loads(line) for line in (await resp.text()).splitlines()]
            outs[name] = np.asarray(lines[1]["outputs"], dtype=np.float32)
        assert np.allclose(outs[None], outs["large"])  # the model's own is the primary
        assert np.allclose(outs["small"], small, atol=1e-6)
        assert not np.allclose(outs["small"], outs["large"])
        # A batch its named variant would finish late runs on the fallback it was given.
        late = {"instances": x.tolist(), "deadlines": [time.time() + 0.001] * 2}
        fb = {"X-Mark-Variant": "large", "X-Mark-Variant-Fallback": "small"}
        resp = await client.post("/v1/batch", json=late, headers=fb)
        head = json.loads((await resp.text()).splitlines()[0])
        assert head["variant"] == "small"
        on_time = await client.post("/v1/batch", json=body, headers=fb)
        assert json.loads((await on_time.text()).splitlines()[0])["variant"] == "large"
        bad = await client.post("/v1/batch", json=body, headers={"X-Mark-Variant": "tiny"})
        assert bad.status == 400 and "no variant 'tiny' loaded here" in (await bad.json())["error"]
