"""`planner.explore_unprofiled`: on by default (one exploring instance at a time), listed by
`mark config show`, validated with a message that names the setting, and carried into the
control loop's config."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mark.catalog import load_catalog
from mark.config import dump_settings, load_settings
from mark.control.snapshot import explore_candidates, explore_config
from mark.errors import ConfigError
from provisioner.explore_step import Candidate, ExploreConfig


def test_on_by_default_and_shown() -> None:
    settings = load_settings()
    assert dump_settings(settings)["planner"] == {
        "explore_unprofiled": {"max_concurrent": 1, "interval_s": 3600.0},
        "pooled_capacity": "auto",
        "rise_miss_share": 0.75,
        "rise_by_misses": True,
        "spill_capacity_target": True,
    }
    assert explore_config(settings) == ExploreConfig(1, 3600.0)
    off = load_settings(overrides={"planner": {"explore_unprofiled": {"max_concurrent": 0}}})
    assert explore_config(off).max_concurrent == 0


def test_set_and_carried_into_the_control_loop() -> None:
    settings = load_settings(
        overrides={
            "planner": {"explore_unprofiled": {"max_concurrent": 2, "interval_s": 900}},
            "offerings": {"types": ["c5.large", "inf1.xlarge"], "markets": ["on-demand", "spot"]},
        }
    )
    assert explore_config(settings) == ExploreConfig(2, 900.0)
    catalog = load_catalog()
    got = explore_candidates(settings, catalog)
    assert (
        Candidate("inf1.xlarge", "on-demand", "inferentia", catalog.on_demand["inf1.xlarge"]) in got
    )
    assert {(c.instance_type, c.market) for c in got} == {
        (t, m) for t in ("c5.large", "inf1.xlarge") for m in ("on-demand", "spot")
    }


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"max_concurrent": -1}, "planner.explore_unprofiled.max_concurrent = -1"),
        ({"max_concurrent": "two"}, "planner.explore_unprofiled.max_concurrent = 'two'"),
        ({"interval_s": 0}, "planner.explore_unprofiled.interval_s = 0"),
        ({"every_s": 60}, "planner.explore_unprofiled.every_s: unknown setting"),
    ],
)
def test_bad_values_fail_with_the_setting_named(override: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match="invalid configuration") as err:
        load_settings(overrides={"planner": {"explore_unprofiled": override}})
    assert message in str(err.value)


def test_config_show_lists_it_and_rejects_a_bad_value() -> None:
    cli = [sys.executable, "-m", "mark.cli.main"]
    out = subprocess.run(
        [*cli, "--set", "planner.explore_unprofiled.max_concurrent=1", "config", "show"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "explore_unprofiled:\n    max_concurrent: 1\n    interval_s: 3600.0" in out.stdout
    bad = subprocess.run(
        [*cli, "--set", "planner.explore_unprofiled.max_concurrent=-1", "config", "show"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2
    assert "planner.explore_unprofiled.max_concurrent = -1" in bad.stderr
