"""The §4.3 batching tuner, on the paper's published p2.xlarge numbers and on curves."""

import pytest

from provisioner.batching import tune_batching
from provisioner.profiles import load_paper_profiles

RT_MAX_INCEPTION = 0.6


def p2_inception_curve() -> dict[int, float]:
    profile = load_paper_profiles()["tf"]
    assert profile.rt_max_s == RT_MAX_INCEPTION
    return profile.instance("p2.xlarge").batch_latency_s()


def test_published_p2_profile_is_one_point_at_batch_8() -> None:
    # 415 batches/min of 8 (code: AllCapacity = 415 * HANDLE_SIZE = 3320 r/m).
    assert p2_inception_curve() == {8: pytest.approx(60 / 415)}


def test_published_profile_alone_lacks_the_no_batching_rate() -> None:
    # Neither the paper nor its code publishes T_1 on p2.xlarge, so mu*_nb is unknown.
    with pytest.raises(ValueError, match="mu_nb"):
        tune_batching(p2_inception_curve(), RT_MAX_INCEPTION)


def test_paper_p2_numbers_reproduce_n8_w200_when_t1_is_43ms() -> None:
    """What our tuner finds on the published profile, and why it differs.

    N_batch = 8 always (when batching helps at all): 8 is the only profiled
    size, and the tuner never grows b past a size it has no T_b for.
    W_batch = min(RT_max, 8 T_1) - T_8 depends on T_1, which was not published.
    The paper's 200 ms is exactly the throughput constraint made tight with
    T_1 = (200 ms + T_8) / 8 = 43.1 ms, a plausible K80 batch-1 Inception-v3
    latency; with T_1 >= 75 ms the SLO constraint binds: W_batch = RT_max - 2 T_8
    = 311 ms with our one batch of slack (455 ms by the paper's rule alone).
    mu* = 8 / T_8 = 55.3 r/s = 3320 r/m, the code's profiled capacity.
    """
    t8 = 60 / 415
    t1 = (0.2 + t8) / 8
    config = tune_batching(p2_inception_curve(), RT_MAX_INCEPTION, mu_nb=1 / t1)
    assert config.n_batch == 8
    assert config.w_batch_s == pytest.approx(0.200)
    assert config.mu_star * 60 == pytest.approx(3320)

    slow = tune_batching(p2_inception_curve(), RT_MAX_INCEPTION, mu_nb=1 / 0.1)
    assert slow.n_batch == 8
    assert slow.w_batch_s == pytest.approx(RT_MAX_INCEPTION - 2 * t8)
    paper = tune_batching(p2_inception_curve(), RT_MAX_INCEPTION, mu_nb=1 / 0.1, slack_batches=0)
    assert paper.w_batch_s == pytest.approx(RT_MAX_INCEPTION - t8)


def test_no_batching_when_batch_is_slower_than_sequential() -> None:
    # T_8 = 144.6 ms > 8 x 15 ms: one at a time is faster, so N_batch = 1.
    config = tune_batching(p2_inception_curve(), RT_MAX_INCEPTION, mu_nb=1 / 0.015)
    assert (config.n_batch, config.w_batch_s) == (1, 0.0)
    assert config.mu_star == pytest.approx(1 / 0.015)


def affine_curve(max_b: int) -> dict[int, float]:
    return {b: 0.030 + 0.0145 * b for b in range(1, max_b + 1)}


def test_paper_rule_alone_ends_with_a_window_too_short_to_fill() -> None:
    config = tune_batching(affine_curve(64), 0.6, require_fill=False, slack_batches=0)
    # Stops only where T_b itself exceeds RT_max: b = 39, W = 4.5 ms.
    assert config.n_batch == 39
    assert config.w_batch_s == pytest.approx(0.6 - (0.030 + 0.0145 * 39))


def test_fill_condition_stops_where_the_batch_can_still_fill() -> None:
    config = tune_batching(affine_curve(64), 0.6)
    n, w = config.n_batch, config.w_batch_s
    t_n = 0.030 + 0.0145 * n
    assert w + t_n <= 0.6
    assert w >= (n - 1) * t_n / n
    failed = config.steps[-1]
    assert failed.batch == n + 1 and not failed.fills_in_window
    assert 10 < n < 39


def test_t1_above_rt_max_is_an_error() -> None:
    with pytest.raises(ValueError, match="RT_max"):
        tune_batching({1: 0.7}, 0.6)
