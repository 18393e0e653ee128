"""The cluster's frontends (issue #49): each beats its row, `mark status` lists them and
which leads, per-key limits are shared by the live ones, and the leader reads the other
frontends' counts beside its own (``mark.control.cluster_feed``). On real SQLite and
PostgreSQL where a store is involved."""

from __future__ import annotations

import math

from rich.console import Console

from bouncer.miss_budget import MissTally
from mark.cli.status_cmd import frontend_table
from mark.config import load_settings
from mark.control.cluster_feed import ClusterFeed, interleaved
from mark.serve.auth import Limiter
from mark.serve.telemetry import Telemetry
from mark.state import ApiKeyRecord, FrontendRecord, LeaseRecord, open_store
from mark.state.frontend_store import LIVE_S
from provisioner.spill_evidence import SpillCounts


def _rec(fid: str, at: float, **feed: float) -> FrontendRecord:
    return FrontendRecord(fid, f"http://{fid}", 0.0, at, None, {"m": feed} if feed else {})


def test_the_leader_takes_each_other_frontends_counts_since_it_last_looked() -> None:
    feed = ClusterFeed("me")
    first = feed.look(
        [
            _rec("me", 1.0, hits=500, misses=9, arrived=10, missed=1),
            _rec(
                "b",
                1.0,
                hits=100,
                misses=2,
                spilled=4,
                spill_within=3,
                arrived=40,
                missed=2,
                period_arrived=400,
                period_missed=5,
            ),
        ]
    )
    # First sight of b: a baseline (no burst of its history), but its tally counts now.
    assert first["m"].latencies == [] and first["m"].spills == SpillCounts()
    # Its own ("me") is counted in process, not here; the hour's and the period's.
    assert first["m"].tally == MissTally(40, 2, 400, 5)
    second = feed.look(
        [
            _rec("b", 3.0, hits=106, misses=4, spilled=5, spill_within=3, spill_cost=0.5),
            _rec("c", 3.0, hits=7, arrived=7),  # new: a baseline
        ]
    )["m"]
    assert sorted(second.latencies) == [0.0] * 6 + [math.inf] * 2
    assert second.spills == SpillCounts(1, 0, 0.5)
    assert second.tally == MissTally(7, 0)
    # b restarted under the same id (its counts fell): a baseline again, nothing negative.
    third = feed.look([_rec("b", 5.0, hits=3, misses=0)])["m"]
    assert third.latencies == [] and third.spills == SpillCounts()
    feed.reset()  # no longer the leader: the next term starts from a baseline
    assert feed.look([_rec("b", 7.0, hits=50)])["m"].latencies == []


def test_other_frontends_outcomes_are_spread_not_bunched() -> None:
    out = interleaved(6, 3)
    assert len(out) == 9 and out.count(math.inf) == 3
    assert all(out[i : i + 3].count(math.inf) == 1 for i in range(0, 9, 3))
    assert interleaved(0, 0) == [] and interleaved(2, 0) == [0.0, 0.0]


def test_a_frontends_feed_counts_what_the_slo_monitor_and_spill_evidence_read() -> None:
    tel = Telemetry("m", rt_max_ms=100.0)
    tel.outcome(1.0, 0.05, ok=True, spilled=False)
    tel.outcome(1.0, 0.2, ok=True, spilled=True)  # late
    tel.outcome(1.0, 0.01, ok=False, spilled=False)  # failed: a miss
    tel.outcome(1.0, 0.0, ok=False, spilled=False, declined=True)  # not the monitor's
    tel.lambda_charged(0.25)
    tel.take_latencies(), tel.take_spills()  # what the process hands its own controller
    assert tel.feed(MissTally(9, 2, 90, 3)) == {
        "hits": 1,
        "misses": 2,
        "spilled": 1,
        "spill_within": 0,
        "spill_cost": 0.25,
        "arrived": 9,
        "missed": 2,
        "period_arrived": 90,
        "period_missed": 3,
    }


def test_a_keys_limits_are_shared_by_the_live_frontends() -> None:
    settings = load_settings()
    key = ApiKeyRecord("k", "k", ("inference",), "h", 0.0, rate_rps=30.0, max_concurrency=4)
    lim = Limiter(settings.api)
    assert lim.limits(key) == (30.0, 4)
    lim.share = 3
    assert lim.limits(key) == (10.0, 2)  # rate / 3; ⌈4 / 3⌉
    lim.share = 8
    assert lim.limits(key) == (3.75, 1)  # never below one in flight


async def test_frontends_beat_and_are_read_back_live_or_gone(db_url: str) -> None:
    store = await open_store(db_url, upgrade=True)
    try:
        await store.beat(_rec("a", 100.0, hits=1))
        await store.beat(_rec("b", 100.0))
        await store.beat(_rec("a", 104.0, hits=5))  # replaced, not added
        live = await store.frontends(104.0 - LIVE_S)
        assert [(f.id, f.last_seen) for f in live] == [("a", 104.0), ("b", 100.0)]
        assert live[0].feed == {"m": {"hits": 5.0}}
        assert [f.id for f in await store.frontends(101.0)] == ["a"]
        await store.beat(_rec("a", 200_000.0))  # a day on: b is forgotten
        assert [f.id for f in await store.frontends(0.0)] == ["a"]
    finally:
        await store.close()


def test_status_lists_the_frontends_and_which_leads() -> None:
    now = 1000.0
    table = frontend_table(
        [_rec("fe-1", now - 1.0), _rec("fe-2", now - 2.0), _rec("fe-3", now - 60.0)],
        [LeaseRecord("cluster", "fe-2", now - 30.0, now + 10.0)],
        now,
    )
    console = Console(width=200, record=True)
    console.print(table)
    text = console.export_text()
    assert "frontends (2 live)" in text
    rows = {line.split("│")[1].strip(): line for line in text.splitlines() if "│ fe-" in line}
    assert rows["fe-2"].rstrip(" │").endswith("yes")
    assert "(gone)" in rows["fe-3"] and "yes" not in rows["fe-1"]
