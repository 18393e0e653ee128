"""A team's own models side by side in the local world, from a model repository.

An ONNX model with two named inputs (one with a variable sequence length) and two
outputs, and a TorchScript MLP, each in its own directory with a manifest. First
every request spills (no instance yet: the awslambdaric runtimes run them), then
each model gets one instance (an agent process) and serves. Clients are
tritonclient (JSON and binary tensors) and V1 as curl sends it; every output must
equal running the model directly.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import torch
import tritonclient.http.aio as triton
import yaml

from bouncer.wire import SERVED_BY_HEADER
from mark.catalog import Market
from mark.config import load_settings
from mark.daemon import Running, start, stop
from mark.ports import LaunchRequest
from mark.reload import reload_models
from tests.e2e.test_local_world import admin_key
from tests.model_zoo import (
    mlp_module,
    mlp_torchscript,
    two_io_manifest,
    two_io_onnx,
    two_io_reference,
)
from tests.processes import left_behind

SLO = {"rt_max_ms": 2000, "sl_min": 0.9, "decline_share": 0.0}
RANKER = two_io_manifest("onnx", SLO)
MLP = {
    "format": "torchscript",
    "inputs": [{"name": "features", "dtype": "float32", "shape": [16]}],
    "outputs": [{"name": "scores", "dtype": "float32"}],  # shape learnt by the check
    "slo": SLO,
}


def _repository(root: Path) -> Path:
    two_io_onnx(root / "ranker" / "3" / "model.onnx")
    (root / "ranker" / "model.yaml").write_text(yaml.safe_dump(RANKER))
    mlp_torchscript(root / "mlp" / "model.pt")
    (root / "mlp" / "model.yaml").write_text(yaml.safe_dump(MLP))
    return root


class _Key:
    """A tritonclient plugin: every request it sends carries the key."""

    def __init__(self, token: str) -> None:
        self.token = token

    def __call__(self, request: Any) -> None:
        request.headers["X-Api-Key"] = self.token


def _tensor(name: str, x: np.ndarray[Any, Any], binary: bool) -> triton.InferInput:
    t = triton.InferInput(name, list(x.shape), "FP32")
    t.set_data_from_numpy(x, binary_data=binary)
    return t


async def _ranker_via_triton(run: Running, token: str, seq: int, binary: bool) -> None:
    rng = np.random.default_rng(seq)
    tokens = rng.random((3, seq, 8), dtype=np.float32)
    scale = rng.random((3, 1), dtype=np.float32)
    want = two_io_reference(tokens, scale)
    client = triton.InferenceServerClient(run.url.removeprefix("http://"))
    client.register_plugin(_Key(token))
    try:
        result = await client.infer(
            "ranker",
            [_tensor("tokens", tokens, binary), _tensor("scale", scale, binary)],
            outputs=[
                triton.InferRequestedOutput("pooled", binary_data=binary),
                triton.InferRequestedOutput("norm", binary_data=binary),
            ],
        )
    finally:
        await client.close()
    for name in ("pooled", "norm"):
        got = result.as_numpy(name)
        assert got.dtype == np.float32 and got.shape == want[name].shape
        np.testing.assert_allclose(got, want[name], rtol=1e-5, atol=1e-6)


async def _mlp_via_v1(run: Running, token: str) -> str:
    """As ``curl -d '{"instances": [...]}'`` sends it; the answer's served-by header."""
    x = np.random.default_rng(7).random((4, 16), dtype=np.float32)
    with torch.inference_mode():
        want = mlp_module()(torch.from_numpy(x)).numpy()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            f"{run.url}/v1/models/mlp:predict", json={"instances": x.tolist()}, headers=headers
        ) as r,
    ):
        assert r.status == 200, await r.text()
        body = await r.json()
        served_by = r.headers[SERVED_BY_HEADER]
    np.testing.assert_allclose(np.asarray(body["predictions"]), want, rtol=1e-5, atol=1e-6)
    return served_by


async def _ranker_via_v1_rows(run: Running, token: str) -> None:
    """TF-Serving's row form for several inputs: each instance an object by input name."""
    tokens = np.random.default_rng(3).random((2, 4, 8), dtype=np.float32)
    scale = np.array([[2.0], [0.5]], dtype=np.float32)
    want = two_io_reference(tokens, scale)
    rows = [{"tokens": tokens[i].tolist(), "scale": scale[i].tolist()} for i in range(2)]
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as s,
        s.post(f"{run.url}/v1/models/ranker:predict", json={"instances": rows}) as r,
    ):
        assert r.status == 200, await r.text()
        predictions = (await r.json())["predictions"]
    for i, row in enumerate(predictions):
        assert set(row) == {"pooled", "norm"}
        np.testing.assert_allclose(row["pooled"], want["pooled"][i], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(row["norm"], want["norm"][i], rtol=1e-5, atol=1e-6)


async def _serve_all(run: Running, token: str) -> str:
    for seq, binary in ((5, False), (2, True), (9, True)):
        await _ranker_via_triton(run, token, seq, binary)
    await _ranker_via_v1_rows(run, token)
    return await _mlp_via_v1(run, token)


@pytest.mark.slow
async def test_an_onnx_and_a_torchscript_model_serve_side_by_side(
    tmp_path: Path, children_before: frozenset[int]
) -> None:
    settings = load_settings(
        overrides={
            "data_dir": str(tmp_path),
            "repository": str(_repository(tmp_path / "models")),
            "api": {"port": 0},
            "local": {"control_loop": False, "boot_delay_s": 0, "lambda_concurrency": 2},
        }
    )
    from mark.cli.model_checks import checked

    run = await start(checked(settings))
    try:
        token = await admin_key(run)
        client = triton.InferenceServerClient(run.url.removeprefix("http://"))
        client.register_plugin(_Key(token))
        try:
            meta = await client.get_model_metadata("ranker")
            mlp_meta = await client.get_model_metadata("mlp", "1")
        finally:
            await client.close()
        assert meta["versions"] == ["3"] and meta["platform"] == "onnxruntime_onnx"
        assert meta["inputs"] == [
            {"name": "tokens", "datatype": "FP32", "shape": [-1, -1, 8]},
            {"name": "scale", "datatype": "FP32", "shape": [-1, 1]},
        ]
        assert [o["shape"] for o in meta["outputs"]] == [[-1, 8], [-1, 1]]
        assert mlp_meta["outputs"] == [{"name": "scores", "datatype": "FP32", "shape": [-1, 4]}]

        assert await _serve_all(run, token) == "lambda"  # no instance yet: all spilled

        from mark.cloud.local.world import LocalWorld

        assert isinstance(run.world, LocalWorld) and run.world.fleet is not None
        for name in ("ranker", "mlp"):
            await run.world.fleet.launch(LaunchRequest(name, "c5.large", Market.ON_DEMAND))
        deadline = time.monotonic() + 120
        for name in ("ranker", "mlp"):
            dispatcher = run.models[name].dispatcher
            assert dispatcher is not None
            while not dispatcher.backends:
                assert time.monotonic() < deadline, f"{name}'s agent never came up"
                await asyncio.sleep(0.5)
        served_by = await _serve_all(run, token)
        assert served_by.startswith("i-")  # an instance of its own model
        mlp_backends = run.models["mlp"].dispatcher.backends  # type: ignore[union-attr]
        assert set(served_by.split(",")) <= set(mlp_backends)
    finally:
        await stop(run)
    assert left_behind(os.getpid(), children_before) == []


@pytest.mark.slow
async def test_models_added_to_and_removed_from_the_repository_while_it_serves(
    tmp_path: Path, children_before: frozenset[int]
) -> None:
    """Read again (SIGHUP's path): a model added answers, a model removed is 404, and a
    model whose new version does not load is refused while its old version serves on."""
    root = tmp_path / "models"
    mlp_torchscript(root / "mlp" / "1" / "model.pt")
    (root / "mlp" / "model.yaml").write_text(yaml.safe_dump(MLP))
    settings = load_settings(
        overrides={
            "data_dir": str(tmp_path),
            "repository": str(root),
            "repository_poll_s": 0,
            "api": {"port": 0},
            "local": {"control_loop": False, "boot_delay_s": 0, "lambda_concurrency": 1},
        }
    )
    from mark.cli.model_checks import checked

    run = await start(checked(settings))
    try:
        token = await admin_key(run)
        headers = {"Authorization": f"Bearer {token}"}

        async def status(model: str) -> int:
            async with (
                aiohttp.ClientSession(headers=headers) as s,
                s.get(f"{run.url}/v2/models/{model}") as r,
            ):
                return r.status

        async def reread() -> None:
            done = run.reloads + 1
            run.reload_now.set()
            deadline = time.monotonic() + 60
            while run.reloads < done:
                assert time.monotonic() < deadline, "the repository was not read again"
                await asyncio.sleep(0.2)

        assert await status("ranker") == 404
        two_io_onnx(root / "ranker" / "1" / "model.onnx")
        (root / "ranker" / "model.yaml").write_text(yaml.safe_dump(RANKER))
        await reread()
        assert await status("ranker") == 200
        await _ranker_via_triton(run, token, 4, True)  # spilled: no instance, the new contract
        async with (
            aiohttp.ClientSession(headers=headers) as s,
            s.get(f"{run.url}/openapi.json") as r,
        ):
            paths = (await r.json())["paths"]
        assert any("ranker" in str(p) for p in paths.values())  # documented as served now
        # Read again with nothing changed (mlp's output shape learnt, not declared): nothing.
        assert await reload_models(run) == []
        (root / "mlp" / "2").mkdir()
        (root / "mlp" / "2" / "model.pt").write_bytes(b"not TorchScript")
        await reread()
        assert run.models["mlp"].spec.version == "1"  # version 2 refused: 1 serves on
        assert ("mlp", "2") in run.refused
        assert await _mlp_via_v1(run, token) == "lambda"
        shutil.rmtree(root / "mlp")
        await reread()
        assert await status("mlp") == 404 and "mlp" not in run.models
    finally:
        await stop(run)
    assert left_behind(os.getpid(), children_before) == []
