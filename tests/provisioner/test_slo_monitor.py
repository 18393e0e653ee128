"""§4.4 reactive scaling: launch backups when the last M requests miss the SLO."""

from provisioner.slo_monitor import (
    BackupLaunch,
    SloMonitorConfig,
    SloMonitorState,
    observe_latencies,
    slo_at_risk,
)

CFG = SloMonitorConfig(rt_max_s=0.6, sl_min=0.98, window=100, launch_count=2, holdoff_s=120)


def test_no_launch_while_the_service_level_holds() -> None:
    # 2 misses in 100 = exactly 98 %: still satisfactory.
    action, state = observe_latencies(SloMonitorState(), [0.1] * 98 + [0.9] * 2, 0.0, CFG)
    assert action is None
    assert len(state.outcomes) == 100


def test_no_verdict_before_m_requests() -> None:
    action, state = observe_latencies(SloMonitorState(), [0.9] * 50, 0.0, CFG)
    assert action is None
    assert state.outcomes == (False,) * 50


def test_launches_l_instances_of_type_t_when_too_many_miss() -> None:
    action, state = observe_latencies(SloMonitorState(), [0.1] * 97 + [0.9] * 3, 10.0, CFG)
    assert action == BackupLaunch("c5.large", "on-demand", 2, 0.97)
    assert state.outcomes == ()
    assert state.holdoff_until == 130.0


def test_only_the_last_m_requests_count() -> None:
    _, state = observe_latencies(SloMonitorState(), [0.9] * 50, 0.0, CFG)
    action, _ = observe_latencies(state, [0.1] * 100, 1.0, CFG)
    assert action is None


def test_one_miss_streak_launches_once() -> None:
    action, state = observe_latencies(SloMonitorState(), [0.9] * 100, 0.0, CFG)
    assert action is not None
    # The streak goes on while the backups boot: no second launch...
    for t in range(5, 120, 5):
        again, state = observe_latencies(state, [0.9] * 100, float(t), CFG)
        assert again is None
    # ...and after the hold-off M fresh requests are needed for a new verdict.
    again, state = observe_latencies(state, [0.9] * 60, 125.0, CFG)
    assert again is None
    again, state = observe_latencies(state, [0.9] * 40, 130.0, CFG)
    assert again is not None


def test_the_slo_is_at_risk_from_a_backup_launch_until_the_holdoff_ends() -> None:
    cfg = SloMonitorConfig(rt_max_s=0.1, window=4, holdoff_s=120.0)
    state = SloMonitorState()
    assert slo_at_risk(state, 0.0) is None
    action, state = observe_latencies(state, [0.5, 0.5, 0.01, 0.01], 10.0, cfg)
    assert action is not None
    assert slo_at_risk(state, 129.0) is not None and slo_at_risk(state, 130.0) is None
