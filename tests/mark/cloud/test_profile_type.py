"""`mark profile --type T` in the aws world, run as a user runs it, against a moto server.

The test plays the stack (a VPC whose subnet is carved from 127.0.0.0/8, the
worker launch template) and, where an instance should boot, EC2's hypervisor:
``Ec2Host`` starts a real agent at each running instance's private address.
Every run must leave no instance running: measured, timed out, or interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from aiobotocore.session import get_session

from bouncer.agent_token import TOKEN_ENV, daemon_token
from bouncer.contract import legacy_contract
from mark.cloud.local.agents import AgentModel
from mark.cloud.standins.ec2_host import Ec2Host
from mark.demo import save_torchscript
from mark.state import open_store

REGION = "us-east-1"
MODEL = "tiny"
# The CLI as a terminal starts it: Ctrl-C's default handler in place. A test run started in
# the background of a script (`pytest ... &`, as CI harnesses do) has SIGINT ignored, every
# child inherits that, and Python then leaves Ctrl-C ignored, as it should for a command a
# user backgrounded; here it would make the Ctrl-C test measure the caller's shell.
MARK = [
    sys.executable,
    "-c",
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'mark'; from mark.cli.main import main; main()",
]
ROOT = Path(__file__).resolve().parents[3]


@dataclass
class Stack:
    endpoint: str
    cluster: str
    template_id: str
    port: int
    config: Path
    source: str
    db_url: str


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def stack(aws_env: str, ami: str, cluster: str, tmp_path: Path) -> AsyncIterator[Stack]:
    """What the CloudFormation stack creates (VPC, subnet, worker template) and a config."""
    async with get_session().create_client("ec2", region_name=REGION, endpoint_url=aws_env) as ec2:
        octet = 16 + uuid.uuid4().int % 200
        vpc = (await ec2.create_vpc(CidrBlock=f"127.{octet}.0.0/16"))["Vpc"]["VpcId"]
        subnet = (await ec2.create_subnet(VpcId=vpc, CidrBlock=f"127.{octet}.0.0/24"))["Subnet"]
        template = await ec2.create_launch_template(
            LaunchTemplateName=f"{cluster}-worker", LaunchTemplateData={"ImageId": ami}
        )
    source = save_torchscript(torch.nn.Linear(4, 2), tmp_path / "tiny.pt")
    port = _free_port()
    template_id = template["LaunchTemplate"]["LaunchTemplateId"]
    config = tmp_path / "mark.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "world": "aws",
                "data_dir": str(tmp_path / "data"),
                "aws": {
                    "endpoint_url": aws_env,
                    "cluster": cluster,
                    "launch_template_id": template_id,
                    "subnet_ids": [subnet["SubnetId"]],
                    "agent_port": port,
                    "boot_s": 2,
                    "refresh_prices": False,
                    "metrics": False,
                },
                "models": [
                    {
                        "name": MODEL,
                        "source": str(source),
                        "input": {"shape": [4]},
                        "slo": {"rt_max_ms": 200, "sl_min": 0.98},
                    }
                ],
                "offerings": {
                    "types": ["c5.large", "m5.large", "inf1.xlarge"],
                    "markets": ["on-demand"],
                },
            }
        )
    )
    yield Stack(
        aws_env,
        cluster,
        template_id,
        port,
        config,
        str(source),
        f"sqlite+aiosqlite:///{tmp_path / 'data' / 'mark.db'}",
    )


async def _mark(*args: str, within: float = 180.0) -> tuple[int, str, str]:
    proc = await _start(*args)
    out, err = await asyncio.wait_for(proc.communicate(), within)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def _stderr_within(proc: asyncio.subprocess.Process, seconds: float) -> str:
    """Its stderr once it exits; if it has not within ``seconds``, every thread's stack
    (faulthandler, on SIGABRT) in the failure, and the process is gone either way."""
    try:
        _, err = await asyncio.wait_for(proc.communicate(), seconds)
    except TimeoutError:
        proc.send_signal(signal.SIGABRT)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
        pytest.fail(f"still running {seconds:g} s after SIGINT:\n{err.decode()}")
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return err.decode()


async def _start(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *MARK,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=str(ROOT),
        # The stack gives the controller and its workers one agent token; here the
        # workers (Ec2Host's agents) are this process's, so the CLI gets its token.
        env={**os.environ, "COLUMNS": "200", TOKEN_ENV: daemon_token(), "PYTHONFAULTHANDLER": "1"},
    )


async def _instances(stack: Stack) -> list[dict[str, Any]]:
    """Every instance carrying this cluster's tag, in any state."""
    async with get_session().create_client(
        "ec2", region_name=REGION, endpoint_url=stack.endpoint
    ) as ec2:
        resp = await ec2.describe_instances(
            Filters=[{"Name": "tag:mark:cluster", "Values": [stack.cluster]}]
        )
    return [i for r in resp["Reservations"] for i in r["Instances"]]


async def _assert_nothing_runs(stack: Stack) -> list[dict[str, Any]]:
    launched = await _instances(stack)
    assert len(launched) == 1, launched  # one instance was launched, and only one
    (inst,) = launched
    assert inst["State"]["Name"] in ("shutting-down", "terminated")
    tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
    assert tags["mark:role"] == "profiling" and tags["mark:model"] == MODEL
    return launched


async def test_profile_type_measures_on_a_launched_instance_and_terminates_it(
    stack: Stack,
) -> None:
    host = Ec2Host(
        REGION,
        stack.endpoint,
        stack.template_id,
        stack.port,
        {MODEL: AgentModel(legacy_contract(MODEL, stack.source, (4,), "float32"))},
    )
    await host.start(every_s=0.3)
    try:
        code, out, err = await _mark(
            "-c", str(stack.config), "profile", "--type", "c5.large", "--timeout", "120"
        )
    finally:
        await host.close()
    assert code == 0, err
    assert "tiny on c5.large" in out and "T_b ms" in out
    assert "batching: N_batch" in out
    assert "stored as the measured profile of tiny on c5.large" in out
    (inst,) = await _assert_nothing_runs(stack)
    store = await open_store(stack.db_url)
    try:
        (profile,) = await store.profiles(MODEL)
        assert (profile.instance_type, profile.source) == ("c5.large", "measured")
        assert len(profile.batch_latency_s) >= 4
        assert all(t > 0 for _, t in profile.batch_latency_s)
        (rec,) = await store.instances(model=MODEL)
        assert (rec.instance_id, rec.role, rec.state) == (
            inst["InstanceId"],
            "profiling",
            "terminated",
        )
        (charge,) = await store.ledger()
        assert charge.instance_id == inst["InstanceId"] and charge.cost > 0
        decisions = [d for d in await store.decisions(0, 1e12) if d.action == "profile"]
        assert [d.instance_type for d in decisions] == ["c5.large"]
    finally:
        await store.close()


async def test_profile_type_times_out_with_a_clear_error_and_terminates(stack: Stack) -> None:
    # No hypervisor stand-in: the instance "runs" but its agent never answers.
    started = time.monotonic()
    code, _, err = await _mark(
        "-c", str(stack.config), "profile", "--type", "m5.large", "--timeout", "3"
    )
    assert code != 0 and time.monotonic() - started < 90
    assert "did not report ready within 3 s" in err and "terminated" in err
    assert "Traceback" not in err
    await _assert_nothing_runs(stack)
    store = await open_store(stack.db_url)
    try:
        assert await store.profiles(MODEL) == []
        assert len(await store.ledger()) == 1  # its run is paid for, and recorded
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("sig", "code"),
    [(signal.SIGINT, 130), (signal.SIGTERM, 128 + signal.SIGTERM)],
    ids=["ctrl-c", "sigterm"],
)
async def test_profile_type_interrupted_terminates_the_instance(
    stack: Stack, sig: signal.Signals, code: int
) -> None:
    """Ctrl-C, or SIGTERM (``kill``, a CI job's timeout), while the agent loads: the
    instance it launched is terminated before the command ends, never left billing."""
    proc = await _start("-c", str(stack.config), "profile", "--type", "c5.large")
    deadline = time.monotonic() + 60
    while not await _instances(stack):
        assert time.monotonic() < deadline, "no instance was launched"
        assert proc.returncode is None
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)  # waiting for its agent now
    proc.send_signal(sig)
    err = await _stderr_within(proc, 60)
    assert proc.returncode == code, err
    assert "Traceback" not in err
    await _assert_nothing_runs(stack)


async def test_profile_type_refuses_what_it_cannot_measure(stack: Stack, tmp_path: Path) -> None:
    cfg = str(stack.config)
    cases = [
        (("profile", "--type", "c5.huge"), "unknown instance type 'c5.huge'"),
        (("profile", "--type", "c5.9xlarge"), "c5.9xlarge is not offered to the planner"),
        (("profile", "--type", "inf1.xlarge"), "Inferentia needs a compiled Neuron artifact"),
        (("profile", "--type", "c5.large", "--runs", "3"), "--runs times this machine"),
        (("--set", "world=local", "profile", "--type", "c5.large"), "needs world: aws"),
        (("profile", "--timeout", "5"), "--timeout applies to --type"),
    ]
    for args, message in cases:
        code, _, err = await _mark("-c", cfg, *args, within=60)
        assert code == 2 and message in " ".join(err.split()), (args, err)
    assert await _instances(stack) == []  # nothing was launched


async def test_a_swallowed_ctrl_c_still_ends_the_wait() -> None:
    """A library that answers a cancellation with its own TimeoutError (an HTTP client's
    timeout racing Ctrl-C) leaves the cancellation requested: the poll honours it."""
    from mark.cli.profile_type import _raise_if_cancelled

    polled = 0

    async def poll() -> None:
        nonlocal polled
        for _ in range(100):  # ends on its own (not cancelled) if the guard fails
            _raise_if_cancelled(asyncio.current_task())
            polled += 1
            with contextlib.suppress(asyncio.CancelledError):  # as such a library does
                await asyncio.sleep(0.05)

    task = asyncio.create_task(poll())
    await asyncio.sleep(0.12)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=15)
    assert task in done and task.cancelled()
    assert polled >= 2
