"""A simulated pool batches as ``provisioner.pool_batching`` plans it: a profile flat in the
batch size (NASNet on a p2.xlarge) is served by a few batching instances, not by a fleet
sized for one request at a time."""

from __future__ import annotations

import numpy as np

from bouncer.latency import BatchLatency
from mark.sim.models import SimModel
from mark.sim.policies import POLICIES
from mark.sim.run import SimConfig, Simulation
from mark.sim.workloads import Workload
from provisioner.batching import serving_batching
from provisioner.perf_model import InstancePerf, pooled_capacity
from provisioner.pool_batching import batching_for

EPOCH = 1_700_000_000.0
HISTORY_S = 2 * 3600
FLAT = BatchLatency(((1, 0.632), (8, 0.632), (16, 1.263), (32, 2.526)))


def _model() -> SimModel:
    # Lambda (2.2 s) cannot answer within RT_max: only the instances can.
    return SimModel(
        name="flat",
        rt_max_s=1.0,
        sl_min=0.98,
        latency={"p2.xlarge": FLAT},
        lambda_t1_s=2.2,
        standby_t1_s=0.632,
    )


async def test_a_flat_profile_is_served_by_a_batching_pool() -> None:
    rate, seconds = 15.0, 3600
    per_second = np.full(HISTORY_S + seconds, rate)
    w = Workload("flat", per_second, EPOCH, HISTORY_S, seconds)
    cfg = SimConfig(warmup_s=600)
    arrivals = w.arrivals(int(w.start - cfg.warmup_s), w.end, seed=1)
    sim = Simulation(w, _model(), POLICIES["mark"], cfg, arrivals=arrivals)
    r = await sim.run()
    assert r.within_slo >= 0.98
    # One request per batch, as the alone rule serves, no pool carries more than this
    # per instance: the fleet would need at least rate / that many instances.
    n, wb = serving_batching(FLAT, 1.0)
    alone_best = max(c for _, c in pooled_capacity(InstancePerf(FLAT(n), n, wb), 1.0, 0.98))
    assert r.instance_hours["p2.xlarge"] < 0.5 * rate / alone_best
    # The servers batch as the pool rule says for their number.
    servers = [s for s in sim.world.engine.servers() if s.itype == "p2.xlarge"]
    assert len(servers) >= 2
    assert {(s.n_batch, s.w_batch_s) for s in servers} == {
        batching_for(FLAT, 1.0, 0.98, len(servers))
    }
    assert sum(s.served for s in servers) > 1.5 * sum(s.batches for s in servers)
