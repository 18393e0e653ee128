"""The spot interruption rate learned from the notices a cluster sees, by hand."""

from __future__ import annotations

import pytest

from provisioner.interruption_rate import PRIOR_HOURS, InterruptionEvidence
from provisioner.standby_value import interruptions_per_hour

PRIOR = interruptions_per_hour(0.2)  # the Spot Advisor's top bucket, per instance-hour


def test_without_evidence_the_rate_is_the_configured_one() -> None:
    assert PRIOR_HOURS == 730.0
    assert InterruptionEvidence().rate_per_hour(PRIOR) == pytest.approx(0.2 / 730)
    assert InterruptionEvidence().rate_per_hour(-1.0) == 0.0


def test_notices_and_hours_move_the_rate_as_the_gamma_posterior_mean() -> None:
    # 3 notices in 100 spot instance-hours: (0.2 + 3) / (730 + 100)
    seen = InterruptionEvidence().noticed().noticed().noticed()
    seen = InterruptionEvidence(seen.notices, 100.0)
    assert seen.rate_per_hour(PRIOR) == pytest.approx(3.2 / 830)
    # 10,000 quiet spot instance-hours: the prior's 0.2 over 10,730 hours
    quiet = InterruptionEvidence(0.0, 10_000.0)
    assert quiet.rate_per_hour(PRIOR) == pytest.approx(0.2 / 10_730)
    assert quiet.rate_per_hour(PRIOR) < PRIOR < seen.rate_per_hour(PRIOR)


def test_spot_hours_count_from_the_first_step_and_no_longer_than_a_gap() -> None:
    first = InterruptionEvidence().ran(4, 1000.0, 120.0)
    assert first == InterruptionEvidence(0.0, 0.0, counted_at=1000.0)  # nothing before it
    step = first.ran(4, 1060.0, 120.0)
    assert step.spot_hours == pytest.approx(4 * 60 / 3600) and step.counted_at == 1060.0
    # the controller was down for an hour: only a gap's worth counts (no notice was seen)
    back = step.ran(4, 4660.0, 120.0)
    assert back.spot_hours == pytest.approx(step.spot_hours + 4 * 120 / 3600)
    # a clock that did not move (or went back) counts nothing
    assert back.ran(9, 4660.0, 120.0) == back and back.ran(9, 4000.0, 120.0) == back
    assert back.noticed().notices == 1.0 and back.noticed().spot_hours == back.spot_hours
