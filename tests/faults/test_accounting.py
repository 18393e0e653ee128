"""The harness's accounting on made-up outcomes: what counts as lost, twice, wrong,
unexplained and orphaned (the scenarios assert these are zero, so they must not be
zero by construction)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tests.faults.harness import count, orphans

EXPECTED = np.array([[1.0, 2.0], [3.0, 4.0]])


def _o(k: int, status: int, **kw: Any) -> dict[str, Any]:
    body = k % 2
    base = {
        "id": f"r{k}",
        "body": body,
        "due_s": float(k),
        "sent_s": float(k),
        "latency_s": 0.1,
        "status": status,
        "served_by": "i-1" if status == 200 else None,
        "error": None,
        "echo": f"r{k}" if status == 200 else None,
        "output": EXPECTED[body].tolist() if status == 200 else None,
    }
    return {**base, **kw}


def test_every_way_a_request_can_go_wrong_is_counted() -> None:
    outcomes = [
        _o(0, 200),
        _o(1, 200, served_by="lambda", latency_s=2.0),  # on Lambda, past RT_max
        _o(1, 200, served_by="lambda"),  # r1 again: answered twice
        _o(2, 503, error="1 of 1 instances failed: spill failed: throttled"),
        _o(3, 503, error=""),  # an error without a reason
        _o(4, 0, error="TimeoutError: "),  # no answer: lost
        _o(5, 200, echo="r4"),  # another request's id
        _o(6, 200, output=[9.0, 9.0]),  # another input's output
        # r7 planned, never answered: lost
    ]
    t = count("made up", {"planned": 8, "outcomes": outcomes}, EXPECTED, 1000.0, 3)
    assert (t.sent, t.on_ec2, t.on_lambda, t.errors) == (8, 3, 2, 2)
    assert t.lost == 2 and t.unexplained == 1 and t.wrong == 2
    assert t.twice == 1 + 1  # r1 twice; 3 successful invocations for 2 Lambda answers
    assert t.within_rt_max == 4 / 8
    assert t.reasons["503 spill failed: throttled"] == 1


def test_orphans_are_what_runs_unclaimed_after_stop() -> None:
    moto = {
        "i-a": "running",
        "i-b": "running",
        "i-c": "pending",
        "i-d": "stopped",
        "i-e": "terminated",
    }
    store = {"i-a": "ready", "i-b": "terminated", "i-d": "stopped", "i-e": "ready"}
    found = orphans(moto, store, [4242])
    assert found == [
        "i-b running in moto, terminated in the store",
        "i-c pending in moto, unrecorded in the store",
        "process 4242 alive after stop",
    ]
