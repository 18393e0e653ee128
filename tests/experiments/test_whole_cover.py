"""``experiments/table5/whole_cover.py``'s arithmetic by hand-computed cases: the
cheapest whole cover of each slot, and the miss budget spent by a Lagrange dual."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments" / "table5"))
# A script put on sys.path above, not a package mypy can find: its functions are Any here.
from whole_cover import whole_costs, with_budget  # type: ignore[import-not-found]

# Per slot: a big offering serves 10 requests for $1.00, a small one 3 for $0.40.
OFFERS = [("big", 10.0, 1.0), ("small", 3.0, 0.4)]


def test_the_whole_cover_is_the_cheapest_mix_of_whole_instances() -> None:
    best = whole_costs(np.array([16]), OFFERS)
    by_hand = [0.0, 0.4, 0.4, 0.4, 0.8, 0.8, 0.8, 1.0, 1.0, 1.0, 1.0]  # 7: one big, not 3 small
    by_hand += [1.4, 1.4, 1.4, 1.8, 1.8, 1.8]  # 11-13: big + small; 14-16: big + 2 small
    assert best[:17] == pytest.approx(by_hand)


def test_the_budget_is_spent_where_it_saves_most() -> None:
    counts = np.array([10, 1])
    best = whole_costs(counts, OFFERS)

    def whole(k: np.ndarray) -> np.ndarray:
        cost: np.ndarray = best[k]
        return cost

    # No miss: $1.00 + $0.40. One miss: the lone request, not one of the ten ($1.00).
    assert with_budget(counts, whole, 0, 1.0) == pytest.approx(1.4)
    assert with_budget(counts, whole, 1, 1.0) == pytest.approx(1.0)
    # Fractions at $0.10 a request: each miss saves $0.10.
    assert with_budget(counts, lambda k: k * 0.1, 3, 1.0) == pytest.approx(0.8)
