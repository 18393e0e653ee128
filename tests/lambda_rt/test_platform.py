"""The local Lambda platform with torch-free handlers: contract, crashes, timeouts, limits."""

from __future__ import annotations

import asyncio
import re
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from mark.cloud.local import LocalLambda
from mark.errors import (
    PayloadTooLarge,
    RuntimeExited,
    SpillFunctionError,
    SpillThrottled,
    SpillTimeout,
    is_throttled,
)

HANDLER = "tests.lambda_rt.fixtures_handlers.platform"


def _platform(root: Path, **kw: float | int | str) -> LocalLambda:
    return LocalLambda(handler=HANDLER, cwd=root, memory_mb=128, **kw)  # type: ignore[arg-type]


async def test_the_runtime_sees_lambdas_invocation_contract(project_root: Path) -> None:
    async with _platform(project_root, timeout_s=20.0, function_name="spill-fn") as lam:
        first = await lam.invoke("echo", [[1, 2], "x"])
        assert first.outputs == [[1, 2], "x"] and first.cold_start
        (ctx,) = (await lam.invoke("context", [])).outputs
    uuid.UUID(ctx["request_id"])
    assert ctx["function_name"] == "spill-fn" and ctx["memory"] == "128"
    assert ctx["arn"] == "arn:aws:lambda:us-east-1:123456789012:function:spill-fn"
    assert 15_000 < ctx["remaining_ms"] <= 20_000
    assert re.match(r"Root=1-[0-9a-f]{8}-[0-9a-f]{24};Parent=[0-9a-f]{16};Sampled=0", ctx["trace"])
    assert ctx["invocations"] == 2  # the same process served both


async def test_a_runtime_that_dies_fails_its_invocation_and_is_replaced(
    project_root: Path, runtime_children: Callable[[], list[int]]
) -> None:
    async with _platform(project_root, max_concurrency=1) as lam:
        await lam.invoke("echo", [1])
        with pytest.raises(RuntimeExited, match="exited with code 3"):
            await lam.invoke("die", [])
        assert (await lam.invoke("echo", [2])).cold_start
        assert lam.cold_starts == 2 and lam.runtimes == 1
        assert lam.usage().errors == 1
    assert runtime_children() == []


async def test_a_handler_exception_is_a_function_error(project_root: Path) -> None:
    async with _platform(project_root) as lam:
        with pytest.raises(SpillFunctionError, match="KeyError") as err:
            await lam.invoke("raise", [])
        assert err.value.error_type == "KeyError"
        assert (await lam.invoke("echo", [3])).outputs == [3]
        assert lam.cold_starts == 1


async def test_an_invocation_past_the_timeout_is_killed_and_billed(project_root: Path) -> None:
    async with _platform(project_root, timeout_s=0.5, max_concurrency=1) as lam:
        await lam.invoke("echo", [0])  # warm, so no init in the bill below
        before = lam.usage()
        t0 = time.perf_counter()
        with pytest.raises(SpillTimeout, match=r"Task timed out after 0\.50 seconds"):
            await lam.invoke("sleep", [30])
        assert time.perf_counter() - t0 < 2.0
        billed = lam.usage().billed_ms - before.billed_ms
        assert 500 <= billed < 1000
        assert (await lam.invoke("echo", [1])).outputs == [1]
        assert lam.cold_starts == 2


async def test_init_failure_is_an_explicit_error(project_root: Path) -> None:
    lam = LocalLambda(handler="tests.lambda_rt.no_such_module.handler", cwd=project_root)
    async with lam:
        with pytest.raises(RuntimeExited, match=r"init failed: Runtime\.ImportModuleError"):
            await lam.invoke("echo", [1])


async def test_init_that_hangs_is_cut_off(project_root: Path) -> None:
    handler = "tests.lambda_rt.fixtures_slow_init.handler"
    async with LocalLambda(handler=handler, cwd=project_root, init_timeout_s=0.5) as lam:
        t0 = time.perf_counter()
        with pytest.raises(RuntimeExited, match=r"did not finish init within 0\.5 s"):
            await lam.invoke("echo", [1])
        assert time.perf_counter() - t0 < 3.0


async def test_a_full_pool_queues_then_throttles(project_root: Path) -> None:
    async with _platform(project_root, max_concurrency=1, queue_timeout_s=0.3) as lam:
        slow = asyncio.create_task(lam.invoke("sleep", [1.0]))
        await asyncio.sleep(0.2)
        with pytest.raises(SpillThrottled) as err:
            await lam.invoke("echo", [1])
        assert is_throttled(err.value)
        await slow
        assert (await lam.invoke("echo", [2])).outputs == [2]
        assert lam.cold_starts == 1


async def test_a_cancelled_invoke_frees_its_runtime(project_root: Path) -> None:
    async with _platform(project_root, max_concurrency=1, queue_timeout_s=5.0) as lam:
        task = asyncio.create_task(lam.invoke("sleep", [0.3]))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await lam.invoke("echo", [1])).outputs == [1]
        assert lam.cold_starts == 1


async def test_payload_limits(project_root: Path) -> None:
    async with _platform(project_root, max_concurrency=1) as lam:
        with pytest.raises(PayloadTooLarge, match="event of"):
            await lam.invoke("echo", ["x" * (6 * 1024 * 1024)])
        assert lam.cold_starts == 0
        with pytest.raises(PayloadTooLarge, match="reply of"):
            await lam.invoke("big", [])
        assert (await lam.invoke("echo", [1])).outputs == [1]


async def test_close_kills_busy_and_idle_runtimes(
    project_root: Path, runtime_children: Callable[[], list[int]]
) -> None:
    lam = _platform(project_root, max_concurrency=3)
    await lam.start()
    await lam.warm_up("echo", 3)
    busy = asyncio.create_task(lam.invoke("sleep", [30]))
    await asyncio.sleep(0.2)
    assert len(runtime_children()) == 3
    t0 = time.perf_counter()
    await lam.close()
    assert time.perf_counter() - t0 < 5
    with pytest.raises(RuntimeExited, match="closed"):
        await busy
    assert runtime_children() == [] and lam.child_pids() == []


_DAEMON_THAT_DIES = """
import asyncio, os, signal, sys
from pathlib import Path
from mark.cloud.local import LocalLambda

async def main():
    lam = LocalLambda(handler=sys.argv[1], cwd=Path(sys.argv[2]), max_concurrency=2)
    await lam.start()
    await lam.warm_up("echo", 2)
    print(*lam.child_pids(), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # no close(): the runtimes must still go

asyncio.run(main())
"""


def _exited(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"  # exited; reaping is up to whoever inherited it


async def test_runtimes_exit_by_themselves_when_the_daemon_is_killed(project_root: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _DAEMON_THAT_DIES,
        HANDLER,
        str(project_root),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    pids = [int(p) for p in out.split()]
    assert len(pids) == 2
    for _ in range(50):  # up to 5 s: each runtime's long-poll fails and it exits
        if all(_exited(p) for p in pids):
            break
        await asyncio.sleep(0.1)
    assert all(_exited(p) for p in pids)
