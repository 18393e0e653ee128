"""Two models from one model repository in S3, in the aws world (moto EC2 and S3, real
agents): the controller reads the repository, tags each instance with its model and
version, each instance's agent fetches its own model's artifact from S3 at boot (as the
stack's workers do), and the spill function loads the model each request names."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import boto3
import numpy as np
import pytest
import torch
import yaml

from mark.catalog import Market
from mark.cloud.aws.instances import TAG_VERSION
from mark.cloud.local.lambda_ import LocalLambda
from mark.cloud.standins.ec2_host import Ec2Host
from mark.cloud.standins.lambda_api import LambdaApi
from mark.config import Settings, load_settings
from mark.control.reconcile import LIVE
from mark.daemon import Running, start, stop
from mark.ports import InstanceInfo, InstanceRole, LaunchRequest
from mark.state import ArrivalWindow, open_store
from tests.e2e.test_aws_world import FUNCTION, REGION, _free_port, _stack, _until
from tests.model_zoo import (
    mlp_module,
    mlp_torchscript,
    two_io_manifest,
    two_io_onnx,
    two_io_reference,
)
from tests.processes import left_behind, live_children

SLO = {"rt_max_ms": 2000, "sl_min": 0.9, "decline_share": 0.0}
RANKER = two_io_manifest("onnx", SLO, version=2, profile="profile.json")
PROFILE = [  # what the planner rates c5.large by (stated for the test, not measured)
    {"model": "ranker", "instance_type": "c5.large", "batch_latency_s": {"1": 0.01, "8": 0.02}}
]
MLP = {
    "format": "torchscript",
    "inputs": [{"name": "input", "dtype": "float32", "shape": [16]}],
    "outputs": [{"name": "scores", "dtype": "float32", "shape": [4]}],
    "slo": SLO,
}


def _upload(endpoint: str, bucket: str, tmp: Path) -> str:
    """``models/ranker`` (versions 1 and 2, the manifest serving 2) and ``models/mlp``
    (version 1) in ``bucket``; the repository's location."""
    s3 = boto3.client("s3", region_name=REGION, endpoint_url=endpoint)
    s3.create_bucket(Bucket=bucket)
    onnx = two_io_onnx(tmp / "ranker.onnx").read_bytes()
    files = {
        "models/ranker/model.yaml": yaml.safe_dump(RANKER).encode(),
        "models/ranker/profile.json": json.dumps(PROFILE).encode(),
        "models/ranker/1/model.onnx": b"version 1 is not loaded",
        "models/ranker/2/model.onnx": onnx,
        "models/mlp/model.yaml": yaml.safe_dump(MLP).encode(),
        "models/mlp/1/model.pt": mlp_torchscript(tmp / "mlp.pt").read_bytes(),
    }
    for key, body in files.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    return f"s3://{bucket}/models"


async def _post(run: Running, model: str, body: dict[str, Any]) -> tuple[Any, str]:
    headers = {"Authorization": f"Bearer {run.api_key}"}
    async with (
        aiohttp.ClientSession(headers=headers) as s,
        s.post(f"{run.url}/v1/models/{model}:predict", json=body) as r,
    ):
        assert r.status == 200, await r.text()
        return await r.json(), r.headers.get("X-Mark-Served-By", "")


async def _both_answer(run: Running) -> None:
    rng = np.random.default_rng(4)
    tokens = rng.random((2, 3, 8), dtype=np.float32)
    scale = rng.random((2, 1), dtype=np.float32)
    cols = {"inputs": {"tokens": tokens.tolist(), "scale": scale.tolist()}}
    got, _ = await _post(run, "ranker", cols)
    want = two_io_reference(tokens, scale)
    for name in ("pooled", "norm"):
        np.testing.assert_allclose(got["outputs"][name], want[name], rtol=1e-5, atol=1e-6)
    x = rng.random((3, 16), dtype=np.float32)
    got, _ = await _post(run, "mlp", {"instances": x.tolist()})
    with torch.inference_mode():
        expected = mlp_module()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got["predictions"], expected, rtol=1e-5, atol=1e-6)


@dataclass
class Cloud:
    """moto EC2 and S3 with the repository uploaded, the Lambda and EC2 stand-ins, and the
    settings of a daemon in the aws world on them."""

    endpoint: str
    bucket: str
    repository: str
    settings: Settings
    disks: Path


@pytest.fixture
async def cloud(
    aws_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Cloud]:
    before = frozenset(live_children(os.getpid()))
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", aws_env)  # the controller's and agents' boto3
    name = f"repo-{uuid.uuid4().hex[:8]}"
    repository = _upload(aws_env, name, tmp_path)
    outputs = await _stack(aws_env, name)
    (tmp_path / "lambda-tmp").mkdir()
    local = LocalLambda(
        max_concurrency=2,
        memory_mb=1024,
        env={
            "AWS_ENDPOINT_URL_S3": aws_env,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "TMPDIR": str(tmp_path / "lambda-tmp"),
        },
    )
    await local.start()
    lam = LambdaApi(FUNCTION, local)
    await lam.start()
    port = _free_port()
    disks = tmp_path / "disks"
    host = Ec2Host(
        REGION,
        aws_env,
        outputs["WorkerLaunchTemplateId"],
        port,
        {},
        repository=repository,
        data_dir=disks,
    )
    await host.start()
    settings = load_settings(
        overrides={
            "world": "aws",
            "data_dir": str(tmp_path / "controller"),
            "repository": repository,
            "repository_poll_s": 0,  # the tests say when to read it again
            "api": {"port": 0},
            "aws": {
                "endpoint_url": aws_env,
                "cluster": name,
                "launch_template_id": outputs["WorkerLaunchTemplateId"],
                "subnet_ids": [outputs["SubnetId"]],
                "agent_port": port,
                "spill_function": FUNCTION,
                "lambda_endpoint_url": lam.url,
                "spill_memory_mb": 1024,
                "boot_s": 2,
                "metrics": False,
            },
            "offerings": {"types": ["c5.large"], "markets": ["on-demand"], "standby_types": []},
            "timings": {"update_period_s": 5, "cooldown_s": 600},
            "planner": {"explore_unprofiled": {"max_concurrent": 0}},
            "predictor": {"model": "last"},
        }
    )
    try:
        yield Cloud(aws_env, name, repository, settings, disks)
    finally:
        await host.close()
        await lam.close()
        await local.close()
    assert left_behind(os.getpid(), before) == []


@pytest.mark.slow
async def test_two_models_of_an_s3_repository_each_fetch_their_own_artifact(
    cloud: Cloud,
) -> None:
    settings, aws_env, disks = cloud.settings, cloud.endpoint, cloud.disks
    assert [(m.name, m.version) for m in settings.models] == [("mlp", "1"), ("ranker", "2")]
    run = await start(settings)
    try:
        await _both_answer(run)  # no instance yet: the spill function fetched both models
        fleet = run.world.fleet
        assert fleet is not None
        versions = {"ranker": "2", "mlp": "1"}
        launched = {
            m: (await fleet.launch(LaunchRequest(m, "c5.large", Market.ON_DEMAND, version=v)))[0]
            for m, v in versions.items()
        }
        deadline = time.monotonic() + 120
        for model, inst in launched.items():
            dispatcher = run.models[model].dispatcher
            assert dispatcher is not None
            while inst.instance_id not in dispatcher.backends:
                assert time.monotonic() < deadline, f"{model}'s instance never served"
                await asyncio.sleep(0.5)
        ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=aws_env)
        for model, inst in launched.items():
            (res,) = ec2.describe_instances(InstanceIds=[inst.instance_id])["Reservations"]
            tags = {t["Key"]: t["Value"] for t in res["Instances"][0]["Tags"]}
            assert tags[TAG_VERSION] == versions[model]
        # Each instance's disk holds its own model's manifest and served version, only.
        ranker_disk = disks / launched["ranker"].instance_id / "models"
        mlp_disk = disks / launched["mlp"].instance_id / "models"
        assert sorted(p.relative_to(ranker_disk).as_posix() for p in ranker_disk.rglob("*.*")) == [
            "ranker/2/model.onnx",
            "ranker/model.yaml",
            "ranker/profile.json",
        ]
        assert sorted(p.relative_to(mlp_disk).as_posix() for p in mlp_disk.rglob("*.*")) == [
            "mlp/1/model.pt",
            "mlp/model.yaml",
        ]
        await _both_answer(run)
        served = run.models["ranker"].telemetry
        assert served is not None and served.counts["served"] >= 2
    finally:
        await stop(run)


def _put(cloud: Cloud, key: str, body: bytes) -> None:
    s3 = boto3.client("s3", region_name=REGION, endpoint_url=cloud.endpoint)
    s3.put_object(Bucket=cloud.bucket, Key=f"models/{key}", Body=body)


def _serving_versions(listed: list[InstanceInfo], model: str) -> set[str | None]:
    return {
        i.version
        for i in listed
        if i.model == model and i.role is InstanceRole.SERVING and i.state in LIVE
    }


@pytest.mark.slow
async def test_a_new_version_rolls_under_load_losing_nothing_and_a_broken_one_is_refused(
    cloud: Cloud,
) -> None:
    """Version 2 serves on an instance the plan bought; version 3 is uploaded and the
    repository read again: version 3's instance comes up and passes readiness, version 2's
    drains and goes, and no request of the load running all along is lost or answered
    twice. Then a version 4 that does not load is refused, and version 3 serves on."""
    settings = cloud.settings
    store = await open_store(settings.db_url, upgrade=True)
    now = time.time()  # an hour of 4 r/s: the first plan buys ranker an instance
    await store.add_arrivals(
        [ArrivalWindow("ranker", now - 3600 + 5 * k, 5.0, 20) for k in range(720)]
    )
    await store.close()
    run = await start(settings)
    try:
        fleet, ranker = run.world.fleet, run.models["ranker"]
        assert fleet is not None and ranker.dispatcher is not None and ranker.telemetry is not None
        dispatcher, tel = ranker.dispatcher, ranker.telemetry

        async def serves(version: str) -> bool:
            listed = await fleet.list()
            mine = {i.instance_id for i in listed if i.model == "ranker" and i.version == version}
            return bool(mine & set(dispatcher.backends))

        await _until("version 2's instance serves", lambda: serves("2"), within=90)
        statuses: list[int] = []
        stopping = asyncio.Event()

        async def load() -> None:
            headers = {"Authorization": f"Bearer {run.api_key}"}
            x = {"inputs": {"tokens": [[[0.5] * 8] * 3], "scale": [[2.0]]}}
            async with aiohttp.ClientSession(headers=headers) as s:
                while not stopping.is_set():
                    async with s.post(f"{run.url}/v1/models/ranker:predict", json=x) as r:
                        statuses.append(r.status)
                        if r.status == 200:
                            assert (await r.json())["outputs"]["pooled"] == [[1.0] * 8]
                    await asyncio.sleep(0.05)

        loader = asyncio.create_task(load())
        onnx = two_io_onnx(Path(settings.data_dir) / "v3.onnx").read_bytes()
        _put(cloud, "ranker/3/model.onnx", onnx)
        _put(cloud, "ranker/model.yaml", yaml.safe_dump({**RANKER, "version": 3}).encode())
        run.reload_now.set()

        async def only_version_3() -> bool:
            return _serving_versions(await fleet.list(), "ranker") == {"3"} and await serves("3")

        await _until("version 2 is rolled out", only_version_3, within=120)
        await asyncio.sleep(1.0)
        stopping.set()
        await loader
        sent = len(statuses)
        assert sent > 20 and statuses == [200] * sent  # lost: 0
        assert sum(tel.counts.values()) == sent  # every request's one row ended once

        async def done() -> bool:
            decisions = await run.store.decisions(0, 1e12)
            return any(d.model == "ranker" and d.action == "rollout-done" for d in decisions)

        await _until("the roll is over", done, within=30)
        actions = [d.action for d in await run.store.decisions(0, 1e12) if d.model == "ranker"]
        assert (
            actions.index("rollout-start")
            < actions.index("rollout")
            < actions.index("rollout-done")
        )
        assert run.models["ranker"].spec.version == "3"

        _put(cloud, "ranker/4/model.onnx", b"not an ONNX model")
        _put(cloud, "ranker/model.yaml", yaml.safe_dump({**RANKER, "version": 4}).encode())
        run.reload_now.set()

        async def refused() -> bool:
            decisions = await run.store.decisions(0, 1e12)
            return any(d.action == "version-refused" for d in decisions)

        await _until("version 4 is refused", refused, within=60)
        assert run.models["ranker"].spec.version == "3"
        assert _serving_versions(await fleet.list(), "ranker") == {"3"}
    finally:
        await stop(run)
