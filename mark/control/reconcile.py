"""Carry a step's actions out against the ``Fleet``, and report what happened.

The one place the control loop spends money: each launch carries a client
token derived from the decision, so a controller that crashes and re-runs the
same step gets the first launch back instead of buying twice; an offering out
of capacity is reported (the controller re-plans without it); any other
failure is reported and the rest of the step goes on.

Each launch is logged with the decision that made it and why (the ``Launch``'s
reason), and the ids it got: the line an operator finds when an instance appears
("agent for i-... at ..."). Every other act (terminate, start, stop) and every
failure is logged from its decision by ``Recorder.decisions``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from mark.catalog import Market
from mark.errors import CloudError, InsufficientCapacity
from mark.ports import (
    Draining,
    Fleet,
    InstanceInfo,
    InstanceRole,
    InstanceState,
    LaunchRequest,
)
from provisioner.control_state import Launch, Note

log = logging.getLogger("mark.control")

LIVE = frozenset({InstanceState.PENDING, InstanceState.RUNNING, InstanceState.READY})


def launch_token(
    model: str, instance_type: str, market: str, role: InstanceRole, step: int, seen: int
) -> str:
    """The client token of one launch decision, the same whenever the decision is.

    A decision is "in control step ``step``, with ``seen`` live instances of this
    model, offering and role, launch more": a controller that crashes after
    launching and re-runs the step before the cloud lists the new instances
    makes the same decision with the same token, and the fleet returns the
    first launch instead of buying again. A later launch in the same step sees
    the earlier one's instances, so its token differs. The count is left out on
    purpose: a re-run that wants a different number still must not buy twice.
    """
    return f"{model}/{instance_type}/{market}/{role.value}/step-{step}/seen-{seen}"


def count_live(
    fleet: Sequence[InstanceInfo],
    model: str,
    instance_type: str,
    market: Market,
    role: InstanceRole,
) -> int:
    """Live instances of one model, offering and role."""
    return sum(
        1
        for i in fleet
        if (i.model, i.instance_type, i.market, i.role) == (model, instance_type, market, role)
        and i.state in LIVE
    )


@dataclass
class Launched:
    """What a batch of launches did."""

    got: list[InstanceInfo] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    failed: int = 0
    out_of_capacity: tuple[str, str] | None = None


@dataclass
class Reconciler:
    fleet: Fleet
    step_s: float
    unavailable_ttl_s: float = 180.0
    draining: Draining | None = None
    """Told before each termination (the daemon's dispatchers, and through the store the
    other frontends': ``mark.control.retiring``); None in the simulator, whose requests
    finish on the instance they were sent to."""
    versions: dict[str, str] = field(default_factory=dict)
    """Each model's version its launches serve (tagged ``mark:version``): the one being
    rolled to while a new version rolls."""

    def step_index(self, now: float) -> int:
        return math.floor(now / self.step_s)

    async def launch(
        self, launches: Sequence[Launch], fleet: Sequence[InstanceInfo], now: float
    ) -> Launched:
        """Launch in order; stop at the first offering out of capacity (the caller avoids it
        and asks the next: a plan step re-plans, the SLO monitor takes its next offering)."""
        out = Launched()
        for a in launches:
            role, market = InstanceRole(a.role), Market(a.market)
            seen = count_live(fleet, a.model, a.instance_type, market, role)
            token = launch_token(
                a.model, a.instance_type, a.market, role, self.step_index(now), seen
            )
            request = LaunchRequest(
                a.model, a.instance_type, market, a.count, role, token, self.versions.get(a.model)
            )
            try:
                got = await self.fleet.launch(request)
            except InsufficientCapacity as exc:
                why = f"{exc}; avoided for {self.unavailable_ttl_s:g} s, the next offering asked"
                out.notes.append(
                    Note("launch-unavailable", why, a.instance_type, a.market, a.count)
                )
                out.failed += 1
                out.out_of_capacity = a.key
                return out
            except CloudError as exc:
                if role is InstanceRole.BACKUP:
                    out.notes.append(Note("backup-failed", f"{a.reason}: {exc}", a.instance_type))
                else:
                    out.notes.append(
                        Note("launch-failed", str(exc), a.instance_type, a.market, a.count)
                    )
                out.failed += 1
                continue
            out.got.extend(got)
            action = {
                "serving": "launch",
                "backup": "backup",
                "standby": "launch-standby",
                "explore": "explore",
            }[a.role]
            count = len(got) if role is InstanceRole.STANDBY else a.count
            out.notes.append(Note(action, a.reason, a.instance_type, a.market, count))
            log.info(
                "%s: %s %d× %s/%s (%s): %s",
                a.model,
                action,
                count,
                a.instance_type,
                a.market,
                ", ".join(i.instance_id for i in got) or "none yet",
                a.reason,
            )
        return out

    async def terminate(self, ids: Sequence[str]) -> str | None:
        """Drain, then terminate; the error text if the cloud refused (the instances
        then serve again)."""
        return await self._drained(ids, self.fleet.terminate)

    async def start(self, ids: Sequence[str]) -> None:
        """Start stopped instances; the request path may send to them again once they
        serve (a warm-pool instance was drained when it was stopped)."""
        await self.fleet.start(list(ids))
        if self.draining is not None:
            await self.draining.keep(ids)

    async def stop(self, ids: Sequence[str], *, drain: bool = False) -> str | None:
        """Stop instances; with ``drain`` (serving ones), drained first as for a
        termination, and the error text if the cloud refused (they then serve again).
        Without it an error is raised (a standby carries no batches of its own)."""
        if not drain:
            await self.fleet.stop(list(ids))
            return None
        return await self._drained(ids, self.fleet.stop)

    async def _drained(
        self, ids: Sequence[str], act: Callable[[list[str]], Awaitable[None]]
    ) -> str | None:
        """Drain ``ids``, then ``act`` on them; if the cloud refuses, they serve again and
        the error's text is returned."""
        if self.draining is not None:
            await self.draining.retire(ids)
        try:
            await act(list(ids))
        except CloudError as exc:
            if self.draining is not None:
                await self.draining.keep(ids)
            return str(exc)
        return None
