"""Spend rails by hand: what fits under the model's and the cluster's $/h."""

from __future__ import annotations

import pytest

from provisioner.spend_rails import Spend, SpendLimits, within_rails

A = ("c5.large", "on-demand")
B = ("c5.xlarge", "on-demand")


@pytest.mark.parametrize(
    ("requests", "spend", "limits", "allowed", "rails"),
    [
        # no limits: everything goes
        ([(A, 5, 0.1)], Spend(9.0, 9.0), SpendLimits(), [(A, 5)], []),
        # model rail: $1.00 - $0.75 leaves room for two at $0.10 (exactly reaching it is fine)
        ([(A, 5, 0.1)], Spend(0.8, 0.8), SpendLimits(per_model=1.0), [(A, 2)], ["model"]),
        # cluster rail is the tighter one
        ([(A, 5, 0.1)], Spend(0.0, 1.75), SpendLimits(1.0, 2.0), [(A, 2)], ["cluster"]),
        # both cut: the model rail first, then the cluster one below it
        ([(A, 5, 0.1)], Spend(0.7, 1.85), SpendLimits(1.0, 2.0), [(A, 1)], ["model", "cluster"]),
        # an expensive request cut to nothing does not stop a cheaper one after it
        ([(B, 2, 0.5), (A, 3, 0.1)], Spend(0.6, 0.6), SpendLimits(1.0), [(A, 3)], ["model"]),
        # already over the rail (prices rose): nothing more
        ([(A, 1, 0.1)], Spend(1.2, 1.2), SpendLimits(1.0), [], ["model"]),
    ],
)
def test_within_rails(
    requests: list[tuple[tuple[str, str], int, float]],
    spend: Spend,
    limits: SpendLimits,
    allowed: list[tuple[tuple[str, str], int]],
    rails: list[str],
) -> None:
    got, hits, after = within_rails(requests, spend, limits)
    assert got == allowed
    assert [h.rail for h in hits] == rails
    added = sum(n * p for k, n in got for k2, _, p in requests if k2 == k)
    assert after.model == pytest.approx(spend.model + added)
    assert after.cluster == pytest.approx(spend.cluster + added)
    if limits.per_model is not None:
        assert after.model <= max(limits.per_model, spend.model) + 1e-9
    for h in hits:
        assert "spend rail" in h.explain() and h.allowed < h.wanted
