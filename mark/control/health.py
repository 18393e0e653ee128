"""What the daemon has seen of each agent's health, as facts the health step reads.

Every agent sync says which instances' agents serve now (ready, and passing
their liveness probe). An instance is *ready* from the first sync it serves
in; one that served and then stops (a dead process, a hung model failing its
probe) is *failing* from the first sync it is missing from, until it serves
again or is gone from the fleet.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from provisioner.health_step import HealthFact


@dataclass
class HealthTracker:
    facts: dict[str, HealthFact] = field(default_factory=dict)
    since: float | None = None
    """When the first sync was observed; None before (no verdict is possible yet)."""

    def observe(
        self, now: float, listed: Iterable[str], serving: Iterable[str]
    ) -> tuple[list[str], list[str]]:
        """One sync: ``listed`` instances exist, ``serving`` ones answered ready and live.

        Returns the instances that became ready and those that started failing.
        """
        if self.since is None:
            self.since = now
        ok = set(serving)
        seen = set(listed)
        ready, failing = [], []
        for iid in sorted(seen):
            fact = self.facts.get(iid, HealthFact())
            if iid in ok:
                if fact.ready_since is None or fact.failing_since is not None:
                    ready.append(iid)
                self.facts[iid] = HealthFact(fact.ready_since or now, None)
            elif fact.ready_since is not None and fact.failing_since is None:
                failing.append(iid)
                self.facts[iid] = HealthFact(fact.ready_since, now)
        for iid in [i for i in self.facts if i not in seen]:
            del self.facts[iid]
        return ready, failing

    def view(self) -> tuple[Mapping[str, HealthFact], float] | None:
        """The facts and since when they were observed; None before the first sync."""
        return None if self.since is None else (dict(self.facts), self.since)
