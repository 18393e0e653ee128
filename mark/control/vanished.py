"""Instances the store holds as live that the cloud no longer lists: ended and billed.

An instance can leave the cloud without the controller ending it in the store: the
daemon terminated it and died before ``Recorder.bill_retired`` (a kill between the two
calls), a user terminated it by hand, EC2 retired its host, or it ended while no daemon
ran. Left alone, the store would list it live for ever (``mark status``) and the ledger
would lack its run. So every step, and at a restart, each such record older than
``VANISHED_AFTER_S`` is marked terminated and its last run billed unless the ledger has it
(``Recorder.bill_vanished``), up to the last time this controller listed it, or, for one
it never listed, the best earlier sign of life there is.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from mark.control.recorder import Recorder
from mark.control.retiring import RETIRING
from mark.ports import InstanceInfo, InstanceState, Store
from mark.state.records import InstanceRecord

log = logging.getLogger("mark.control")

VANISHED_AFTER_S = 300.0
"""How long after its launch a record missing from the list counts as gone. EC2's API is
eventually consistent: a fresh launch may be missing from DescribeInstances for a while
(AWS, "Eventual consistency in the Amazon EC2 API"; ``tests/mark/cloud/test_restart.py``
plays it), and an instance the list has not caught up with yet must not be ended."""

LIVE_RECORDS = (
    *(s.value for s in InstanceState if s is not InstanceState.TERMINATED),
    "draining",  # the daemon's record of an agent failing its probe (``mark.agent_sync``)
    RETIRING,  # marked by a leader about to end it (``mark.control.retiring``)
)


async def end_vanished(
    store: Store,
    recorder: Recorder,
    listed: Sequence[InstanceInfo],
    now: float,
    *,
    at_restart: bool = False,
) -> list[str]:
    """Mark the records gone from ``listed`` (or listed shutting down) terminated and bill
    their last run; returns their ids. At a restart, a run this process never listed is
    billed up to the old controller's last plan (it had listed the instance live then, or
    the instance began after); otherwise up to the record's last change."""
    # One listed shutting down is ending, and EC2 bills it no more.
    ids = {i.instance_id for i in listed if i.state is not InstanceState.SHUTTING_DOWN}
    recorder.saw(ids, now)
    gone: list[str] = []
    last_plan: dict[str, float] = {}
    for rec in await store.instances(states=list(LIVE_RECORDS)):
        if rec.instance_id in ids or now - rec.launched_at < VANISHED_AFTER_S:
            continue
        seen = recorder.seen.get(rec.instance_id)
        if seen is None:
            seen = await _last_plan(store, rec, last_plan) if at_restart else rec.updated_at
        billed = await recorder.bill_vanished(rec, seen)
        why = "no longer in the cloud" + (" at restart" if at_restart else "")
        if billed is not None:
            why += f"; its last run billed until {billed.end:.0f}, when last seen live"
        await store.set_instance_state(
            rec.instance_id, InstanceState.TERMINATED.value, now, reason=why
        )
        recorder.forget(rec.instance_id)
        gone.append(rec.instance_id)
    if gone:
        # Nobody chose this: a terminate by hand, a lost host, or a kill mid-retirement.
        log.warning(
            "ended %d instance(s) the cloud no longer lists: %s", len(gone), ", ".join(gone)
        )
    return gone


async def _last_plan(store: Store, rec: InstanceRecord, cache: dict[str, float]) -> float:
    if rec.model not in cache:
        plans = await store.plans(rec.model, limit=1)
        cache[rec.model] = plans[0].at if plans else rec.updated_at
    return cache[rec.model]
