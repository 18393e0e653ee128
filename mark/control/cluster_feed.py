"""What the other frontends of the cluster counted, for the leader: each frontend's row
(``mark.state.frontend_store``) holds its counts since it started, so the leader takes
the difference since it last looked. The SLO monitor then judges every frontend's
requests, the spill evidence counts every frontend's spills, and the miss tally is the
cluster's.

The SLO monitor's window needs only whether each request met RT_max, so the other
frontends' outcomes come in as 0 s (met) or inf (missed), their order within one look
lost. A frontend first seen (or one that restarted: its counts fell) is a baseline, not a
burst of its history.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from bouncer.miss_budget import NO_TALLY, MissTally
from mark.state.records import FrontendRecord
from provisioner.spill_evidence import SpillCounts


def interleaved(hits: int, misses: int) -> list[float]:
    """``hits`` met (0 s) and ``misses`` missed (inf) outcomes spread evenly: their order is
    lost, and misses bunched at one end would sway a window of the last M."""
    n = hits + misses
    return [math.inf if (i + 1) * misses // n > i * misses // n else 0.0 for i in range(n)]


SINCE_START = ("hits", "misses", "spilled", "spill_within", "spill_cost")
"""The feed's counts since the frontend started (``Telemetry.feed``); its ``arrived`` and
``missed`` are the miss budget's window now."""


@dataclass
class Seen:
    """One model's share of the other frontends' counts since the last look."""

    latencies: list[float] = field(default_factory=list)
    spills: SpillCounts = field(default_factory=SpillCounts)
    tally: MissTally = NO_TALLY
    """Their miss budgets' arrivals and misses now (``MissBudget.count``): not a difference."""


@dataclass
class ClusterFeed:
    own: str
    """This frontend's id: its own counts reach the controller in process."""
    max_outcomes: int = 10_000
    """At most this many outcomes per model and look (the SLO monitor keeps its last M)."""
    _last: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)

    def reset(self) -> None:
        """Forget what was seen: the next look is a baseline (a new term as leader)."""
        self._last.clear()

    def look(self, frontends: Sequence[FrontendRecord]) -> dict[str, Seen]:
        """Per model, what the other live ``frontends`` counted since the last look."""
        out: dict[str, Seen] = {}
        for rec in frontends:
            if rec.id == self.own:
                continue
            for model, counts in rec.feed.items():
                seen = out.setdefault(model, Seen())
                now = {k: float(v) for k, v in counts.items()}
                theirs = MissTally(*(int(now.get(k, 0)) for k in MissTally._fields))
                seen.tally = seen.tally.merged(theirs)
                before = self._last.get((rec.id, model))
                self._last[(rec.id, model)] = now
                if before is None or any(now.get(k, 0.0) < before.get(k, 0.0) for k in SINCE_START):
                    continue  # first seen, or restarted under the same id: a baseline
                d = {k: now.get(k, 0.0) - before.get(k, 0.0) for k in SINCE_START}
                hits, misses = int(d.get("hits", 0)), int(d.get("misses", 0))
                seen.latencies += interleaved(
                    min(hits, self.max_outcomes), min(misses, self.max_outcomes)
                )
                s = seen.spills
                seen.spills = SpillCounts(
                    s.total + int(d.get("spilled", 0)),
                    s.within + int(d.get("spill_within", 0)),
                    s.cost + d.get("spill_cost", 0.0),
                )
        return out
