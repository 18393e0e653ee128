"""The harness's accounting of a stopping daemon's refusals: a connection refused (the
daemon no longer listens, nothing was taken) is an explicit error with its reason, a
dropped connection is lost, and arrivals the balancer held back are not sent."""

from __future__ import annotations

from typing import Any

import numpy as np

from tests.faults.client import REFUSED
from tests.faults.harness import count


def _o(k: int, status: int, error: str | None = None) -> dict[str, Any]:
    return {
        "id": f"r{k}",
        "body": 0,
        "due_s": float(k),
        "sent_s": float(k),
        "latency_s": 0.01,
        "status": status,
        "served_by": "i-1" if status == 200 else None,
        "error": error,
        "echo": f"r{k}" if status == 200 else None,
        "output": [1.0] if status == 200 else None,
    }


def test_refused_connections_are_explicit_errors_and_dropped_ones_lost() -> None:
    outcomes = [
        _o(0, 200),
        _o(1, 503, "mark is shutting down and takes no new requests; retry (another replica)"),
        _o(2, REFUSED, "connection refused (nothing taken): Cannot connect to host"),
        _o(3, 0, "ServerDisconnectedError: Server disconnected"),
    ]
    client = {"planned": 4, "withheld": 6, "outcomes": outcomes}
    t = count("stop", client, np.array([[1.0]]), 1000.0, lambda_invocations=0)
    assert (t.sent, t.on_ec2, t.errors, t.lost, t.unexplained) == (4, 1, 2, 1, 0)
    assert t.on_ec2 + t.errors + t.lost == t.sent  # held-back arrivals are not in "sent"
