"""Profiles and prices into planner options."""

import pytest

from provisioner.batching import tune_batching
from provisioner.greedy import plan_greedy
from provisioner.options import planner_option
from provisioner.perf_model import InstancePerf
from provisioner.profiles import load_paper_profiles


def test_paper_profiles_become_options_the_planner_can_compare() -> None:
    tf = load_paper_profiles()["tf"]
    c5 = tf.instance("c5.large")
    p2 = tf.instance("p2.xlarge")
    t8 = p2.batch_time_s
    config = tune_batching(p2.batch_latency_s(), tf.rt_max_s, mu_nb=8 / (0.2 + t8))
    rt, sl = tf.rt_max_s, tf.sl_min
    cpu = planner_option(
        "c5.large",
        "on-demand",
        0.085,
        InstancePerf(c5.batch_time_s),
        rt_max_s=rt,
        sl_min=sl,
        boot_s=60,
    )
    gpu = planner_option(
        "p2.xlarge",
        "on-demand",
        0.90,
        InstancePerf(t8, batch_size=config.n_batch, window_s=config.w_batch_s),
        rt_max_s=rt,
        sl_min=sl,
    )
    assert cpu.launch_overhead == pytest.approx(0.085 / 60)
    assert cpu.capacity_rps < c5.capacity_rps < gpu.capacity_rps < p2.capacity_rps
    # Steady 200 r/s for an hour: the GPU's cost per request wins.
    plan = plan_greedy([200.0] * 60, [], [cpu, gpu], slo_s=tf.rt_max_s)
    assert set(plan.launches()) == {("p2.xlarge", "on-demand")}
