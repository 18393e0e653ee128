"""Configuration: layering of sources and one-line, field-naming errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from mark.catalog import Market
from mark.config import load_settings, parse_overrides
from mark.errors import ConfigError


def test_defaults_are_the_papers_timings_and_a_sqlite_file(tmp_path: Path) -> None:
    s = load_settings()
    t = s.timings
    assert (t.update_period_s, t.window_steps, t.sample_window_s, t.lead_time_s) == (
        60,
        60,
        5,
        None,
    )
    assert s.world == "local"
    assert s.db_url == f"sqlite+aiosqlite:///{tmp_path / 'data' / 'mark.db'}"


@pytest.mark.parametrize(
    ("lead_time_s", "boot_s", "steps"),
    [
        (None, 120.0, 2),
        (None, 90.0, 2),
        (None, 60.0, 1),
        (None, 5.0, 1),
        (None, 7200.0, 59),  # within the 60-step forecast
        (300.0, 120.0, 5),
    ],
)
def test_lead_time_is_the_boot_time_rounded_up_to_steps_unless_set(
    lead_time_s: float | None, boot_s: float, steps: int
) -> None:
    s = load_settings(overrides={"timings": {"lead_time_s": lead_time_s}})
    assert s.timings.lead_steps(boot_s) == steps


def test_sources_layer_yaml_then_env_then_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "mark.yaml"
    cfg.write_text(
        "world: sim\n"
        "timings: {cooldown_s: 100, lead_time_s: 120}\n"
        "offerings: {types: [c5.large, g4dn.xlarge], markets: [on-demand, spot]}\n"
        "models:\n"
        "  - name: resnet\n"
        "    source: /models/resnet.pt\n"
        "    input: {shape: [3, 224, 224]}\n"
        "    slo: {rt_max_ms: 600, sl_min: 0.98}\n"
    )
    monkeypatch.setenv("MARK_TIMINGS__COOLDOWN_S", "200")
    s = load_settings(cfg, parse_overrides(["timings.lead_time_s=60", "api.port=9000"]))
    assert s.world == "sim"  # yaml
    assert s.timings.cooldown_s == 200  # env beats yaml
    assert s.timings.lead_time_s == 60  # --set beats yaml
    assert s.api.port == 9000
    assert s.offerings.markets == (Market.ON_DEMAND, Market.SPOT)
    (m,) = s.models
    assert (m.name, m.input_tensor.shape, m.slo.rt_max_ms, m.model_format) == (
        "resnet",
        (3, 224, 224),
        600,
        "torchscript",
    )


def _one_line(exc: pytest.ExceptionInfo[ConfigError]) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_sl_min_above_one_names_the_field_value_and_bound() -> None:
    bad = [
        {
            "name": "x",
            "source": "m.pt",
            "input": {"shape": [3]},
            "slo": {"rt_max_ms": 100, "sl_min": 1.5},
        }
    ]
    with pytest.raises(ConfigError) as exc:
        load_settings(overrides={"models": bad})
    text = _one_line(exc)
    assert "models[0].slo.sl_min = 1.5" in text and "less than or equal to 1" in text


def test_the_slo_period_defaults_to_a_day_and_refuses_less_than_a_minute() -> None:
    def model(slo: dict[str, float]) -> list[dict[str, object]]:
        return [{"name": "x", "source": "m.pt", "input": {"shape": [3]}, "slo": slo}]

    base = {"rt_max_ms": 100.0, "sl_min": 0.98}
    spec = load_settings(overrides={"models": model(base)}).models[0]
    assert spec.slo.period_s == 86_400.0
    hourly = load_settings(overrides={"models": model({**base, "period_s": 3600.0})})
    assert hourly.models[0].slo.period_s == 3600.0
    with pytest.raises(ConfigError) as exc:
        load_settings(overrides={"models": model({**base, "period_s": 5.0})})
    text = _one_line(exc)
    assert "models[0].slo.period_s = 5.0" in text and "greater than or equal to 60" in text


def test_unknown_instance_type_lists_allowed_types() -> None:
    with pytest.raises(ConfigError) as exc:
        load_settings(overrides=parse_overrides(["offerings.types=[c5.large, c5.huge]"]))
    text = _one_line(exc)
    assert "offerings.types" in text and "'c5.huge'" in text and "c5.xlarge" in text


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["world=moon"], "world = 'moon': Input should be 'sim', 'local' or 'aws'"),
        (["offerings.standby_types=[c5.large]"], "not burstable; allowed: "),
        (["timings.lead_time_s=4000"], "must be shorter than the forecast horizon"),
        (["database_url=mysql://x"], "allowed: sqlite:///PATH or postgresql://"),
        (["slo_monitor.last_m=0"], "slo_monitor.last_m = 0"),
        (["colour=blue"], "colour: unknown setting"),
        (["aws.region=mars"], "aws.region = 'mars'"),
        (["local.slowdown={c5.large: 0.5}"], "allowed: 1 or more"),
        (["planner.persisting_floor=true"], "delete the setting"),
    ],
)
def test_bad_values_are_one_readable_line(overrides: list[str], expected: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_settings(overrides=parse_overrides(overrides))
    assert expected in _one_line(exc)


def test_env_var_errors_name_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MARK_API__PORT", "70000")
    with pytest.raises(
        ConfigError, match=r"api\.port = '?70000'?: Input should be less than or equal to 65535"
    ):
        load_settings()


def test_duplicate_model_names_are_refused() -> None:
    m = {
        "name": "a",
        "source": "x.pt",
        "input": {"shape": [1]},
        "slo": {"rt_max_ms": 5, "sl_min": 0.9},
    }
    with pytest.raises(ConfigError, match="repeated: a"):
        load_settings(overrides={"models": [m, m]})


def test_yaml_file_problems_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("world: [sim\n")
    with pytest.raises(ConfigError, match="not valid YAML at line"):
        load_settings(broken)
    listy = tmp_path / "list.yaml"
    listy.write_text("- world\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_settings(listy)


def test_overrides_parse_yaml_values_and_reject_garbage() -> None:
    assert parse_overrides(["a.b=3", "a.c=[x, y]", "d=true"]) == {
        "a": {"b": 3, "c": ["x", "y"]},
        "d": True,
    }
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_overrides(["novalue"])
    with pytest.raises(ConfigError, match="conflicts"):
        parse_overrides(["a=1", "a.b=2"])


def test_postgres_urls_get_the_async_driver() -> None:
    s = load_settings(overrides={"database_url": "postgresql://u@h:5432/db"})
    assert s.db_url == "postgresql+asyncpg://u@h:5432/db"


def test_the_cooldown_defaults_to_the_boot_time_and_a_setting_overrides_it() -> None:
    from mark.config import Timings

    assert Timings().cooldown(120.0) == 120.0  # ski rental: idle as long as a relaunch costs
    assert Timings(cooldown_s=30).cooldown(120.0) == 30.0
    assert Timings(cooldown_s=0).cooldown(120.0) == 0.0


def test_the_rise_miss_share_is_a_share_of_the_models_own_allowance() -> None:
    from mark.control.snapshot import step_config

    def share(value: float | None) -> float:
        over = {"planner": {"rise_miss_share": value}} if value is not None else {}
        s = load_settings(overrides=over)
        spec = s.models[0]
        cfg = step_config(
            s,
            spec,
            boot_s=120.0,
            price=lambda _t, _m: 0.1,
            standby_capacity_rps=0.0,
            standby_loss_fraction=0.25,
            unavailable_ttl_s=600.0,
        )
        return cfg.rise_miss_share / (1.0 - spec.slo.sl_min)

    assert share(None) == pytest.approx(0.75)  # a quarter held back (not the decline share)
    assert share(0.0) == 0.0  # the worst rise
    assert share(0.5) == pytest.approx(0.5)
    with pytest.raises(ConfigError, match="rise_miss_share"):
        load_settings(overrides={"planner": {"rise_miss_share": 1.5}})
