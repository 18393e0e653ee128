"""The agent over real HTTP with a real TorchScript model, and only for the frontend."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import torch
from aiohttp.test_utils import TestClient, TestServer

from bouncer.agent import Agent
from bouncer.agent_token import TOKEN_ENV, TOKEN_HEADER, daemon_token, token_headers, token_matches
from bouncer.contract import legacy_contract
from bouncer.latency import BatchLatency
from bouncer.runner import ModelLoadError
from mark.cloud.local.agents import AgentModel, _read_port, spawn_agent, stop_agent
from mark.demo import save_torchscript
from tests.runners import source_runner


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
    runner = source_runner(str(model_path))
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
        expected = runner.run(x[[0, 2]])
        assert np.allclose(tail["outputs"], expected, atol=1e-6)
        health = await (await client.get("/health")).json()
        assert (health["served"], health["rejected"], health["queue_depth"]) == (2, 1, 0)


async def test_bad_batches_are_400_and_the_agent_keeps_serving(model_path: Path) -> None:
    agent = Agent(
        runner=source_runner(str(model_path)), latency=BatchLatency.from_mapping({1: 0.01})
    )
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
    lat = source_runner(str(model_path), (2, 3)).profile(sizes=(1, 8), runs=3)
    assert all(t > 0 for _, t in lat.points)


def test_bad_sources_say_why(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a model")
    for source, says in (
        (str(junk), "junk.pt"),
        ("nowhere", "nowhere"),
        ("no_such_pkg.mod:f", "no_such_pkg"),
        ("builtins:dict", "builtins:dict"),
        ("json:dumps", "json:dumps"),
    ):
        with pytest.raises(ModelLoadError, match=says):
            source_runner(source)


class _FakeTime:
    """A clock the fake runner advances by how long each batch really took."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


class _Runner:
    contract = legacy_contract("m", "m.pt", (2,), "float32")

    def __init__(self, clock: _FakeTime, takes: list[float]) -> None:
        self.clock, self.takes = clock, takes

    def run(self, inputs: dict[str, Any]) -> dict[str, Any]:
        self.clock.t += self.takes.pop(0)
        return {"output": inputs["input"]}


def test_slowdown_sleeps_to_the_profiled_time_not_a_multiple_of_the_measured_one() -> None:
    clock = _FakeTime()
    runner = _Runner(clock, [0.02, 0.05])
    agent = Agent(
        runner=runner,  # type: ignore[arg-type]
        latency=BatchLatency.from_mapping({1: 0.01}),
        slowdown=3.0,
        clock=clock,
        timer=clock,
        pause=clock.sleep,
    )
    one = np.zeros((1, 2), dtype=np.float32)
    agent._run_timed(one)  # a hiccup: 20 ms of real work where the profile says 10
    assert clock.slept == [pytest.approx(0.01)]  # T_1 x 3 = 30 ms in all, not 20 x 3
    agent._run_timed(one)  # real work beyond the emulated time: nothing added
    assert len(clock.slept) == 1


def test_a_batch_that_overruns_its_profile_pushes_back_the_queue_behind_it() -> None:
    clock = _FakeTime()
    agent = Agent(
        runner=_Runner(clock, []),  # type: ignore[arg-type]
        latency=BatchLatency.from_mapping({1: 0.1}),
        clock=clock,
    )
    first = agent.offer([1010.0])
    second = agent.offer([1010.0])  # queued behind the first
    assert [first.finish, second.finish] == pytest.approx([1000.1, 1000.2])
    clock.t = 1000.5  # the first batch ran 0.5 s instead of 0.1 s
    agent.done(first)
    assert agent.busy_until == pytest.approx(1000.6)  # the second still needs its 0.1 s
    late = agent.offer([1000.65])  # would fit the profile's schedule (1000.3), not the real one
    assert late.rejected == (0,)
    agent.done(second)
    assert (agent.queue_depth, agent.busy_until) == (0, clock.t)


def test_an_agent_given_a_profile_emulates_it_instead_of_profiling_itself(
    model_path: Path,
) -> None:
    from bouncer.agent import build_agent

    given = BatchLatency.from_mapping({1: 0.004, 8: 0.0155})
    assert BatchLatency.parse(str(given)) == given  # the --latency argument round-trips
    contract = legacy_contract("m", str(model_path), (2, 3), "float32")
    agent = build_agent(contract, 5.0, BatchLatency.parse(str(given)))
    assert agent.latency == given and agent.expected_latency(1) == pytest.approx(0.02)
    with pytest.raises(ValueError, match="b:seconds"):
        BatchLatency.parse("1=0.004")


# -- only the frontend: the agent token ------------------------------------------------------


async def test_every_route_needs_the_token(model_path: Path) -> None:
    agent = Agent(
        runner=source_runner(str(model_path)),
        latency=BatchLatency.from_mapping({1: 0.01}),
        example=np.zeros((2, 3), dtype=np.float32),
        token="s3cret",
    )
    batch = {"instances": [[[0.0] * 3] * 2], "deadlines": [time.time() + 5]}
    async with TestClient(TestServer(agent.app())) as client:
        for headers in ({}, {TOKEN_HEADER: "wrong"}, {TOKEN_HEADER: "s3cre"}):
            for method, path in (("POST", "/v1/batch"), ("GET", "/health"), ("GET", "/live")):
                r = await client.request(method, path, json=batch, headers=headers)
                assert r.status == 401, (path, headers)
                assert TOKEN_HEADER in (await r.json())["error"]
        assert agent.stats.batches == 0 and agent.queue_depth == 0  # nothing ran
        right = {TOKEN_HEADER: "s3cret"}
        head, tail = await _lines(await client.post("/v1/batch", json=batch, headers=right))
        assert head["admitted"] == [0] and len(tail["outputs"]) == 1
        assert (await client.get("/health", headers=right)).status == 200
        assert (await client.get("/live", headers=right)).status == 200


ROOT = Path(__file__).resolve().parents[2]
TINY = ("tests.lambda_rt.fixtures_model:tiny_mlp", "4")


def _proc(pid: int, what: str) -> list[bytes]:
    """A process's ``/proc`` list (``cmdline``: what ``ps`` shows; ``environ``)."""
    return Path(f"/proc/{pid}/{what}").read_bytes().split(b"\0")


async def test_a_spawned_agent_gets_the_token_in_its_environment_not_its_arguments() -> None:
    """The local world's way to start an agent: others on the machine get 401, and ``ps``
    does not show the token."""
    model = AgentModel(legacy_contract("m", TINY[0], (4,), "float32"))
    proc = await spawn_agent(model, "--latency", "1:0.001", announce=True, cwd=str(ROOT))
    try:
        port = await asyncio.wait_for(_read_port(proc), 60)
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{url}/health") as r:
                assert r.status == 401
            async with s.get(f"{url}/health", headers=token_headers()) as r:
                assert r.status == 200 and (await r.json())["ready"]
        argv = _proc(proc.pid, "cmdline")
        assert daemon_token().encode() not in b" ".join(argv)
        environ = _proc(proc.pid, "environ")
        assert f"{TOKEN_ENV}={daemon_token()}".encode() in environ
    finally:
        await stop_agent(proc)


def test_the_agent_refuses_to_start_without_a_token() -> None:
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    out = subprocess.run(
        [sys.executable, "-m", "bouncer.agent", "--model-source", TINY[0], "--input-shape", "4"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert f"{TOKEN_ENV} is not set" in out.stderr


def test_daemon_token_is_the_environment_s_else_one_random_per_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    made = daemon_token()
    assert len(made) >= 40 and daemon_token() == made
    monkeypatch.setenv(TOKEN_ENV, "from-the-stack")
    assert token_headers() == {TOKEN_HEADER: "from-the-stack"}
    assert token_matches("from-the-stack", "from-the-stack")
    assert not token_matches(None, "x") and not token_matches("", "x")


# -- liveness probes from several frontends --------------------------------------------------


class _HeldAgent(Agent):
    """An agent whose probe inference waits for the test to release it, and counts runs."""

    def __init__(self, model_path: Path, timeout_s: float) -> None:
        super().__init__(
            runner=source_runner(str(model_path)),
            latency=BatchLatency.from_mapping({1: 0.01}),
            example=np.zeros((2, 3), dtype=np.float32),
            probe_timeout_s=timeout_s,
        )
        self.release = threading.Event()
        self.started = threading.Event()
        self.runs = 0

    def infer(self, batch: Any, variant: str | None = None) -> Any:
        self.runs += 1
        self.started.set()
        self.release.wait(30)
        return super().infer(batch, variant)


async def test_a_probe_during_another_shares_its_inference(model_path: Path) -> None:
    """Two frontends probe at once: the second waits for the first's inference (one run)
    instead of being told the model is stuck; both hear it is live."""
    agent = _HeldAgent(model_path, timeout_s=20.0)
    async with TestClient(TestServer(agent.app())) as client:
        first = asyncio.create_task(client.get("/live"))
        assert await asyncio.to_thread(agent.started.wait, 10)  # its inference is in flight
        second = asyncio.create_task(client.get("/live"))
        await asyncio.sleep(0.2)
        assert not second.done()  # it waits for the one in flight
        agent.release.set()
        answers = [await first, await second]
        assert [a.status for a in answers] == [200, 200]
        assert agent.runs == 1
        assert (await client.get("/live")).status == 200  # the next probe runs anew
        assert agent.runs == 2


async def test_a_stuck_inference_fails_every_probe_by_its_own_deadline(model_path: Path) -> None:
    """The shared inference is held past the timeout: the probes that wait on it fail at
    its deadline, and one that comes later fails at once."""
    agent = _HeldAgent(model_path, timeout_s=0.5)
    async with TestClient(TestServer(agent.app())) as client:
        first = asyncio.create_task(client.get("/live"))
        assert await asyncio.to_thread(agent.started.wait, 10)
        second = await client.get("/live")
        assert second.status == 503 and "stuck" in (await second.json())["reason"]
        assert (await first).status == 503
        t = time.perf_counter()
        late = await client.get("/live")
        assert late.status == 503 and time.perf_counter() - t < 0.4  # no new wait
        assert agent.runs == 1  # no second inference queued behind the stuck one
        agent.release.set()
