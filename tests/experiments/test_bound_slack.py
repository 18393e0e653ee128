"""``experiments/table5/bound_slack.py``: the cheapest whole fleet of one type by hand, and
a steady hour's row beside its bound."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mark.catalog import load_catalog
from mark.sim.models import paper_model
from provisioner.greedy import PlannerOption

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments" / "table5"))
# A script put on sys.path above, not a package mypy can find: its functions are Any here.
from bound_slack import cheapest_fleet, main, measure  # type: ignore[import-not-found]


def _option(
    itype: str, price: float, alone: float, pool: tuple[tuple[int, float], ...]
) -> PlannerOption:
    return PlannerOption(itype, "on-demand", price, alone, 0.0, 0.1, pool)


# A big type: 10 r/s alone, 12 each in a pool of 2 or more, $1.00. A small one: 1 r/s
# alone, 3 each in a pool of 4 or more (2 in a pool of 2), $0.20.
BIG = _option("big", 1.0, 10.0, ((2, 12.0),))
SMALL = _option("small", 0.2, 1.0, ((2, 2.0), (4, 3.0)))


def test_the_cheapest_fleet_counts_what_a_pool_of_its_size_carries() -> None:
    # 9 r/s: one big ($1.00) against three small (3 x 2.5 = 7.5, short) or four (12 r/s, $0.80).
    fleet = cheapest_fleet([BIG, SMALL], 9.0)
    assert (fleet.instance_type, fleet.count, fleet.per_hour) == ("small", 4, pytest.approx(0.8))
    # 3.5 r/s: two small carry 4 ($0.40); one small alone carries 1.
    fleet = cheapest_fleet([BIG, SMALL], 3.5)
    assert (fleet.instance_type, fleet.count) == ("small", 2)
    # 20 r/s: two big (24 r/s, $2.00) against seven small (21 r/s, $1.40).
    fleet = cheapest_fleet([BIG, SMALL], 20.0)
    assert (fleet.instance_type, fleet.count) == ("small", 7)
    # Without the small type, two big: the pool of 2's figure, not 10 each alone.
    fleet = cheapest_fleet([BIG], 20.0)
    assert (fleet.instance_type, fleet.count) == ("big", 2)


def test_no_fleet_within_the_limit_is_none() -> None:
    assert cheapest_fleet([SMALL], 10_000.0) is None


def test_a_steady_hour_of_a_sparse_model_is_bounded_below_its_fleet() -> None:
    # OpenNMT-ende cannot spill in time, so the presence floor sets its sparse bound.
    row = measure(paper_model("opennmt-ende"), load_catalog(), 0.5, 0.25, 0)
    assert row.set_by == "presence_floor"
    assert 0.0 < row.bound_per_hour < row.fleet.per_hour
    assert row.fluid_per_hour <= row.bound_per_hour * (1 + 1e-6)  # burst rows only add
    assert row.ratio == pytest.approx(row.fleet.per_hour / row.bound_per_hour)


def test_the_script_prints_a_table_and_refuses_bad_rates(
    capsys: pytest.CaptureFixture[str],
) -> None:
    main(["--models", "inception-v3", "--rates", "50", "--hours", "0.1"])
    out = capsys.readouterr().out
    assert "| 50 |" in out and "c5.large" in out
    with pytest.raises(SystemExit):
        main(["--models", "inception-v3", "--rates", "0"])
