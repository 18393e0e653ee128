"""Fuzz a daemon with a real agent behind it from the OpenAPI document it serves: no 5xx.

``tests/mark/serve/test_fuzz.py`` fuzzes the endpoint alone (a dispatcher whose spill
answers sums). Here the daemon runs in the local world (``mark.daemon.start``) with one
c5.large whose agent serves the demo model (torch), and the local Lambda behind it, so
every generated request that passes validation reaches a real batch on a real agent (or
the spill function). The schema is the one ``/openapi.json`` serves; every call carries a
valid inference key (made in the daemon's store, as ``mark keys create`` does). Checks:
``not_a_server_error`` and ``response_schema_conformance``. Every other case is aimed
at the model (its ``name`` set to ``digits``, V1 numbers clipped into float32's range,
which the schema does not say), so about half the V1 predictions run on the agent.
``EXAMPLES`` per operation over the 14 operations (the two health checks have one case
each): 1,202 cases, at least ``MIN_CASES`` asserted; the count, the server errors (none
may be) and the inferences answered are printed at the end of the module (about a
minute here).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from schemathesis.checks import not_a_server_error, response_schema_conformance
from schemathesis.core.result import Ok

from mark.catalog import Market
from mark.config import load_settings
from mark.daemon import Running, start, stop
from mark.demo import ensure_demo_model
from mark.ports import LaunchRequest
from mark.serve.auth import create_key

pytestmark = pytest.mark.slow

MIN_CASES = 1000
EXAMPLES = 100
"""Per operation; the operations without parameters have fewer distinct cases."""
COUNTS: Counter[str] = Counter()
FLOAT32_MAX = 3.0e38


class Daemon:
    """A daemon on a loop of its own (in a thread), with one serving agent and a key."""

    def __init__(self, data_dir: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.data_dir = data_dir
        self.run: Running | None = None
        self.token = ""

    def __enter__(self) -> Daemon:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._up(), self.loop).result(240)
        return self

    async def _up(self) -> None:
        settings = load_settings(
            overrides={
                "data_dir": str(self.data_dir),
                "api": {"port": 0, "max_body_bytes": 65536},
                "local": {"control_loop": False, "boot_delay_s": 0, "lambda_concurrency": 1},
            }
        )
        # No declines: one is a deliberate 503 whatever the input (load shedding, tested in
        # ``tests/mark/serve/test_dispatcher.py``), and a loaded machine can slow the agent
        # into one; the fuzz is about what inputs do.
        (spec,) = settings.models
        spec = spec.model_copy(update={"slo": spec.slo.model_copy(update={"decline_share": 0.0})})
        settings = settings.model_copy(update={"models": (spec,)})
        ensure_demo_model(self.data_dir)
        self.run = run = await start(settings)
        assert run.models["digits"].dispatcher is not None
        budget = run.models["digits"].dispatcher.budget
        assert budget is not None and budget.share == 0.0  # counts misses, declines none
        fleet = run.world.fleet
        assert fleet is not None
        await fleet.launch(LaunchRequest("digits", "c5.large", Market.ON_DEMAND))
        dispatcher = run.models["digits"].dispatcher
        assert dispatcher is not None
        deadline = time.monotonic() + 120
        while not dispatcher.backends:
            assert time.monotonic() < deadline, "the agent never came up"
            await asyncio.sleep(0.5)
        assert run.keys is not None
        _, self.token = await create_key(run.store, "fuzz", ["inference"], time.time())
        await run.keys.refresh()

    def __exit__(self, *_: object) -> None:
        if self.run is not None:
            asyncio.run_coroutine_threadsafe(stop(self.run), self.loop).result(120)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    @property
    def url(self) -> str:
        assert self.run is not None
        return self.run.url

    def outcomes(self) -> Counter[str]:
        """The model's telemetry counts: ``served`` by the agent, ``spilled``, ``error``."""
        assert self.run is not None
        telemetry = self.run.models["digits"].telemetry
        assert telemetry is not None
        return Counter(telemetry.counts)

    def backends(self) -> int:
        assert self.run is not None
        dispatcher = self.run.models["digits"].dispatcher
        assert dispatcher is not None
        return len(dispatcher.backends)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    data_dir = tmp_path_factory.mktemp("fuzz-agents")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MARK_DATA_DIR", str(data_dir))  # where the agents and runtimes look
        with Daemon(data_dir) as d:
            yield d
            assert d.backends() == 1, "the agent stopped serving during the fuzz"
    cases, errors, ran = COUNTS["cases"], COUNTS["server errors"], COUNTS["inferred"]
    print(
        f"\nschemathesis against a daemon with a real agent: {cases} cases, {errors} 5xx, "
        f"{ran} inferences answered 200"
    )
    assert cases >= MIN_CASES, f"only {cases} cases ran"


def _float32(value: Any) -> Any:
    """``value`` with every number clipped into float32's range: the schema allows any JSON
    number, the model takes float32, so most generated V1 inputs are refused (400) before
    they reach it (what the fuzz sees of the refusal is kept on the other half)."""
    if isinstance(value, list):
        return [_float32(v) for v in value]
    if isinstance(value, float | int) and not isinstance(value, bool):
        return max(-FLOAT32_MAX, min(FLOAT32_MAX, value))
    return value


def test_no_input_reaching_real_agents_produces_a_server_error(daemon: Daemon) -> None:
    headers = {"Authorization": f"Bearer {daemon.token}"}  # the document needs a key too
    schema = schemathesis.openapi.from_url(f"{daemon.url}/openapi.json", headers=headers)
    operations = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result.err()  # else the schema error, as the message
        operations.append(result.ok())
    assert len(operations) >= 10, [op.label for op in operations]
    per_operation: Counter[str] = Counter()
    refusals: Counter[str] = Counter()  # a sample of why generated inputs were refused
    for op in operations:

        @given(case=op.as_strategy())
        @hyp_settings(
            max_examples=EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        def fuzz(case: Any) -> None:
            COUNTS["cases"] += 1
            if COUNTS["cases"] % 2:  # half of them aimed at the model itself
                if "name" in (case.path_parameters or {}):
                    case.path_parameters["name"] = "digits"  # not a 404
                if isinstance(case.body, dict) and "instances" in case.body:
                    case.body = {**case.body, "instances": _float32(case.body["instances"])}
            response = case.call(base_url=daemon.url, headers=headers)
            per_operation[f"{case.operation.label} {response.status_code}"] += 1
            COUNTS["server errors"] += response.status_code >= 500
            if case.method == "POST" and response.status_code == 200:
                COUNTS["inferred"] += 1  # run by the agent or the spill function
            elif case.method == "POST" and len(refusals) < 12:
                refusals[response.text[:160]] += 1
            case.validate_response(
                response, checks=[not_a_server_error, response_schema_conformance]
            )

        fuzz()
    print("\n" + "\n".join(f"  {n:4d} {label}" for label, n in sorted(per_operation.items())))
    print("\n".join(f"  refused x{n}: {why}" for why, n in refusals.most_common()))
    assert COUNTS["inferred"] > 0, "no generated request reached the model"
    outcomes = daemon.outcomes()
    print(f"  the model's outcomes: {dict(outcomes)}")
    assert outcomes["served"] > 0, "the agent ran none of them"
