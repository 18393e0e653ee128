"""The baseline's instance capacity: the same numbers the controller plans with.

The daemon measures each model's batch latency on this machine when it starts,
stretches it to each instance type (the local world's slowdown) and asks
``build_options`` for the rate one instance sustains within the SLO. The
report does the same, from the profile ``mark profile`` saved when there is
one, else by measuring now; ``--baseline-rps`` overrides both.
"""

from __future__ import annotations

import json
from pathlib import Path

from bouncer.latency import BatchLatency
from mark.catalog import Catalog, Market
from mark.config import ModelSpec, Settings
from mark.control import build_options
from provisioner.options import DEFAULT_BOOT_S

LOCAL_AGENT_START_S = 5.0
"""What the daemon adds to ``local.boot_delay_s`` for an agent to load its model."""


class NoCapacity(Exception):
    """No capacity figure for this model and type; the message says why and what to do."""


def boot_s(settings: Settings) -> float:
    """Launch to serving, as the controller assumes it in this world."""
    if settings.world == "local":
        return settings.local.boot_delay_s + LOCAL_AGENT_START_S
    return DEFAULT_BOOT_S


def profile_path(settings: Settings, spec: ModelSpec) -> Path:
    return settings.data_dir / "profiles" / f"{spec.name}.json"


def _saved_latency(path: Path) -> BatchLatency | None:
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
        return BatchLatency.from_mapping(
            {int(b): float(t) for b, t in raw["batch_latency_s"].items()}
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise NoCapacity(f"cannot read the saved profile {path}: {exc}") from None


def _measured_latency(settings: Settings, spec: ModelSpec) -> BatchLatency:
    from bouncer.runner import ModelLoadError
    from mark.control import measure_latency
    from mark.demo import DEMO_SOURCE, default_model_path

    source = spec.source
    if source == DEMO_SOURCE:
        path = default_model_path(settings.data_dir)
        if not path.is_file():
            raise NoCapacity(
                f"the demo model is not built in {settings.data_dir}; run `mark demo build`, "
                "`mark profile`, or pass --baseline-rps"
            )
        source = str(path)
    try:
        return measure_latency(source, spec)
    except ModelLoadError as exc:
        raise NoCapacity(
            f"cannot load {spec.name} to measure it ({exc}); run `mark profile` on a machine "
            "that can, or pass --baseline-rps"
        ) from None


def baseline_capacity(
    settings: Settings, spec: ModelSpec, instance_type: str, catalog: Catalog
) -> tuple[float, str]:
    """(requests/s one instance of the type sustains within the SLO, where it came from)."""
    saved = profile_path(settings, spec)
    latency = _saved_latency(saved)
    source = f"saved profile {saved.name}"
    if latency is None:
        latency = _measured_latency(settings, spec)
        source = "measured on this machine"
    if settings.world == "local":
        from mark.cloud.local.agents import default_slowdown

        factor = default_slowdown(catalog, settings.local.slowdown)(instance_type)
        latency = latency.scaled(factor)
        source += f", ×{factor:g} for {instance_type}"
    options = build_options(
        spec,
        catalog,
        [instance_type],
        [Market.ON_DEMAND],
        {instance_type: latency},
        boot_s(settings),
    )
    if not options:
        raise NoCapacity(
            f"{instance_type} cannot serve {spec.name} within RT_max {spec.slo.rt_max_ms:g} ms; "
            "choose another --baseline-type"
        )
    return options[0].capacity_rps, source
