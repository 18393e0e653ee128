"""Torch-free handlers that exercise the local Lambda platform itself.

They start in a fraction of a second (no torch import), so the tests of
timeouts, crashes and init failures stay fast while still going through the
real awslambdaric runtime and the real Runtime API.
"""

from __future__ import annotations

import os
import time
from typing import Any

_invocations = 0


def platform(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """What to do is named by ``event["model"]``: echo, context, sleep, raise, die."""
    global _invocations
    _invocations += 1
    action = event["model"]
    if action == "echo":
        return {"outputs": event["instances"], "cold_start": _invocations == 1}
    if action == "context":
        return {
            "outputs": [
                {
                    "request_id": context.aws_request_id,
                    "function_name": context.function_name,
                    "memory": context.memory_limit_in_mb,
                    "arn": context.invoked_function_arn,
                    "remaining_ms": context.get_remaining_time_in_millis(),
                    "trace": os.environ.get("_X_AMZN_TRACE_ID"),
                    "pid": os.getpid(),
                    "invocations": _invocations,
                }
            ]
        }
    if action == "sleep":
        time.sleep(float(event["instances"][0]))
        return {"outputs": []}
    if action == "raise":
        raise KeyError("no such thing")
    if action == "big":
        return {"outputs": ["x" * (7 * 1024 * 1024)]}
    if action == "die":
        os._exit(3)
    return {"error": f"unknown action {action!r}"}
