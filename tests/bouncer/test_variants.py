"""The per-batch variant rule: the accurate variant in lulls, a faster one when the batch
would otherwise miss, never below the delivered floor; pins and per-request floors."""

from __future__ import annotations

import pytest

from bouncer.latency import BatchLatency
from bouncer.variants import AccuracyLedger, Variant, choose_variant, fallback_for

LARGE = Variant("large", 0.80, BatchLatency.from_mapping({1: 0.10, 4: 0.25}))
SMALL = Variant("small", 0.70, BatchLatency.from_mapping({1: 0.03, 4: 0.06}))
BOTH = (LARGE, SMALL)


def test_an_idle_instance_serves_the_accurate_variant() -> None:
    led = AccuracyLedger()
    assert choose_variant(0.0, 0.0, [0.5], BOTH, led, 0.75) is LARGE


def test_a_batch_that_would_miss_moves_to_the_faster_variant_within_the_floor() -> None:
    led = AccuracyLedger()
    led.served(0.0, 0.80, 10)
    # Busy until 0.2: LARGE would finish at 0.3 > 0.25, SMALL at 0.23.
    assert choose_variant(0.1, 0.2, [0.25], BOTH, led, 0.75) is SMALL
    # Delivered 0.8 over 10; four more at 0.70 make 0.771 ≥ 0.75.
    assert choose_variant(0.1, 0.2, [0.25] * 4, BOTH, led, 0.75).name == "large"  # 0.26 late too
    assert choose_variant(0.1, 0.2, [0.3] * 4, BOTH, led, 0.75) is SMALL


def test_the_floor_holds_the_accurate_variant_once_the_window_is_spent() -> None:
    led = AccuracyLedger()
    led.served(0.0, 0.80, 5)
    led.served(0.0, 0.70, 5)  # delivered 0.75: nothing left to spend
    assert choose_variant(0.1, 0.2, [0.25], BOTH, led, 0.75) is LARGE  # it will spill
    assert led.delivered(0.1) == pytest.approx(0.75)


def test_the_window_forgets_what_it_delivered_long_ago() -> None:
    led = AccuracyLedger(window_s=60.0)
    led.served(0.0, 0.70, 100)
    assert led.delivered(30.0) == pytest.approx(0.70)
    led.served(100.0, 0.80, 1)
    assert led.delivered(100.0) == pytest.approx(0.80)  # the first bucket is out
    assert AccuracyLedger().delivered(0.0) is None


def test_a_pin_is_obeyed_and_a_request_floor_rules_out_less_accurate_variants() -> None:
    led = AccuracyLedger()
    assert choose_variant(0.0, 0.0, [0.5], BOTH, led, 0.75, pinned="small") is SMALL
    assert choose_variant(0.1, 0.2, [0.25], BOTH, led, 0.0, request_floor=0.78) is LARGE


def test_with_one_variant_the_rule_changes_nothing() -> None:
    led = AccuracyLedger()
    assert choose_variant(0.1, 5.0, [0.2], (LARGE,), led, 0.0) is LARGE


def test_the_fallback_is_the_most_accurate_faster_variant_the_floor_allows() -> None:
    led = AccuracyLedger()
    led.served(0.0, 0.80, 10)
    assert fallback_for(0.0, LARGE, BOTH, led, 0.75, 1) is SMALL
    assert fallback_for(0.0, SMALL, BOTH, led, 0.75, 1) is None  # nothing faster
    assert fallback_for(0.0, LARGE, BOTH, AccuracyLedger(), 0.75, 1) is None  # floor spent
    assert fallback_for(0.0, LARGE, BOTH, led, 0.75, 1, request_floor=0.78) is None
