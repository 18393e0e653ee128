"""The agent over real HTTP with a real TorchScript model."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from aiohttp.test_utils import TestClient, TestServer

from bouncer.agent import Agent
from bouncer.latency import BatchLatency
from bouncer.runner import ModelLoadError, ModelRunner, load_model
from mark.demo import save_torchscript


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(6, 3)).eval()
    return save_torchscript(net, tmp_path_factory.mktemp("m") / "tiny.pt")


async def _lines(resp: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (await resp.read()).splitlines()]


async def test_admitted_requests_get_real_outputs_rejected_come_back_first(
    model_path: Path,
) -> None:
    runner = ModelRunner(str(model_path))
    agent = Agent(runner=runner, latency=BatchLatency.from_mapping({1: 0.05, 4: 0.08}))
    x = np.random.default_rng(0).random((3, 2, 3), dtype=np.float32)
    now = time.time()
    async with TestClient(TestServer(agent.app())) as client:
        resp = await client.post(
            "/v1/batch",
            json={"instances": x.tolist(), "deadlines": [now + 5, now + 0.001, now + 5]},
        )
        assert resp.status == 200
        head, tail = await _lines(resp)
        assert head["admitted"] == [0, 2] and head["rejected"] == [1]
        expected = runner.model(torch.from_numpy(x[[0, 2]])).detach().numpy()
        assert np.allclose(tail["outputs"], expected, atol=1e-6)
        health = await (await client.get("/health")).json()
        assert (health["served"], health["rejected"], health["queue_depth"]) == (2, 1, 0)


async def test_bad_batches_are_400_and_the_agent_keeps_serving(model_path: Path) -> None:
    agent = Agent(runner=ModelRunner(str(model_path)), latency=BatchLatency.from_mapping({1: 0.01}))
    async with TestClient(TestServer(agent.app())) as client:
        for body in (
            {"instances": [[1.0]]},  # no deadlines
            {"instances": [[[0] * 3] * 2], "deadlines": [1, 2]},  # count mismatch
            {"instances": [[[0] * 3] * 2], "deadlines": [1], "dtype": "complex"},
        ):
            assert (await client.post("/v1/batch", json=body)).status == 400
        wrong = {"instances": [[0.0] * 5], "deadlines": [time.time() + 5]}  # bad shape
        head, tail = await _lines(await client.post("/v1/batch", json=wrong))
        assert head["admitted"] == [0] and "inference failed" in tail["error"]
        ok = {"instances": [[[0.0] * 3] * 2], "deadlines": [time.time() + 5]}
        head, tail = await _lines(await client.post("/v1/batch", json=ok))
        assert len(tail["outputs"]) == 1


def test_measured_profile_is_monotone_enough(model_path: Path) -> None:
    runner = ModelRunner(str(model_path))
    lat = runner.profile(np.zeros((2, 3), dtype=np.float32), sizes=(1, 8), runs=3)
    assert all(t > 0 for _, t in lat.points)


def test_bad_sources_say_why(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a model")
    with pytest.raises(ModelLoadError, match="not a TorchScript file"):
        load_model(str(junk))
    with pytest.raises(ModelLoadError, match="neither a file"):
        load_model("nowhere")
    with pytest.raises(ModelLoadError, match="cannot import"):
        load_model("no_such_pkg.mod:f")
    with pytest.raises(ModelLoadError, match="not a torch module"):
        load_model("builtins:dict")
    with pytest.raises(ModelLoadError, match="factory 'json:dumps' failed: TypeError"):
        load_model("json:dumps")
