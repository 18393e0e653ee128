"""What the control loop keeps across a restart, and who may act: the saved control state
and the leader lease.

The ``ControlState`` a step threads on (doomed instances, standby holds and starts owed,
the SLO hold-off, avoided offerings, orphan clocks, when each model last explored, the
warm pool's stop and start times and its share of outrun starts, the spot notices seen
and the spot hours they came in) is saved in the store after every control task that
changed it, as JSON with a version (``encode_state``/``decode_state``), and restored
when a controller takes over (``Controller.adopt``). The SLO monitor's window of recent
outcomes is not saved: it is per request, refills within M requests, and a restart only
delays one verdict; its hold-off is saved. Times are the world's clock, so a restored
deadline means the same moment.

A controller acts only while it holds the cluster's lease in the database
(``control.leader_lease``): taken or renewed every third of ``lease_ttl_s`` (default
15 s) on a timer of its own (``Controller.hold_lease``), so a long step cannot let it
lapse; a controller that does not hold it plans, launches and records nothing, and
takes over (restoring the state and adopting the fleet, as a restart does) once the
holder has not renewed it in time. The holder id is unique to the process
(``mark.identity.frontend_id``): two daemons on one host and data directory are two
holders, and a restarted one waits out its predecessor's lease unless that one resigned
on stop.

A store without these methods (the simulator's ``MemoryStore``), or a fleet without a
cluster name (the simulator's), saves nothing and needs no lease: one controller, one
run.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from sqlalchemy.exc import SQLAlchemyError

from mark.errors import StoreError
from mark.state.records import ControlStateRecord, LeaseRecord
from provisioner.control_state import ControlState, ModelControl, PendingStart, WarmState
from provisioner.interruption_rate import InterruptionEvidence
from provisioner.slo_monitor import SloMonitorState
from provisioner.spill_evidence import SpillEvidence
from provisioner.spot import InterruptionMemory

log = logging.getLogger("mark.control")

STATE_VERSION = 1
"""The layout ``encode_state`` writes; a saved state of another version is not read."""


@runtime_checkable
class ControlStore(Protocol):
    """What saving the control state and holding the lease need of a store (``SqlStore``)."""

    async def save_control_state(self, rec: ControlStateRecord) -> None: ...

    async def control_state(self, key: str) -> ControlStateRecord | None: ...

    async def acquire_lease(
        self, key: str, holder: str, now: float, ttl_s: float
    ) -> LeaseRecord: ...

    async def release_lease(self, key: str, holder: str) -> None: ...


# -- the state as JSON -------------------------------------------------------------


def _t(x: float) -> float | None:
    """A time as JSON: never-set (±inf) is null (JSON, and PostgreSQL's json, have no inf)."""
    return x if math.isfinite(x) else None


def _since(x: Any) -> float:
    return -math.inf if x is None else float(x)


def encode_state(state: ControlState) -> dict[str, Any]:
    """The control state a restart needs, as plain JSON (``STATE_VERSION``'s layout)."""
    return {
        "models": {
            name: {
                "last_wanted": {i: t for i, t in sorted(c.last_wanted.items())},
                "slo_holdoff_until": _t(c.slo.holdoff_until),
                "hold_standbys_until": _t(c.hold_standbys_until),
                "explored_at": _t(c.explored_at),
                "spill": [
                    c.spill.seen,
                    c.spill.within,
                    c.spill.cost,
                    c.spill.seen_long,
                    c.spill.within_long,
                ],
            }
            for name, c in sorted(state.models.items())
        },
        "avoid": [[k[0], k[1], t] for k, t in sorted(state.avoid.avoid_until.items())],
        "doomed": dict(sorted(state.doomed.items())),
        "pending_starts": {
            i: {"model": p.model, "lost_rps": p.lost_rps, "until": p.until}
            for i, p in sorted(state.pending_starts.items())
        },
        "orphans": dict(sorted(state.orphans.items())),
        "warm": {
            "stopped_at": dict(sorted(state.warm.stopped_at.items())),
            "started_at": dict(sorted(state.warm.started_at.items())),
            "starts": state.warm.starts,
            "outrun_starts": state.warm.outrun_starts,
        },
        "interruptions": {
            "notices": state.interruptions.notices,
            "spot_hours": state.interruptions.spot_hours,
        },
    }


def _without_evidence(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` less what changes with every request or step: spill evidence, spot hours."""
    models = {m: {k: v for k, v in c.items() if k != "spill"} for m, c in data["models"].items()}
    notices = {"notices": data.get("interruptions", {}).get("notices", 0.0)}
    return {**data, "models": models, "interruptions": notices}


def decode_state(data: Mapping[str, Any]) -> ControlState:
    """``encode_state``'s JSON back; raises ``ValueError`` (or ``KeyError``/``TypeError``)
    when it is not that layout."""
    models = {
        str(name): ModelControl(
            last_wanted={str(i): float(t) for i, t in c["last_wanted"].items()},
            slo=SloMonitorState((), _since(c["slo_holdoff_until"])),
            hold_standbys_until=_since(c["hold_standbys_until"]),
            explored_at=_since(c["explored_at"]),
            spill=SpillEvidence(*(float(x) for x in c.get("spill", (0.0, 0.0, 0.0)))),
        )
        for name, c in data["models"].items()
    }
    warm, seen = data.get("warm", {}), data.get("interruptions", {})
    return ControlState(
        models=models,
        avoid=InterruptionMemory({(str(a), str(b)): float(t) for a, b, t in data["avoid"]}),
        doomed={str(i): float(t) for i, t in data["doomed"].items()},
        pending_starts={
            str(i): PendingStart(str(p["model"]), float(p["lost_rps"]), float(p["until"]))
            for i, p in data["pending_starts"].items()
        },
        orphans={str(i): float(t) for i, t in data["orphans"].items()},
        warm=WarmState(  # absent in a state saved before the warm pool: none known
            {str(i): float(t) for i, t in warm.get("stopped_at", {}).items()},
            {str(i): float(t) for i, t in warm.get("started_at", {}).items()},
            float(warm.get("starts", 0.0)),
            float(warm.get("outrun_starts", 0.0)),
        ),
        interruptions=InterruptionEvidence(  # absent before it was learned: none seen
            float(seen.get("notices", 0.0)), float(seen.get("spot_hours", 0.0))
        ),
    )


# -- saving, restoring, leading ---------------------------------------------------


@dataclass
class Durable:
    """Saves the control state, restores it, and holds the lease for one cluster."""

    store: ControlStore | None
    """None: nothing is saved and no lease is needed (the simulator's store)."""
    key: str
    """The cluster: one saved state and one lease each."""
    holder: str
    lease_ttl_s: float | None
    """None: no lease, this controller always acts."""
    _saved: dict[str, Any] | None = None
    _until: float = -math.inf
    _other: str | None = field(default=None)

    async def lead(self, now: float) -> bool:
        """Take or renew the lease; whether this controller may act now.

        If the database cannot be reached, it acts while the lease it last renewed
        lasts, and not after (another controller may then take over).
        """
        if self.store is None or self.lease_ttl_s is None:
            return True
        try:
            lease = await self.store.acquire_lease(self.key, self.holder, now, self.lease_ttl_s)
        except (StoreError, SQLAlchemyError, OSError) as exc:
            log.warning("cannot renew the control lease: %s", exc)
            return now < self._until
        if lease.holder == self.holder:
            if self._other is not None:
                log.info("this controller took the control lease over from %s", self._other)
            self._until, self._other = lease.expires_at, None
            return True
        if self._other != lease.holder:
            log.info(
                "controller %s holds the control lease until t=%.0f: this one plans nothing",
                lease.holder,
                lease.expires_at,
            )
        self._until, self._other = -math.inf, lease.holder
        return False

    @property
    def renew_every_s(self) -> float | None:
        """How often the lease is renewed on its own timer; None: no lease to hold."""
        if self.store is None or self.lease_ttl_s is None:
            return None
        return self.lease_ttl_s / 3.0

    def leading(self, now: float) -> bool:
        """Whether the lease this controller last took still lasts (no database call)."""
        return self.store is None or self.lease_ttl_s is None or now < self._until

    async def resign(self) -> None:
        """Give the lease up at once (a clean stop), so another controller need not wait."""
        if self.store is None or self.lease_ttl_s is None or self._until == -math.inf:
            return
        try:
            await self.store.release_lease(self.key, self.holder)
        except (StoreError, SQLAlchemyError, OSError) as exc:
            log.warning("cannot release the control lease: %s", exc)
        self._until = -math.inf

    async def restore(self, mine: ControlState | None = None) -> ControlState | None:
        """The state last saved for the cluster, or None (none, unreadable, another version).
        ``mine``: the state this controller holds, kept if the saved one is still what it
        saved (or restored) itself: after losing the lease to an outage, what it holds may
        be newer than what it could save."""
        if self.store is None:
            return None
        try:
            rec = await self.store.control_state(self.key)
        except (StoreError, SQLAlchemyError, OSError) as exc:
            log.warning("cannot read the saved control state; starting afresh: %s", exc)
            return None
        if rec is None:
            return None
        if mine is not None and self._saved is not None and rec.state == self._saved:
            return mine
        if rec.version != STATE_VERSION:
            log.warning(
                "saved control state is version %d, this mark reads %d; starting afresh",
                rec.version,
                STATE_VERSION,
            )
            return None
        try:
            state = decode_state(rec.state)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            log.warning("saved control state is unreadable (%r); starting afresh", exc)
            return None
        self._saved = encode_state(state)
        return state

    async def save(self, state: ControlState, now: float, *, evidence: bool = False) -> None:
        """Save the state if it changed since last saved; a failure is logged, not fatal
        (the next task saves again). Spill evidence changes with every spilled request, and
        the spot hours counted with every step: a change in them alone is saved only with
        ``evidence`` (once per control step)."""
        if self.store is None:
            return
        data = encode_state(state)
        if data == self._saved or (
            not evidence
            and self._saved is not None
            and _without_evidence(data) == _without_evidence(self._saved)
        ):
            return
        try:
            await self.store.save_control_state(
                ControlStateRecord(self.key, STATE_VERSION, data, now, self.holder)
            )
        except (StoreError, SQLAlchemyError, OSError) as exc:
            log.warning("cannot save the control state: %s", exc)
            return
        self._saved = data
