"""Each offering is rated from the best profile of its type: measured > shipped > emulated."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import pytest

from bouncer.latency import BatchLatency
from mark.catalog import Catalog, load_catalog
from mark.config import ModelSpec, load_settings
from mark.control.profiles import rate_options
from mark.errors import ConfigError
from mark.profile_files import load_profile_file
from mark.state import ProfileRecord, open_store
from mark.world import World
from provisioner.profile_choice import choose_profiles

PAPER = Path(__file__).resolve().parents[3] / "shared" / "data" / "profiles" / "mark-paper.json"


class RuleWorld:
    """A world that emulates every type at one T_b (the local world's kind), or none (aws)."""

    boot_s = 10.0

    def __init__(self, t1: float | None) -> None:
        self.t1 = t1

    async def emulated_latency(
        self, spec: ModelSpec, source: str, catalog: Catalog, types: Sequence[str]
    ) -> dict[str, BatchLatency]:
        if self.t1 is None:
            return {}
        return {t: BatchLatency.from_mapping({1: self.t1, 8: 4 * self.t1}) for t in types}


def rule_world(t1: float | None) -> World:
    """A ``RuleWorld`` as the ``World`` ``rate_options`` takes: it reads only ``boot_s``
    and ``emulated_latency``, all a RuleWorld has."""
    return cast(World, RuleWorld(t1))


def test_precedence_is_measured_then_shipped_then_emulated() -> None:
    got = choose_profiles(
        ["a", "b", "c", "d"],
        {
            ("a", "emulated"): 1,
            ("a", "measured"): 2,
            ("a", "shipped"): 3,
            ("b", "shipped"): 4,
            ("b", "emulated"): 5,
            ("c", "emulated"): 6,
        },
    )
    assert got == {"a": (2, "measured"), "b": (4, "shipped"), "c": (6, "emulated")}


async def test_aws_rates_only_from_measured_or_shipped_profiles(tmp_path: Path) -> None:
    shipped = tmp_path / "p.json"
    shipped.write_text(
        json.dumps(
            {"model": "digits", "instance_type": "c5.xlarge", "batch_latency_s": {"1": 0.01}}
        )
    )
    settings = load_settings(
        overrides={"offerings": {"types": ["c5.large", "c5.xlarge", "m5.large"]}}
    )
    spec = settings.models[0].model_copy(update={"profile": shipped})
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    try:
        await store.put_profile(
            ProfileRecord("digits", "c5.large", "measured", ((1, 0.004), (8, 0.012)), 1.0)
        )
        rated = await rate_options(
            settings, spec, rule_world(None), store, "unused", load_catalog()
        )
        assert rated.sources == {"c5.large": "measured", "c5.xlarge": "shipped"}
        assert {o.instance_type for o in rated.options} == {"c5.large", "c5.xlarge"}  # not m5
        assert rated.standby_capacity_rps == 0.0  # t3.large has no profile: no standby
        local = await rate_options(
            settings, spec, rule_world(0.002), store, "unused", load_catalog()
        )
        # inf1 needs a compiled Neuron artifact: without one it is not rated, even emulated
        inf = settings.model_copy(
            update={
                "offerings": settings.offerings.model_copy(
                    update={"types": ("c5.large", "inf1.xlarge")}
                )
            }
        )
        plain = await rate_options(inf, spec, rule_world(0.002), store, "u", load_catalog())
        assert "inf1.xlarge" not in plain.sources
        neuron = spec.model_copy(update={"neuron_artifact": "/models/digits.neuron.pt"})
        compiled = await rate_options(inf, neuron, rule_world(0.002), store, "u", load_catalog())
        assert compiled.sources["inf1.xlarge"] == "emulated"
        assert local.sources["m5.large"] == "emulated"
        assert local.sources["c5.large"] == "measured" and local.standby_capacity_rps > 0
    finally:
        await store.close()


def test_profile_files_in_both_formats_and_clear_errors(tmp_path: Path) -> None:
    if PAPER.is_file():
        tf = load_profile_file(PAPER, "inception-v3")  # by name; "tf" (its key) works too
        assert tf == load_profile_file(PAPER, "tf")
        # 415 batches of 8 a minute on p2.xlarge, 490 requests a minute on c5.xlarge
        assert tf["p2.xlarge"](8) == pytest.approx(60 / 415)
        assert tf["c5.xlarge"](1) == pytest.approx(60 / 490)
    listed = tmp_path / "many.json"
    listed.write_text(
        json.dumps(
            {
                "profiles": [
                    {"model": "a", "instance_type": "c5.large", "batch_latency_s": {"1": 0.1}},
                    {"model": "b", "instance_type": "c5.large", "batch_latency_s": {"1": 0.2}},
                ]
            }
        )
    )
    assert load_profile_file(listed, "b")["c5.large"](1) == 0.2
    with pytest.raises(ConfigError, match="no profile for model 'z'"):
        load_profile_file(listed, "z")
    bad = tmp_path / "bad.json"
    bad.write_text('{"instance_type": "c5.large", "batch_latency_s": {"1": -1}}')
    with pytest.raises(ConfigError, match="not the format"):
        load_profile_file(bad, "a")
    with pytest.raises(ConfigError, match="profile file"):
        load_profile_file(tmp_path / "missing.json", "a")


def test_health_tracker_reports_ready_and_failing_transitions() -> None:
    from mark.control.health import HealthTracker

    h = HealthTracker()
    assert h.view() is None  # nothing observed yet: no verdict possible
    assert h.observe(10.0, ["a", "b"], []) == ([], [])  # booting
    assert h.observe(11.0, ["a", "b"], ["a"]) == (["a"], [])
    assert h.observe(12.0, ["a", "b"], ["b"]) == (["b"], ["a"])  # a stops answering
    assert h.observe(13.0, ["a", "b"], ["a", "b"]) == (["a"], [])  # a is back
    facts, since = h.view() or ({}, 0.0)
    assert since == 10.0 and facts["a"].ready_since == 11.0 and facts["a"].failing_since is None
    h.observe(14.0, ["b"], ["b"])
    assert "a" not in (h.view() or ({}, 0.0))[0]  # gone from the fleet: forgotten
