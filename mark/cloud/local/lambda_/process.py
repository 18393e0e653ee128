"""A local Lambda runtime as an OS process: ``python -m awslambdaric <handler>``.

Each runtime starts in its own process group with a clean environment like
Lambda's (its ``AWS_LAMBDA_*`` variables, the Runtime API address, a thread count
for the configured memory) and is killed whole, process group and all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from mark.cloud.local.lambda_.records import Runtime

log = logging.getLogger(__name__)

MB_PER_VCPU = 1769  # Lambda allocates one vCPU's worth of CPU per 1,769 MB
_INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH")
_TAIL_BYTES = 4096
ROOT = Path(__file__).resolve().parents[4]  # holds both `mark` and `lambda_handlers`


class RuntimeLauncher:
    """Starts runtime processes of one function, each pointed at its own Runtime API port."""

    def __init__(
        self,
        *,
        handler: str,
        function_name: str,
        memory_mb: int,
        region: str,
        python: str = sys.executable,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.handler = handler
        self.function_name = function_name
        self.memory_mb = memory_mb
        self.region = region
        self.python = python
        self.cwd = cwd if cwd is not None else ROOT
        self.extra_env = dict(env or {})

    async def start(self, port: int) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            self.python,
            "-m",
            "awslambdaric",
            self.handler,
            cwd=self.cwd,
            env=self.env(port),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # its own process group, so close() kills it whole
        )

    def env(self, port: int) -> dict[str, str]:
        """A clean environment, like Lambda's: its variables plus what Python needs to run."""
        env = {k: os.environ[k] for k in _INHERITED_ENV if k in os.environ}
        vcpus = max(1, min(6, math.ceil(self.memory_mb / MB_PER_VCPU), os.cpu_count() or 1))
        stream = f"{time.strftime('%Y/%m/%d')}/[$LATEST]{secrets.token_hex(16)}"
        env.update(
            {
                "AWS_LAMBDA_RUNTIME_API": f"127.0.0.1:{port}",
                "AWS_LAMBDA_FUNCTION_NAME": self.function_name,
                "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
                "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(self.memory_mb),
                "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{self.function_name}",
                "AWS_LAMBDA_LOG_STREAM_NAME": stream,
                "AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand",
                "AWS_EXECUTION_ENV": "AWS_Lambda_python3.11",
                "AWS_REGION": self.region,
                "AWS_DEFAULT_REGION": self.region,
                "_HANDLER": self.handler,
                "LAMBDA_TASK_ROOT": str(self.cwd),
                "TZ": ":UTC",
                "OMP_NUM_THREADS": str(vcpus),
                "MKL_NUM_THREADS": str(vcpus),
            }
        )
        env.update(self.extra_env)
        return env


async def collect_output(rt: Runtime) -> int:
    """Keep the tail of the runtime's output until it exits; its exit code."""
    assert rt.proc is not None and rt.proc.stdout is not None
    out = rt.proc.stdout
    while chunk := await out.read(65536):
        rt.tail += chunk
        del rt.tail[:-_TAIL_BYTES]
        log.debug("lambda runtime %d: %s", rt.index, chunk.decode(errors="replace").rstrip())
    return await rt.proc.wait()


def kill(rt: Runtime) -> None:
    """SIGKILL the runtime's process group (the runtime and anything it started)."""
    proc = rt.proc
    if proc is None or proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
