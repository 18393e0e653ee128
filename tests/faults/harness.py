"""The fault-injection harness: a daemon in the local world, a seeded open-loop load from
another process, one fault at a time into the run, and what became of every request.

``run_scenario`` starts a daemon (``mark.daemon.start``) with the scenario's
settings, starts ``tests.faults.client`` as a subprocess with an admin key (so
each answer says who served it), runs the scenario's ``Fault`` coroutine
``fault_at_s`` after the client's first arrival was due, waits for the client,
stops the daemon (``mark.daemon.stop``) and counts. Every scenario's settings
pin the speed of each instance type (``local.reference_profile`` × the
``local.slowdown`` per type), so capacities, and so fleet sizes, do not depend
on how fast or how busy this machine is.

What is counted (``Tally``), over the requests the client planned:

- **sent**: requests the client sent (its planned Poisson arrivals);
- **EC2**, **Lambda**: answered 200 by an instance / by the spill function
  (``X-Mark-Served-By``);
- **errors**: explicit errors, an HTTP status other than 200; each must carry
  the daemon's reason (``{"error": ...}``), and ``unexplained`` counts those
  that do not;
- **lost**: no HTTP answer at all (the client timed out or the connection
  dropped) or no outcome for a planned request id. The client's timeout is the
  dispatcher's own backstop (``give_up_after_s``) plus ``CLIENT_SLACK_S``, so a
  request the daemon answers within its bound is never counted lost;
- **twice**: client ids answered more than once, plus successful Lambda
  invocations beyond the requests Lambda answered (the local Lambda's metering,
  from after its warm-up: each invocation carries at least one request, so more
  successful invocations than requests answered from them means a request was
  run there twice; a failed invocation's requests may be retried, by design);
- **wrong** (asserted, not tabled): answered 200 with another request's id or
  with an output not that input's (checked against the model run here);
- **orphans**, checked after ``stop``: (a) instances that moto, whose state
  outlives its server in this process, holds as ``pending`` or ``running``
  with this cluster's ``mark:cluster`` tag while the daemon's store (reopened)
  records them as anything but live (``pending``, ``running``, ``ready``,
  ``draining``) or not at all, that is instances left running that no model,
  plan or pool of the daemon claims (the local world does not terminate its
  fleet on stop, by design: a restart adopts it; those it records as live are
  claimed); plus (b) agent or Lambda runtime processes the scenario started still
  alive after ``stop`` (a local instance is its agent process; ``tests/processes.py``);
- **within RT_max**: answered 200 within the model's RT_max, as a share of sent
  (reported, not asserted).

``record`` keeps each scenario's tally for its test's report (``tests/faults/conftest.py``);
``tests/faults/session_table.py`` prints them as one table at the end of the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from aiobotocore.awsrequest import AioAWSResponse
from aiobotocore.session import get_session

from bouncer.miss_budget import DECLINED_MARK
from mark.catalog import Market
from mark.cloud.aws.instances import TAG_CLUSTER
from mark.cloud.aws.interruptions import INTERRUPTION_WARNING, WARNING_LEAD_S
from mark.cloud.local.agents import AgentSupervisor
from mark.cloud.local.lambda_ import LocalLambda
from mark.cloud.local.world import LocalWorld
from mark.config import Settings, load_settings
from mark.daemon import Running, drain_bound, serve, start, stop
from mark.demo import ensure_demo_model
from mark.ports import InstanceInfo, InstanceRole, InstanceState
from mark.serve.dispatcher import Dispatcher
from mark.state import open_store
from mark.state.records import Decision
from tests.e2e.test_local_world import admin_key
from tests.processes import left_behind, live_children
from tests.runners import source_runner

ROOT = Path(__file__).resolve().parents[2]
MODEL = "digits"
RT_MAX_MS = 1000.0
# T_b every agent emulates (the parity test's reference), times the slowdown of its type.
REFERENCE = ",".join(f"{b}:{(10.0 + 2.5 * b) / 1000.0:.4f}" for b in (1, 2, 4, 8, 16, 32))
C5_LARGE_SLOWDOWN = 16.0
"""T_b = 160 ms + 40 ms · b on a c5.large: about 9 r/s within RT_max = 1 s (the planner's
capacity), so a few r/s need one instance and 40 r/s a fleet of five."""
CLIENT_SLACK_S = 15.0
LIVE_STATES = frozenset({"pending", "running", "ready", "draining"})
"""What the store may say of an instance running in moto for the daemon to claim it."""


def scenario_settings(data_dir: Path, overrides: Mapping[str, Any] | None = None) -> Settings:
    """The local world for a fault scenario: fast control loop (P_u = 5 s), no boot delay,
    two Lambda runtimes, fixed speeds per type, RT_max 1 s; ``overrides`` per section."""
    base: dict[str, Any] = {
        "data_dir": str(data_dir),
        "api": {"port": 0},
        "offerings": {"types": ["c5.large"], "standby_types": []},
        "timings": {
            "update_period_s": 5,
            "lead_time_s": 5,
            "cooldown_s": 120,
            "boot_deadline_s": 30,
            "unhealthy_after_s": 3,
        },
        "predictor": {"model": "last"},
        "local": {
            "boot_delay_s": 0,
            "lambda_concurrency": 2,
            "reference_profile": {MODEL: REFERENCE},
            "slowdown": {"c5.large": C5_LARGE_SLOWDOWN},
        },
    }
    merged = _merge(base, dict(overrides or {}))
    model = merged.pop("model", {})
    settings = load_settings(overrides=merged)
    spec = settings.models[0]
    slo = spec.slo.model_copy(update={"rt_max_ms": RT_MAX_MS})
    spec = spec.model_copy(update={"slo": slo, **model})
    return settings.model_copy(update={"models": (spec,)})


def _merge(a: dict[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


# -- the run as a fault sees it ---------------------------------------------------------


@dataclass
class Live:
    """The running daemon and the load's clock, for a fault to act on."""

    run: Running
    started: float  # the event loop's time when the client's first arrival was due
    injected_at: float | None = None  # seconds into the load when the fault struck

    def elapsed(self) -> float:
        return asyncio.get_running_loop().time() - self.started

    def strike(self) -> float:
        """Note that the fault strikes now; seconds into the load."""
        self.injected_at = self.elapsed()
        return self.injected_at

    @property
    def world(self) -> LocalWorld:
        assert isinstance(self.run.world, LocalWorld)
        return self.run.world

    @property
    def dispatcher(self) -> Dispatcher:
        dispatcher = self.run.models[MODEL].dispatcher
        assert dispatcher is not None
        return dispatcher

    @property
    def agents(self) -> AgentSupervisor:
        assert self.world.agents is not None
        return self.world.agents

    async def fleet(self) -> list[InstanceInfo]:
        assert self.world.fleet is not None
        return await self.world.fleet.list()

    async def until(self, what: str, within_s: float, ready: Callable[[], Awaitable[bool]]) -> None:
        """Wait until ``ready()``; fail the scenario after ``within_s``."""
        deadline = time.monotonic() + within_s
        while not await ready():
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {within_s:g} s")
            await asyncio.sleep(0.5)

    async def serving(self, within_s: float = 60.0, exclude: Iterable[str] = ()) -> list[str]:
        """The instances the dispatcher sends batches to, once there is one (not excluded)."""
        skip = set(exclude)

        async def some() -> bool:
            return any(b not in skip for b in self.dispatcher.backends)

        await self.until("no instance served", within_s, some)
        return sorted(b for b in self.dispatcher.backends if b not in skip)


Fault = Callable[[Live], Awaitable[str]]
"""Injects one fault into the run; returns what it did, for the report."""


# -- what became of every request ------------------------------------------------------------


@dataclass
class Tally:
    """One scenario's row, and the evidence behind it."""

    scenario: str
    sent: int = 0
    on_ec2: int = 0
    on_lambda: int = 0
    errors: int = 0
    lost: int = 0
    cut: int = 0
    """In flight when the daemon was killed (kill -9): no answer, by definition; not lost."""
    twice: int = 0
    orphans: int = 0
    within_rt_max: float = 0.0
    unexplained: int = 0
    wrong: int = 0
    took_s: float = 0.0
    fault: str = ""
    after_fault: str = ""
    """The requests due from the fault on: where they were served, errors, within RT_max."""
    reasons: Counter[str] = field(default_factory=Counter)
    served_by: Counter[str] = field(default_factory=Counter)
    lambda_invocations: int = 0
    """Successful ones, metered; ``lambda_failed`` the failed ones."""
    lambda_failed: int = 0
    orphan_detail: list[str] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    moto_states: dict[str, str] = field(default_factory=dict)
    """Every instance of the cluster after stop, as moto holds it."""
    store_states: dict[str, str] = field(default_factory=dict)
    """Every instance the daemon recorded, in its last recorded state."""
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    """The client's outcome of each request (``tests/faults/client.py``)."""
    withheld: int = 0
    """Arrivals the client did not send: the balancer had taken the daemon out."""

    HEADER = (
        "scenario",
        "sent",
        "EC2",
        "Lambda",
        "errors",
        "lost",
        "twice",
        "orphans",
        "within RT_max",
    )

    def row(self) -> tuple[str, ...]:
        return (
            self.scenario,
            str(self.sent),
            str(self.on_ec2),
            str(self.on_lambda),
            str(self.errors),
            str(self.lost) + (f" (+{self.cut} cut)" if self.cut else ""),
            str(self.twice),
            str(self.orphans),
            f"{self.within_rt_max:.1%}",
        )

    def notes(self) -> list[str]:
        out = [f"{self.scenario}: {self.fault}; {self.took_s:.0f} s in all"]
        if self.after_fault:
            out.append(f"  from the fault on: {self.after_fault}")
        if self.reasons:
            kinds = ", ".join(f"{r} x{n}" for r, n in self.reasons.most_common(4))
            out.append(f"  errors: {kinds}")
        served = ", ".join(f"{k} {v}" for k, v in sorted(self.served_by.items()))
        out.append(
            f"  served by: {served}; Lambda invocations {self.lambda_invocations} "
            f"(+{self.lambda_failed} failed)"
        )
        states = Counter(self.moto_states.values())
        after = ", ".join(f"{s} {n}" for s, n in sorted(states.items()))
        out.append(f"  the cluster in moto after stop: {after or 'none'}")
        out += [f"  orphan: {o}" for o in self.orphan_detail]
        return out

    def check(self) -> None:
        """What every scenario must hold, whatever the fault."""
        detail = "\n".join(self.notes())
        assert self.sent > 0, detail
        assert self.lost == 0, f"{self.lost} requests lost\n{detail}"
        assert self.twice == 0, f"{self.twice} answered twice\n{detail}"
        assert self.orphans == 0, f"{self.orphans} orphans\n{detail}"
        assert self.unexplained == 0, f"{self.unexplained} errors without a reason\n{detail}"
        assert self.wrong == 0, f"{self.wrong} answered with another input's output\n{detail}"
        assert self.on_ec2 + self.on_lambda + self.errors + self.cut == self.sent, detail

    @property
    def declined(self) -> int:
        """Errors that were the SLO's miss budget declining a request (``bouncer.miss_budget``)."""
        return sum(n for r, n in self.reasons.items() if DECLINED_MARK in r)

    def actions(self, action: str) -> list[Decision]:
        return [d for d in self.decisions if d.action == action]

    EVIDENCE = frozenset({"decisions", "outcomes", "store_states"})
    """Fields ``table`` does not show, too bulky to travel on a test report."""

    def summary(self) -> dict[str, Any]:
        """What ``table`` shows, in JSON's types: it travels on the test's report, from an
        xdist worker to the controller that prints the table (``session_table.py``)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in self.EVIDENCE}
        return {
            **out,
            "reasons": dict(self.reasons),
            "served_by": dict(self.served_by),
            "orphan_detail": list(self.orphan_detail),
            "moto_states": dict(self.moto_states),
        }

    @classmethod
    def from_summary(cls, summary: Mapping[str, Any]) -> Tally:
        """The ``Tally`` a ``summary`` came from, without its evidence."""
        reasons, served_by = Counter(summary["reasons"]), Counter(summary["served_by"])
        return cls(**{**summary, "reasons": reasons, "served_by": served_by})


_recorded: list[Tally] = []
"""Tallies of this process's scenarios not yet on a test report: ``run_scenario`` is not
given the test's item, so ``tests/faults/conftest.py`` moves them there after each test."""


def record(tally: Tally) -> None:
    """Keep the scenario's row for the session's table, and print it now (seen with ``-s``)."""
    _recorded.append(tally)
    print("\n" + table([tally]))


def take_recorded() -> list[Tally]:
    """The tallies recorded since the last call, for the test's report."""
    taken = list(_recorded)
    _recorded.clear()
    return taken


def table(rows: Iterable[Tally]) -> str:
    """The rows as a Markdown table, and each scenario's notes below it."""
    rows = list(rows)
    lines = [Tally.HEADER, *(t.row() for t in rows)]
    widths = [max(len(r[i]) for r in lines) for i in range(len(Tally.HEADER))]
    out = []
    for k, r in enumerate(lines):
        cells = [
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        out.append("| " + " | ".join(cells) + " |")
        if k == 0:
            out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for t in rows:
        out += t.notes()
    return "\n".join(out)


_FAILED_PREFIX = re.compile(r"^\d+ of \d+ instances failed[^:]*:\s*")


def _reason(error: str | None) -> str:
    """An error's kind for the report: its text without the per-request counts and ids."""
    text = _FAILED_PREFIX.sub("", (error or "").strip())
    return text.split(" (", 1)[0][:80]


def count(
    scenario: str,
    client: Mapping[str, Any],
    expected: np.ndarray[Any, Any],
    rt_max_ms: float,
    lambda_invocations: int,
    lambda_failed: int = 0,
) -> Tally:
    """The client's outcomes and the Lambda's metering as a ``Tally`` (orphans not yet)."""
    outcomes: list[dict[str, Any]] = client["outcomes"]
    t = Tally(
        scenario,
        sent=int(client["planned"]),
        lambda_invocations=lambda_invocations,
        lambda_failed=lambda_failed,
    )
    per_id = Counter(o["id"] for o in outcomes)
    t.twice = sum(n - 1 for n in per_id.values())
    t.lost = t.sent - len(per_id)
    for o in outcomes:
        status = int(o["status"])
        if status == 0:
            t.lost += 1
            t.reasons[_reason(o["error"])] += 1
            continue
        if status != 200:
            t.errors += 1
            reason = (o["error"] or "").strip()
            t.unexplained += not reason
            t.reasons[f"{status} {_reason(reason)}"] += 1
            continue
        who = o["served_by"] or "?"
        t.served_by["lambda" if who == "lambda" else "instances"] += 1
        if who == "lambda":
            t.on_lambda += 1
        else:
            t.on_ec2 += 1
        out = o["output"]
        right = (
            o["echo"] == o["id"]
            and out is not None
            and np.allclose(np.asarray(out, dtype=np.float64), expected[o["body"]], atol=1e-3)
        )
        t.wrong += not right
        t.within_rt_max += float(o["latency_s"]) * 1000.0 <= rt_max_ms
    t.within_rt_max = t.within_rt_max / t.sent if t.sent else 0.0
    t.twice += max(0, lambda_invocations - t.on_lambda)
    return t


def since(outcomes: Iterable[Mapping[str, Any]], t0: float, rt_max_ms: float) -> str:
    """Where the requests due from ``t0`` s on ended, in a line."""
    due = [o for o in outcomes if float(o["due_s"]) >= t0]
    ok = [o for o in due if o["status"] == 200]
    on_lambda = sum(o["served_by"] == "lambda" for o in ok)
    within = sum(float(o["latency_s"]) * 1000.0 <= rt_max_ms for o in ok)
    n = max(len(due), 1)
    return (
        f"{len(due)} sent, EC2 {len(ok) - on_lambda}, Lambda {on_lambda}, "
        f"errors {len(due) - len(ok)}, within RT_max {within / n:.1%}"
    )


def orphans(
    moto: Mapping[str, str], store: Mapping[str, str], children: Iterable[int | str]
) -> list[str]:
    """What runs after ``stop`` that nothing claims: instances pending or running in moto
    that the store records as anything but live (or not at all), and live child processes."""
    out = []
    for iid, state in sorted(moto.items()):
        recorded = store.get(iid, "unrecorded")
        if state in ("pending", "running") and recorded not in LIVE_STATES:
            out.append(f"{iid} {state} in moto, {recorded} in the store")
    return out + [f"process {child} alive after stop" for child in children]


def moto_instances(region: str, cluster: str) -> dict[str, str]:
    """Every instance moto holds with this cluster's tag, and its state. moto's backends are
    this process's memory, so they outlive the local world's moto server."""
    from moto.ec2.models import ec2_backends

    out: dict[str, str] = {}
    for account in list(ec2_backends.keys()):
        backend = ec2_backends[account][region]
        for inst in backend.all_instances():
            tags = {t["key"]: t["value"] for t in inst.get_tags()}
            if tags.get(TAG_CLUSTER) == cluster:
                out[inst.id] = str(inst.state)
    return out


async def _expected_outputs(source: str, bodies: list[Any]) -> np.ndarray[Any, Any]:

    rows = np.asarray(bodies, dtype=np.float32)
    out: np.ndarray[Any, Any] = await asyncio.to_thread(source_runner(source).run, rows)
    return out.reshape(len(bodies), -1).astype(np.float64)


# -- a scenario, start to end -------------------------------------------------------------


async def run_scenario(
    name: str,
    settings: Settings,
    profile: str,
    *,
    seed: int,
    fault_at_s: float,
    fault: Fault,
    by_signal: bool = False,
    balancer_lag_s: float | None = None,
    before_load: Callable[[Running], Awaitable[None]] | None = None,
    check: bool = True,
) -> Tally:
    """Serve ``profile`` (``RateProfile`` text) with ``fault`` injected ``fault_at_s`` into
    it; count what became of every request (``Tally``), record the row, check it.

    ``by_signal``: the daemon runs as ``mark up`` runs it (``mark.daemon.serve``, its
    SIGTERM/SIGINT handlers installed on this loop) and is expected to stop by itself,
    on the signal the fault sends; it is stopped with ``stop`` otherwise. With
    ``balancer_lag_s`` the client sends nothing more that long after the readiness
    fails (``tests/faults/client.py``). ``before_load`` runs once the daemon is ready and
    before the client starts (e.g. to pin the fleet by hand); ``check=False`` leaves the
    checks to the caller (a benchmark prints its row instead)."""
    began = time.monotonic()
    before = frozenset(live_children(os.getpid()))  # not this scenario's (tests/processes.py)
    ensure_demo_model(settings.data_dir)
    out = settings.data_dir / "outcomes.json"
    served: asyncio.Task[None] | None = None
    if by_signal:
        run, served = await _serve(settings)
    else:
        run = await start(settings)
    world = run.world
    assert isinstance(world, LocalWorld) and isinstance(world.serverless, LocalLambda)
    cluster, region = world.cluster, world.region
    source = world.models[MODEL].source
    note, struck = "", None
    try:
        await _ready(run.url)
        if before_load is not None:
            await before_load(run)
        env = {**os.environ, "MARK_API_KEY": await admin_key(run)}
        metered = world.serverless.usage()  # after the warm-up pings
        dispatcher = run.models[MODEL].dispatcher
        assert dispatcher is not None
        timeout_s = dispatcher.give_up_after_s + CLIENT_SLACK_S
        lag = () if balancer_lag_s is None else (str(balancer_lag_s),)
        client = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "tests.faults.client", run.url, profile, str(seed)),
            *(str(timeout_s), str(out), *lag),
            cwd=ROOT,
            env=env,
            stdout=asyncio.subprocess.PIPE,
        )
        tasks: list[asyncio.Task[Any]] = []
        try:
            assert client.stdout is not None
            line = await asyncio.wait_for(client.stdout.readline(), 60)
            assert line.strip() == b"START", f"the client did not start: {line!r}"
            loop = asyncio.get_running_loop()
            live = Live(run, loop.time())

            async def inject() -> str:
                await asyncio.sleep(max(0.0, live.started + fault_at_s - loop.time()))
                return await fault(live)

            injected = asyncio.create_task(inject())
            finished = asyncio.create_task(client.wait())
            tasks += [injected, finished]
            bound = _duration(profile) + timeout_s + 60
            done, _ = await asyncio.wait(tasks, timeout=bound, return_when=asyncio.FIRST_EXCEPTION)
            if injected in done and injected.exception() is not None:
                note = await injected  # raises: the fault could not be injected
            assert finished in done, f"the client did not finish within {bound:g} s"
            assert client.returncode == 0, f"the client failed ({client.returncode})"
            note = await injected  # a fault may outlast the load (a reclaim it waits for)
            struck = live.injected_at
        finally:
            for task in tasks:
                task.cancel()
            if client.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(client.pid, signal.SIGKILL)
                await client.wait()
        usage = world.serverless.usage()
        failed = usage.errors - metered.errors
        invocations = usage.requests - metered.requests - failed
    finally:
        if served is None:
            await stop(run)
        else:
            await _stopped(run, served)
    children = left_behind(os.getpid(), before)
    results = json.loads(out.read_text())
    expected = await _expected_outputs(source, results["bodies"])
    rt_max_ms = settings.models[0].slo.rt_max_ms
    tally = count(name, results, expected, rt_max_ms, invocations, failed)
    tally.fault = note
    tally.outcomes = results["outcomes"]
    tally.withheld = int(results.get("withheld", 0))
    if struck is not None:
        tally.after_fault = since(results["outcomes"], struck, rt_max_ms)
    tally.moto_states = moto_instances(region, cluster)
    store = await open_store(settings.db_url)
    try:
        tally.store_states = {r.instance_id: r.state for r in await store.instances()}
        tally.decisions = await store.decisions(0, 1e12)
    finally:
        await store.close()
    tally.orphan_detail = orphans(tally.moto_states, tally.store_states, children)
    tally.orphans = len(tally.orphan_detail)
    tally.took_s = time.monotonic() - began
    record(tally)
    if check:
        tally.check()
    return tally


async def _serve(settings: Settings) -> tuple[Running, asyncio.Task[None]]:
    """``serve(settings)`` as a task, once it is up: the daemon ``mark up`` runs."""
    up: asyncio.Future[Running] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve(settings, on_ready=up.set_result))
    either: set[asyncio.Future[None] | asyncio.Future[Running]] = {task, up}
    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    if not up.done():
        await task  # raises what stopped it
        raise AssertionError("the daemon returned before it was up")
    return up.result(), task


async def _stopped(run: Running, served: asyncio.Task[None]) -> None:
    """Wait for a daemon run by ``serve`` to stop by itself (the fault signalled it) within
    its drain bound and a margin; otherwise signal it (SIGTERM) and fail the scenario."""
    bound = drain_bound(run.settings, run.models) + 30.0
    done, _ = await asyncio.wait({served}, timeout=bound)
    if served in done:
        await served
        return
    os.kill(os.getpid(), signal.SIGTERM)  # serve's handler: drain and stop
    await served
    raise AssertionError(f"the daemon did not stop by itself within {bound:g} s")


async def _ready(url: str, within_s: float = 60.0) -> None:
    """Wait until the endpoint says it serves (``/v2/health/ready``: after the first agent
    sync), so no request of the load is refused for a start the scenario did not inject."""
    deadline = time.monotonic() + within_s
    async with aiohttp.ClientSession() as session:
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"{url}/v2/health/ready") as r:
                    if r.status == 200:
                        return
            assert time.monotonic() < deadline, f"the daemon was not ready within {within_s:g} s"
            await asyncio.sleep(0.2)


def _duration(profile: str) -> float:
    from mark.demo.rate_profile import RateProfile

    return float(RateProfile.parse(profile).duration)


# -- faults --------------------------------------------------------------------------------


def kill_agent() -> Fault:
    """SIGKILL to the agent process of one serving instance (its "instance" dies at once)."""

    async def fault(live: Live) -> str:
        victim = (await live.serving())[0]
        os.kill(live.agents.procs[victim].process.pid, signal.SIGKILL)
        return f"kill -9 of the agent of {victim} at {live.strike():.0f} s"

    return fault


def hang_model(flag: Path) -> Fault:
    """The model hangs inside one serving agent for good (``tests/faults/stall_model.py``:
    ``flag``, the file ``MARK_TEST_STALL_FILE`` names, gets that agent's process id)."""

    async def fault(live: Live) -> str:
        stuck = (await live.serving())[0]
        pid = live.agents.procs[stuck].process.pid
        await asyncio.to_thread(flag.write_text, str(pid))
        at = live.strike()

        async def drained() -> bool:
            return stuck not in live.dispatcher.backends

        try:
            await live.until(f"{stuck} hung but was not drained", 30, drained)
        except AssertionError as exc:
            fleet = [(i.instance_id, i.role.value, i.state.value) for i in await live.fleet()]
            sup = live.agents
            raise AssertionError(
                f"{exc}; fleet {fleet}; agents {sorted(sup.procs)}, starting "
                f"{sorted(sup._starting)}, failing {sorted(sup._failing)}"
            ) from None
        return f"model hung on {stuck} at {at:.0f} s, drained {live.elapsed() - at:.1f} s later"

    return fault


def throttle_lambda(seconds: float) -> Fault:
    """The local Lambda refuses every invocation as throttled (429) for ``seconds``
    (``RuntimePool.throttle``, its fault-injection switch)."""

    async def fault(live: Live) -> str:
        serverless = live.world.serverless
        assert serverless is not None
        serverless._pool.throttle(seconds)
        at = live.strike()
        return f"Lambda throttled (429) from {at:.0f} s to {at + seconds:.0f} s"

    return fault


def no_capacity(instance_type: str, refused: list[str]) -> Fault:
    """EC2 answers every RunInstances for ``instance_type`` with InsufficientInstanceCapacity.

    Injected where AWS's answer enters: a ``before-call`` hook on the fleet's own EC2
    client (botocore's stubbing seam) returns EC2's error response instead of calling
    moto, so botocore raises the ``ClientError`` and the adapter, reconciler and step
    handle it exactly as AWS's. ``refused`` collects each refused launch's type.
    """

    def refuse(params: Mapping[str, Any], **_: Any) -> tuple[AioAWSResponse, dict[str, Any]] | None:
        body = params.get("body")
        if not isinstance(body, Mapping) or body.get("InstanceType") != instance_type:
            return None
        refused.append(instance_type)
        error = {
            "Code": "InsufficientInstanceCapacity",
            "Message": f"We currently do not have sufficient {instance_type} capacity "
            "in the Availability Zone you requested.",
        }
        return AioAWSResponse(None, 500, {}, None), {
            "Error": error,
            "ResponseMetadata": {"HTTPStatusCode": 500},
        }

    async def fault(live: Live) -> str:
        assert live.world.fleet is not None
        ec2 = live.world.fleet._client
        ec2.meta.events.register("before-call.ec2.RunInstances", refuse)
        return f"InsufficientInstanceCapacity for {instance_type} from {live.strike():.0f} s"

    return fault


def spot_interruptions(fraction: float, lead_s: float, victims: list[str]) -> Fault:
    """Once the spot fleet serves and its standby pool is stopped, ``fraction`` of the spot
    instances get AWS's interruption warning, sent as EventBridge delivers it to the
    world's SQS queue. The event is stamped ``WARNING_LEAD_S - lead_s`` seconds in the
    past, so the daemon reads a two-minute warning that reached it late and the local
    world reclaims the instances ``lead_s`` after it is sent. ``victims`` gets their ids."""

    async def fault(live: Live) -> str:
        spot: list[str] = []

        async def settled() -> bool:
            fleet = await live.fleet()
            mine = [i for i in fleet if i.role is InstanceRole.SERVING]
            spot[:] = sorted(i.instance_id for i in mine if i.market is Market.SPOT)
            pool = [i for i in fleet if i.role is InstanceRole.STANDBY]
            return (
                len(spot) >= 2
                and all(i in live.dispatcher.backends for i in spot)
                and bool(pool)
                and all(i.state is InstanceState.STOPPED for i in pool)
            )

        await live.until("the spot fleet and its stopped standbys", 90, settled)
        k = max(1, round(fraction * len(spot)))
        victims[:] = spot[:k]
        sent_at = time.time() - (WARNING_LEAD_S - lead_s)
        stamp = datetime.fromtimestamp(sent_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        world = live.world
        async with get_session().create_client(
            "sqs", region_name=world.region, endpoint_url=world.endpoint
        ) as sqs:
            url = (await sqs.get_queue_url(QueueName=world.queue_name))["QueueUrl"]
            for iid in victims:
                event = {
                    "version": "0",
                    "id": f"fault-{iid}",
                    "detail-type": INTERRUPTION_WARNING,
                    "source": "aws.ec2",
                    "account": "123456789012",
                    "time": stamp,
                    "region": world.region,
                    "resources": [f"arn:aws:ec2:{world.region}:123456789012:instance/{iid}"],
                    "detail": {"instance-id": iid, "instance-action": "terminate"},
                }
                await sqs.send_message(QueueUrl=url, MessageBody=json.dumps(event))
        warned = live.strike()

        async def reclaimed() -> bool:  # the run goes on at least until the reclaim
            return not {i.instance_id for i in await live.fleet()} & set(victims)

        await live.until("the warned instances were not reclaimed", lead_s + 30, reclaimed)
        return (
            f"{k} of {len(spot)} spot instances warned at {warned:.0f} s, "
            f"reclaimed at {live.elapsed():.0f} s"
        )

    return fault


def sigterm(signalled_at: list[float], in_flight: int = 2) -> Fault:
    """SIGTERM to this process, where the daemon runs under ``serve`` (``by_signal``): the
    very signal ``mark up`` gets, through its handler; sent once the endpoint has at least
    ``in_flight`` requests taken and unanswered (waited for at most 30 s), so the drain
    has work. ``signalled_at`` gets the wall-clock time just before the signal, to compare
    with the client's send times."""

    async def fault(live: Live) -> str:
        await live.serving()
        for _ in range(6000):  # strike with requests taken and not yet answered; 30 s at most
            if live.run.intake.in_flight >= in_flight:
                break
            await asyncio.sleep(0.005)
        taken = live.run.intake.in_flight
        signalled_at.append(time.time())
        os.kill(os.getpid(), signal.SIGTERM)
        return f"SIGTERM to the daemon at {live.strike():.0f} s, {taken} request(s) in hand"

    return fault
