"""Draining through the store: the leader marks an instance ``retiring`` before it ends it,
so that every frontend, not only the leader, stops sending it batches.

Several frontends serve one cluster, each batching to the agents its own agent sync finds;
only the leader terminates (or stops) instances. Its ``Dispatchers`` retire the instance
on its own request path and tell the others through ``StoreRetiring``: the instance's
record goes to ``retiring``, and the terminate waits until every other live frontend has
read the marks since (its ``synced_at``, published by its beat, at or after the mark), or
one agent sync plus a grace has passed, whichever comes first (``drain_wait``): a frontend
that died cannot hold a termination. Each frontend's agent sync reads the marks once
(``marks``; ``mark.agent_sync.read_marks``) and sends the marked instances nothing new.
A termination the cloud refuses puts the record back in the state it had, and the next
syncs send to it again.

The simulator has no frontends and no ``Draining``: none of this runs there.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sqlalchemy.exc import SQLAlchemyError

from mark.errors import StoreError
from mark.identity import frontend_id
from mark.ports import Clock
from mark.state.frontend_store import LIVE_S
from mark.state.records import FrontendRecord, InstanceRecord

log = logging.getLogger("mark.control")

RETIRING = "retiring"
"""An instance record's state while the leader drains it before ending it: no frontend sends
it a new batch. Never an agent's to change (``mark.agent_sync.AGENT_STATES_FROM``)."""
SERVING_RECORDS = ("pending", "running", "ready", "draining")
"""Record states of an instance that may take batches (``draining``: the agent sync's word for
an agent failing its probe): what a mark is made from and a refused termination goes back to."""
MARK_READ = (RETIRING, *SERVING_RECORDS)
"""What an agent sync reads: the marks, and the instances serving (unmarked again)."""
POLL_S = 0.5
"""How often the leader reads the frontends' rows while it waits (each beats every 2 s)."""

_STORE_ERRORS = (StoreError, SQLAlchemyError, OSError)


def drain_wait(
    marked_at: float, synced: Sequence[float | None] | None, now: float, bound_s: float
) -> float:
    """Seconds the leader still waits before ending instances it marked at ``marked_at``;
    0: go. ``synced``: when each other live frontend last read the marks (None: never), or
    None when the frontends could not be read. Go once every one read them at or after the
    mark, or ``bound_s`` after it, so a frontend that stopped syncing holds nothing longer."""
    left = marked_at + bound_s - now
    if left <= 0 or (synced is not None and all(s is not None and s >= marked_at for s in synced)):
        return 0.0
    return left


def marks(records: Iterable[InstanceRecord]) -> tuple[frozenset[str], frozenset[str]]:
    """From the records an agent sync reads (``MARK_READ``): the instances marked retiring,
    and those serving, which are sent batches again if a sync withheld them."""
    recs = list(records)
    marked = frozenset(r.instance_id for r in recs if r.state == RETIRING)
    serving = frozenset(r.instance_id for r in recs if r.state in SERVING_RECORDS)
    return marked, serving


class RetiringStore(Protocol):
    """What marking needs of a store (``SqlStore``)."""

    async def instances(
        self, *, model: str | None = None, states: Sequence[str] | None = None
    ) -> list[InstanceRecord]: ...

    async def set_instance_state(
        self,
        instance_id: str,
        state: str,
        at: float,
        *,
        address: str | None = None,
        reason: str | None = None,
        only_from: Collection[str] | None = None,
    ) -> None: ...

    async def frontends(self, since: float) -> list[FrontendRecord]: ...


@dataclass
class StoreRetiring:
    """The other frontends, told through the store that instances are about to end."""

    store: RetiringStore
    clock: Clock
    sync_s: float
    """How often a frontend's agent sync reads the marks: with a grace, the wait's bound."""
    me: str = field(default_factory=frontend_id)
    """This frontend: its own dispatchers are told directly, never waited for."""
    _before: dict[str, str] = field(default_factory=dict)
    """Instance id → the record's state before its mark: where a refused one goes back."""

    async def retire(self, instance_ids: Sequence[str], grace_s: float) -> None:
        """Mark the instances retiring, then wait until every other live frontend has read
        the mark, at most one agent sync plus ``grace_s`` (a batch sent just before a
        frontend read it ends within a grace). A store that does not answer holds nothing:
        the wait then runs to its bound."""
        at = await self._mark(instance_ids)
        bound_s = self.sync_s + grace_s
        while (left := drain_wait(at, await self._synced(), self.clock.now(), bound_s)) > 0:
            await self.clock.sleep(min(left, POLL_S))

    async def keep(self, instance_ids: Sequence[str]) -> None:
        """Their termination was refused: each record goes back to the state it had (only
        from ``retiring``: a started warm-pool instance is the recorder's), and every
        frontend's next sync sends to it again."""
        now = self.clock.now()
        for iid in instance_ids:
            back = self._before.pop(iid, "running")  # unread (an outage): the cloud's word
            why = "its end was refused: serving again"
            await self._set(iid, back, now, why, (RETIRING,))

    async def _mark(self, instance_ids: Sequence[str]) -> float:
        """Mark each serving one retiring; when the marks were made (taken after the writes,
        so a frontend that read the store since has read them)."""
        now = self.clock.now()
        live = await self._states()
        if live is not None:
            self._before = {i: s for i, s in self._before.items() if i in live}
            self._before.update(
                (i, live[i]) for i in instance_ids if live.get(i) in SERVING_RECORDS
            )
        why = "about to end: the frontends send it no new batch"
        for iid in instance_ids:
            await self._set(iid, RETIRING, now, why, SERVING_RECORDS)
        return self.clock.now()

    async def _states(self) -> dict[str, str] | None:
        """The records that serve or are marked, by id; None if the store does not answer."""
        try:
            return {r.instance_id: r.state for r in await self.store.instances(states=MARK_READ)}
        except _STORE_ERRORS as exc:
            log.warning("cannot read the instances to mark them retiring: %s", exc)
            return None

    async def _set(
        self, iid: str, state: str, now: float, why: str, only_from: Collection[str]
    ) -> None:
        try:
            await self.store.set_instance_state(iid, state, now, reason=why, only_from=only_from)
        except _STORE_ERRORS as exc:  # not recorded yet, or no store: the bound still holds
            log.warning("cannot record %s as %s: %s", iid, state, exc)

    async def _synced(self) -> list[float | None] | None:
        """When each other live frontend last read the marks; None if the store does not
        answer."""
        try:
            rows = await self.store.frontends(self.clock.now() - LIVE_S)
        except _STORE_ERRORS as exc:
            log.debug("cannot read the frontends: waiting out the bound: %s", exc)
            return None
        return [f.synced_at for f in rows if f.id != self.me]


__all__ = [
    "MARK_READ",
    "RETIRING",
    "SERVING_RECORDS",
    "StoreRetiring",
    "drain_wait",
    "marks",
]
