"""A model repository read again while mark runs: models added, removed, and rolled.

Every ``repository_poll_s`` (and at once on SIGHUP) the daemon reads its repository
again, the same way in every world (a directory, or ``s3://``), and compares it with
what it serves:

- a model new in the repository is checked as at start (loaded on this machine's CPU,
  one batch run, outputs compared: ``bouncer.model_check``), rated, and served from
  then on (its endpoint, its dispatcher, the controller plans it);
- a model gone from the repository is no longer served: new requests get 404, those
  taken are answered, the controller stops planning it and its instances are the
  orphan sweep's (``removed-model``, ended after ``control.orphan_grace_s``);
- a model whose version (or contract) changed: the new version is checked, and one that
  fails is refused, with a decision that says why, while the old one serves on. One
  that passes is served from then on: the spill function runs it, new instances are
  tagged with it, and the controller rolls the fleet to it
  (``mark.control.rollouts``); if its instances never get ready, the roll turns back
  and the version is refused too. A refused version is not tried again until another
  replaces it.

A model listed under ``models:`` in the configuration is not the repository's: it
changes only with a restart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import MutableMapping
from pathlib import Path
from typing import Protocol

import aiohttp
from pydantic import ValidationError

from bouncer.model_check import ModelCheckError, check_model
from bouncer.runtimes import ModelLoadError
from mark.catalog import Catalog
from mark.clock import WallClock
from mark.config import ModelSpec, Settings
from mark.config.manifest import repository_entries
from mark.control import Controller, online_predictor
from mark.control.profiles import rate_options
from mark.ports import Store
from mark.serve.api_state import Served, model_request_path
from mark.serve.dispatcher import Dispatchers
from mark.world import World
from provisioner.control_state import Note

log = logging.getLogger("mark.reload")


class Daemon(Protocol):
    """What a reload reads and changes of the running daemon (``mark.daemon.Running``)."""

    @property
    def settings(self) -> Settings: ...
    @property
    def store(self) -> Store: ...
    @property
    def world(self) -> World: ...
    @property
    def session(self) -> aiohttp.ClientSession: ...
    @property
    def controller(self) -> Controller | None: ...
    @property
    def catalog(self) -> Catalog | None: ...
    @property
    def models(self) -> dict[str, Served]: ...
    @property
    def sources(self) -> dict[str, str]: ...
    @property
    def refused(self) -> set[tuple[str, str]]: ...


def _changed(old: ModelSpec, new: ModelSpec) -> bool:
    """Whether ``new`` (as read) is another version than ``old`` (as served, its output
    shapes perhaps learnt by its check): its version, artifact or declared tensors. A
    version directory whose files change in place is the same version: publish a new one."""
    if (old.version, old.model_format, old.source, old.inputs) != (
        new.version,
        new.model_format,
        new.source,
        new.inputs,
    ):
        return True
    if [(o.name, o.dtype) for o in old.outputs] != [(o.name, o.dtype) for o in new.outputs]:
        return True
    return any(
        n.shape is not None and n.shape != o.shape
        for o, n in zip(old.outputs, new.outputs, strict=True)
    )


async def read_repository(repository: str, cache: Path) -> list[ModelSpec]:
    """The repository's models as now; one that does not validate is logged and left out."""
    entries = await asyncio.to_thread(repository_entries, repository, cache)
    specs = []
    for entry in entries:
        try:
            specs.append(ModelSpec.model_validate(entry))
        except ValidationError as exc:
            log.error("model repository %s: %s is left as it was: %s", repository, entry, exc)
    return specs


async def _checked(run: Daemon, spec: ModelSpec, now: float) -> ModelSpec | None:
    """``spec`` with its outputs learnt, or None (refused, and a decision says why)."""
    try:
        learnt = await asyncio.to_thread(check_model, spec.contract(spec.source))
    except (ModelCheckError, ModelLoadError) as exc:
        run.refused.add((spec.name, spec.version))
        served = run.models.get(spec.name)
        keeps = f", version {served.spec.version} serves on" if served is not None else ""
        why = f"version {spec.version} refused{keeps}: {exc}"
        log.error("%s: %s", spec.name, why)
        if run.controller is not None:
            await run.controller.note(spec.name, now, [Note("version-refused", why)])
        return None
    return spec.with_outputs(learnt)


async def reload_models(run: Daemon) -> list[str]:
    """Read the repository again and act on what changed; the models added, removed or
    rolled."""
    settings, controller = run.settings, run.controller
    if settings.repository is None:
        return []
    try:
        specs = await read_repository(settings.repository, settings.data_dir / "repository")
    except ValueError as exc:  # unreadable now (S3 down): the next poll tries again
        log.warning("model repository %s not read: %s", settings.repository, exc)
        return []
    changed = []
    seen = {s.name for s in specs}
    for name in sorted(n for n, s in run.models.items() if s.spec.path and n not in seen):
        await _remove(run, controller, name)
        changed.append(name)
    for spec in specs:
        served = run.models.get(spec.name)
        fresh = served is None or _changed(served.spec, spec)
        if not fresh or (spec.name, spec.version) in run.refused:
            continue
        now = WallClock().now()
        checked = await _checked(run, spec, now)
        if checked is None:
            continue
        if served is None:
            await _add(run, controller, checked, now)
        else:
            was = served.spec
            served.spec = checked
            run.world.use_model(checked, checked.source)
            why = f"version {checked.version} checked; it serves in place of {was.version}"
            if controller is not None:
                controller.roll_to(checked, now)
                why += ", its instances replacing the old version's"
            await _note(run, checked.name, now, "rollout-start", why)
        changed.append(spec.name)
    return changed


async def _note(run: Daemon, model: str, now: float, action: str, why: str) -> None:
    """Log a reload's decision, and record it where a controller keeps decisions."""
    log.info("%s: %s", model, why)
    if run.controller is not None:
        await run.controller.note(model, now, [Note(action, why)])


async def _add(run: Daemon, controller: Controller | None, spec: ModelSpec, now: float) -> None:
    serverless = run.world.serverless
    served = model_request_path(run.settings, spec, WallClock().now, run.session, serverless)
    run.world.use_model(spec, spec.source)
    run.sources[spec.name] = spec.source
    if controller is not None:
        catalog = run.catalog if run.catalog is not None else controller.catalog
        rated = await rate_options(run.settings, spec, run.world, run.store, spec.source, catalog)
        predictor = online_predictor(run.settings)
        await controller.add_model(
            spec, rated.options, rated.sources, rated.standby_capacity_rps, predictor
        )
    run.models[spec.name] = served  # the endpoint's dict: the model answers from now on
    _drain_all(run, controller)
    why = f"new in the repository: version {spec.version}, {spec.model_format}, checked"
    await _note(run, spec.name, now, "model-added", why)


async def _remove(run: Daemon, controller: Controller | None, name: str) -> None:
    served = run.models.pop(name)  # new requests: 404
    if controller is not None:
        await controller.remove_model(name)
    if served.dispatcher is not None:
        await served.dispatcher.close()  # what it took is answered
    if served.telemetry is not None:
        windows, rollups = served.telemetry.drain(WallClock().now(), everything=True)
        if windows:
            await run.store.add_arrivals(windows)
        for r in rollups:
            await run.store.add_latency_rollup(r)
    _drain_all(run, controller)
    why = "gone from the repository: no longer served; its instances end as orphans"
    await _note(run, name, WallClock().now(), "model-removed", why)


def _drain_all(run: Daemon, controller: Controller | None) -> None:
    """Every served model's dispatcher is told before an instance is terminated (and the
    other frontends, as before)."""
    if controller is None:
        return
    was = controller.draining
    controller.draining = Dispatchers(
        [s.dispatcher for s in run.models.values() if s.dispatcher is not None],
        was.others if isinstance(was, Dispatchers) else None,
    )


def turned_back(
    models: MutableMapping[str, Served],
    refused: set[tuple[str, str]],
    world: World,
    back: ModelSpec,
) -> None:
    """A roll turned back to ``back``: serve it again, and refuse the version it left."""
    served = models.get(back.name)
    if served is None:
        return
    refused.add((back.name, served.spec.version))
    served.spec = back
    world.use_model(back, back.source)
