"""Three frontends, one cluster (issue #49): three ``mark up`` processes in the aws world
on one PostgreSQL and one fleet, behind HAProxy (``tests/faults/cluster.py``).

Asserted: the arrivals and roll-ups the store holds for a load sent through HAProxy (what
the forecast, ``mark status`` and ``mark report`` read) are what was sent, within 2 %,
though each frontend counted only its share; ``mark status`` counts them so too and lists
the three frontends, one leading; no follower launches anything. The faults (kill -9 of
the leader, a rolling restart) are in ``tests/faults/test_frontend_faults.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mark.state import open_store
from tests.e2e.test_aws_world import cloud  # noqa: F401 - the fixture
from tests.faults.cluster import NEEDS_HAPROXY, RATE_RPS, ROOT, cluster, load, until

pytestmark = [pytest.mark.slow, pytest.mark.postgres, NEEDS_HAPROXY]


async def test_three_frontends_behind_haproxy_count_one_clusters_load(
    cloud: dict[str, Any],  # noqa: F811
    pg_url: str,
    tmp_path: Path,
) -> None:
    async with cluster(cloud, pg_url, tmp_path) as c:
        t0 = time.time()
        sent = await load([c.through], c.key, RATE_RPS, 30.0)
        assert not sent.lost and not sent.refused and sent.twice == 0
        assert len(sent.answered) == sent.sent

        model = c.base.models[0].name
        counts: list[int] = []

        async def in_store() -> bool:
            """Closed windows are flushed every P_s, a minute's roll-up once it closes."""
            store = await open_store(pg_url)
            try:
                windows = await store.arrivals(model, t0 - 5.0, time.time())
                rollups = await store.latency_rollups(model, t0 - 60.0, time.time())
            finally:
                await store.close()
            counts[:] = [sum(w.count for w in windows), sum(r.requests for r in rollups)]
            return min(counts) >= 0.98 * sent.sent

        with contextlib.suppress(AssertionError):
            await until("the frontends' counts are in the store", in_store, within=90)
        assert all(abs(n - sent.sent) <= 0.02 * sent.sent for n in counts), (counts, sent.sent)

        # `mark status` counts them together and lists the three frontends, one leading.
        shown = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "mark.cli.main"),
            *("--config", str(c.settings(0).data_dir / "mark.yaml"), "status"),
            cwd=ROOT,
            env={**os.environ, "COLUMNS": "250"},
            stdout=asyncio.subprocess.PIPE,
        )
        status = (await shown.communicate())[0].decode()
        assert shown.returncode == 0, status
        assert "frontends (3 live)" in status, status
        assert len(re.findall(r"│ yes\s*│", status)) == 1, status
        rows = re.search(rf"│ {model}\s*│\s*(\d+)\s*│", status)
        assert rows is not None and abs(int(rows.group(1)) - sent.sent) <= 0.02 * sent.sent

        # Only the leader plans: no follower launched anything.
        (leader,) = await c.deciders([0, 1, 2])
        launched = [await c.launches(k) for k in range(3)]
        assert launched[leader] > 0 and sum(launched) == launched[leader], launched
