"""The load share per variant under an accuracy floor, and the mixed batch latency an
instance is rated at."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bouncer.latency import BatchLatency
from provisioner.variant_mix import VariantCost, mixed_latency, planning_curves, variant_shares

LARGE = VariantCost("large", 0.80, 0.10)
MEDIUM = VariantCost("medium", 0.76, 0.06)
SMALL = VariantCost("small", 0.70, 0.02)


def test_the_floor_binds_between_the_accurate_and_the_fast_variant() -> None:
    shares = variant_shares([LARGE, SMALL], 0.75)
    assert shares == pytest.approx({"large": 0.5, "small": 0.5})
    assert variant_shares([LARGE, SMALL], 0.80) == {"large": 1.0}
    assert variant_shares([LARGE, SMALL], 0.60) == {"small": 1.0}
    assert variant_shares([LARGE, SMALL], 0.95) == {"large": 1.0}  # none reaches it


def test_a_middle_variant_is_used_where_it_lies_on_the_cheaper_side() -> None:
    # At 0.76 the medium alone (0.06 s) beats large+small (2/3·0.1 + 1/3·0.02 = 0.073 s).
    assert variant_shares([LARGE, MEDIUM, SMALL], 0.76) == {"medium": 1.0}


@given(
    accs=st.lists(st.floats(0.5, 0.95), min_size=1, max_size=4),
    times=st.lists(st.floats(0.01, 1.0), min_size=4, max_size=4),
    floor=st.floats(0.5, 0.95),
)
def test_the_shares_meet_the_floor_and_no_mix_of_two_is_faster(
    accs: list[float], times: list[float], floor: float
) -> None:
    vs = [VariantCost(f"v{i}", a, t) for i, (a, t) in enumerate(zip(accs, times, strict=False))]
    shares = variant_shares(vs, floor)
    assert sum(shares.values()) == pytest.approx(1.0)
    by = {v.name: v for v in vs}
    acc = sum(s * by[n].accuracy for n, s in shares.items())
    t = sum(s * by[n].seconds_per_request for n, s in shares.items())
    if max(accs) >= floor:
        assert acc >= floor - 1e-9
        for a, b in itertools.product(vs, repeat=2):  # a grid of two-variant mixes
            for k in range(11):
                s = k / 10
                if s * a.accuracy + (1 - s) * b.accuracy >= floor:
                    assert t <= s * a.seconds_per_request + (1 - s) * b.seconds_per_request + 1e-9


def test_the_mixed_latency_is_the_shares_average_of_the_curves() -> None:
    curves = {
        "large": BatchLatency.from_mapping({1: 0.1, 4: 0.3}),
        "small": BatchLatency.from_mapping({1: 0.02, 2: 0.03}),
    }
    mixed = mixed_latency(curves, {"large": 0.5, "small": 0.5})
    assert [b for b, _ in mixed.points] == [1, 2, 4]
    assert mixed(1) == pytest.approx(0.06)
    assert mixed(4) == pytest.approx(0.5 * 0.3 + 0.5 * curves["small"](4))
    assert mixed_latency(curves, {"large": 1.0}) == BatchLatency(((1, 0.1), (4, 0.3)))


def test_each_type_is_rated_at_the_mix_its_variants_allow() -> None:
    own = {
        "c5.large": BatchLatency.from_mapping({1: 0.2}),
        "c5.xlarge": BatchLatency.from_mapping({1: 0.1}),
    }
    others = {"small": {"c5.large": BatchLatency.from_mapping({1: 0.04})}}
    acc = {"large": 0.8, "small": 0.7}
    curves = planning_curves(own, others, acc, "large", 0.75, rt_max_s=0.5)
    assert curves["c5.large"](1) == pytest.approx(0.5 * 0.2 + 0.5 * 0.04)
    assert curves["c5.xlarge"] == own["c5.xlarge"]  # the small variant not profiled there
    # At the most accurate variant's accuracy the plan is the model's own.
    assert planning_curves(own, others, acc, "large", 0.8, 0.5) == own
