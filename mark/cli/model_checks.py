"""Every configured model loaded and run once before anything is created.

`mark config check` and `mark up` both call ``checked``: a model that does not load,
does not take its declared inputs or does not give its declared outputs fails here,
named with the field to change and how, instead of 7 seconds into `mark up` in
torch's words. The outputs each model gave fill in the shapes left undeclared, so V2
metadata reports real shapes.
"""

from __future__ import annotations

from rich.progress import Progress

from bouncer.model_check import ModelCheckError, check_model
from bouncer.runtimes import ModelLoadError
from mark.cli.context import console
from mark.config import ModelSpec, Settings
from mark.control import resolve_source
from mark.errors import ConfigError


def checked(settings: Settings) -> Settings:
    """``settings`` with each model checked (outputs learnt); ``ConfigError`` listing
    every model that failed and why."""
    done: list[ModelSpec] = []
    failures: list[str] = []
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("checking models", total=len(settings.models))
        for spec in settings.models:
            bar.update(task, description=f"checking model {spec.name}")
            try:
                contract = spec.contract(resolve_source(spec, settings.data_dir))
                learnt = check_model(contract)
                # A model configured without a manifest keeps its outputs undeclared:
                # whatever type it gives passes through, as it always has.
                done.append(spec.with_outputs(learnt) if spec.path is not None else spec)
            except (ModelCheckError, ModelLoadError) as exc:
                failures.append(str(exc))
            bar.advance(task)
    if failures:
        raise ConfigError("\n".join(failures))
    return settings.model_copy(update={"models": tuple(done)})
