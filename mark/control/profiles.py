"""The planner's options for a model, rated from the best profile of each type.

Measured on the type (stored by the daemon when an agent reports it) beats a
profile shipped in the model spec, which beats the local world's emulated
rule (``provisioner.profile_choice``); a type with none is not planned (until
exploration measures it, ``provisioner.explore_step``), nor a type whose
accelerator the model cannot use (``provisioner.accelerators``). A shipped
profile rates only the types it names: one labelled ``local`` rates nothing,
which is logged with how to get a usable one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from bouncer.latency import BatchLatency
from mark.catalog import Catalog, Market
from mark.config import ModelSpec, Settings
from mark.control.setup import build_options
from mark.errors import ConfigError
from mark.ports import Store
from mark.profile_files import load_profile_file, unrated_entries, unusable_profile_warning
from mark.world import World
from provisioner.accelerators import usable
from provisioner.greedy import PlannerOption
from provisioner.profile_choice import choose_profiles, unrated
from provisioner.variant_mix import planning_curves

log = logging.getLogger("mark.control")


@dataclass(frozen=True)
class RatedOptions:
    options: list[PlannerOption]
    standby_capacity_rps: float
    sources: dict[str, str]
    """Instance type → where its profile came from (measured, shipped, emulated)."""


def variant_profiles(spec: ModelSpec) -> dict[str, dict[str, BatchLatency]]:
    """The shipped profile of each of the model's other variants, per instance type (its
    ``profile`` file's entries for the variant's name, else for the model's)."""
    out: dict[str, dict[str, BatchLatency]] = {}
    for v in spec.variants[1:]:
        if v.profile is None:
            continue
        try:
            out[v.name] = load_profile_file(v.profile, v.name)
        except ConfigError:
            out[v.name] = load_profile_file(v.profile, spec.name)
    return out


async def rate_options(
    settings: Settings,
    spec: ModelSpec,
    world: World,
    store: Store,
    source: str,
    catalog: Catalog,
) -> RatedOptions:
    types: Sequence[str] = [*settings.offerings.types, *settings.offerings.standby_types]
    available: dict[tuple[str, str], BatchLatency] = {
        (t, "emulated"): lat
        for t, lat in (await world.emulated_latency(spec, source, catalog, types)).items()
    }
    if spec.profile is not None:
        shipped = load_profile_file(spec.profile, spec.name)
        stray = unrated_entries(shipped, catalog.types)
        if stray:  # e.g. "local": `mark profile` on a laptop rates no instance type
            log.warning("%s", unusable_profile_warning(spec.profile, spec.name, stray))
        for t, lat in shipped.items():
            available[(t, "shipped")] = lat
    for p in await store.profiles(spec.name):
        if p.source == "measured":
            available[(p.instance_type, "measured")] = BatchLatency(p.batch_latency_s)
    cannot: set[str] = set()
    for t in types:  # a type whose accelerator the model cannot use is not rated
        itype = catalog.types.get(t)
        ok, why = usable(
            itype.accelerator.value if itype else "cpu", spec.neuron_artifact is not None
        )
        if not ok:
            log.info("%s: %s not planned: %s", spec.name, t, why)
            available = {k: v for k, v in available.items() if k[0] != t}
            cannot.add(t)
    chosen = choose_profiles(types, available)
    # A type the model cannot run on is not waiting for a profile: no measurement helps.
    missing = [t for t in unrated(list(settings.offerings.types), chosen) if t not in cannot]
    if missing:
        log.warning(
            "%s: no measured or shipped profile for %s: not planned until one is measured "
            "(exploration, planner.explore_unprofiled, or `mark profile --type T`)",
            spec.name,
            ", ".join(missing),
        )
    latency = {t: lat for t, (lat, _) in chosen.items()}
    if spec.variants and spec.accuracy_floor < spec.variants[0].accuracy:
        latency = planning_curves(
            latency,
            variant_profiles(spec),
            {v.name: v.accuracy for v in spec.variants},
            spec.variants[0].name,
            spec.accuracy_floor,
            spec.slo.rt_max_ms / 1000.0,
        )
    # Rating runs the perf model's queue for every type and pool size (seconds for new
    # profiles): in a thread, so the daemon's request path never waits on it.
    standby = await asyncio.to_thread(
        build_options,
        spec,
        catalog,
        settings.offerings.standby_types[:1],
        [Market.ON_DEMAND],
        latency,
        boot_s=world.boot_s,
    )
    options = await asyncio.to_thread(
        build_options,
        spec,
        catalog,
        settings.offerings.types,
        settings.offerings.markets,
        latency,
        boot_s=world.boot_s,
    )
    return RatedOptions(
        options,
        standby[0].capacity_rps if standby else 0.0,
        {t: src for t, (_, src) in chosen.items()},
    )
