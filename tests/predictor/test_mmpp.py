"""The MMPP generator is seeded and bursty."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.mmpp import Mmpp, mmpp_history


def test_same_seed_same_load_other_seed_other_load() -> None:
    a = mmpp_history(0.1, seed=3)
    b = mmpp_history(0.1, seed=3)
    c = mmpp_history(0.1, seed=4)
    np.testing.assert_array_equal(a.values, b.values)
    assert not np.array_equal(a.values, c.values)
    assert len(a) == 144


def test_one_state_is_plain_poisson() -> None:
    counts = Mmpp(rates=(5.0,), mean_sojourn=(10.0,), jumps=((1.0,),)).counts(50_000, seed=1)
    assert counts.mean() == pytest.approx(5.0, rel=0.03)
    assert counts.var() == pytest.approx(5.0, rel=0.1)


def test_default_visits_every_state() -> None:
    model = Mmpp()
    path = model.state_path(3 * 86400, np.random.default_rng(0))
    assert set(np.unique(path)) == {0, 1, 2}
    h = mmpp_history(1.0, seed=0)
    # Bursty: the busiest minutes are several times the calm ones.
    assert np.percentile(h.values, 99) > 3 * np.percentile(h.values, 10)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rates": (1.0, 2.0)},
        {"rates": (-1.0, 2.0, 3.0)},
        {"jumps": ((0.0, 0.5, 0.4), (0.7, 0.0, 0.3), (0.5, 0.5, 0.0))},
        {"jumps": ((0.2, 0.6, 0.2), (0.7, 0.0, 0.3), (0.5, 0.5, 0.0))},
    ],
)
def test_invalid_chains_are_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Mmpp(**kwargs)  # type: ignore[arg-type]
