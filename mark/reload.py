"""A model repository read again while mark runs: a changed version rolls.

Every ``repository_poll_s`` (and at once on SIGHUP) the daemon reads its repository
again, the same way in every world (a directory, or ``s3://``). For a model whose
version (or contract) changed, the new version is checked as at start (loaded on this
machine's CPU, one batch run, outputs compared: ``bouncer.model_check``); a version that
fails is refused, with a decision that says why, and the old one serves on. One that
passes is served from then on: the spill function runs it, new instances are tagged
with it, and the controller rolls the fleet to it (``mark.control.rollouts``); if its
instances never get ready, the roll turns back and the version is refused too. A
refused version is not tried again until it is replaced by another.

A model added to the repository, or removed from it, is served (or stops being served)
after a restart in this version: both are logged when seen.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from bouncer.model_check import ModelCheckError, check_model
from bouncer.runtimes import ModelLoadError
from mark.clock import WallClock
from mark.config import ModelSpec
from mark.config.manifest import repository_entries
from provisioner.control_state import Note

if TYPE_CHECKING:
    from mark.daemon import Running

log = logging.getLogger("mark.reload")


def _changed(old: ModelSpec, new: ModelSpec) -> bool:
    """Whether ``new`` is another version to serve: its version, or what it declares."""
    return old.version != new.version or old.contract(old.source) != new.contract(new.source)


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


async def reload_models(run: Running, refused: set[tuple[str, str]]) -> list[str]:
    """Read the repository again and roll every model whose version changed; the models
    that started a roll. ``refused``: (model, version) never to try again."""
    settings = run.settings
    if settings.repository is None or run.controller is None:
        return []
    try:
        specs = await read_repository(settings.repository, settings.data_dir / "repository")
    except ValueError as exc:  # unreadable now (S3 down): the next poll tries again
        log.warning("model repository %s not read: %s", settings.repository, exc)
        return []
    rolled = []
    seen = {s.name for s in specs}
    for name in sorted(set(run.models) - seen):
        if run.models[name].spec.path is not None:
            log.warning("model %s left the repository: it is served until a restart", name)
    for spec in specs:
        served = run.models.get(spec.name)
        if served is None:
            log.warning(
                "model %s is new in the repository: it is served after a restart", spec.name
            )
            continue
        if not _changed(served.spec, spec) or (spec.name, spec.version) in refused:
            continue
        now = WallClock().now()
        try:
            learnt = await asyncio.to_thread(check_model, spec.contract(spec.source))
        except (ModelCheckError, ModelLoadError) as exc:
            refused.add((spec.name, spec.version))
            why = f"version {spec.version} refused, version {served.spec.version} serves on: {exc}"
            log.error("%s: %s", spec.name, why)
            await run.controller.note(spec.name, now, [Note("version-refused", why)])
            continue
        spec = spec.with_outputs(learnt)
        was = served.spec
        served.spec = spec
        run.world.use_model(spec, spec.source)
        run.controller.roll_to(spec, now)
        why = f"version {spec.version} checked; its instances replace version {was.version}'s"
        log.info("%s: %s", spec.name, why)
        await run.controller.note(spec.name, now, [Note("rollout-start", why)])
        rolled.append(spec.name)
    return rolled


def turned_back(run: Running, refused: set[tuple[str, str]], back: ModelSpec) -> None:
    """A roll turned back to ``back``: serve it again, and refuse the version it left."""
    served = run.models.get(back.name)
    if served is None:
        return
    refused.add((back.name, served.spec.version))
    served.spec = back
    run.world.use_model(back, back.source)
