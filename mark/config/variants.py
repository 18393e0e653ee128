"""A model's variants: its artifacts of different accuracy and speed (architectures,
distillations, quantizations), each with its accuracy on the user's validation set.

Declared under ``variants:`` in a manifest or a model entry; the model's own artifact is
then its most accurate variant's, which serves whenever nothing argues otherwise. The
accuracy floor (``slo.accuracy_floor``) is what the model must deliver on average; the
data plane chooses a variant per batch under it (``bouncer.variants``). Every variant
takes the model's inputs and gives its outputs: one interface, checked per variant by
``mark config check``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from bouncer.contract import Format

_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")


class VariantSpec(BaseModel):
    """One variant of a model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="URL-safe name, as a client pins it and responses name it")
    source: str = Field(
        description="its artifact (in a manifest 'artifact', relative to the version directory)"
    )
    format: Format | None = Field(default=None, description="default: from the artifact")
    handler: str | None = Field(default=None, description="python format: the handler class")
    accuracy: float = Field(
        gt=0, le=1, description="its accuracy on your validation set, 0-1 (e.g. top-1 0.761)"
    )
    metric: str = Field(
        min_length=1, description="what the accuracy measures, e.g. 'top-1, ImageNet val'"
    )
    profile: Path | None = Field(
        default=None, description="its profile file (batch latencies per instance type)"
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return url_safe(v, "variant")


def url_safe(v: str, what: str) -> str:
    """``v`` if it is a URL-safe name (a model's, a variant's), else ``ValueError``."""
    if not _NAME.match(v):
        raise ValueError(
            f"{v!r} is not a valid {what} name; allowed: 1-63 of a-z 0-9 . _ - "
            "starting with a letter or digit"
        )
    return v


def with_primary(data: dict[str, Any]) -> dict[str, Any]:
    """A model entry whose ``variants`` are given: its own artifact, format and handler
    are its most accurate variant's. ``ValueError`` if it names an artifact of its own too."""
    raw = data.get("variants")
    if not raw:
        return data
    if not isinstance(raw, list | tuple) or not all(isinstance(v, dict) for v in raw):
        raise ValueError("'variants' must be a list of {name, artifact, accuracy, metric}")
    if data.get("source") is not None:
        raise ValueError(
            "a model with variants takes its artifact from its most accurate variant: "
            "give each variant its 'artifact', and none to the model"
        )
    ranked = sorted(raw, key=lambda v: -float(v.get("accuracy") or 0.0))
    top = ranked[0]
    out = {**data, "variants": ranked, "source": top.get("source")}
    for key in ("format", "handler"):
        if top.get(key) is not None:
            out[key] = top[key]
    return out


def check_variants(variants: tuple[VariantSpec, ...], floor: float | None) -> None:
    """Names unique, and a floor some mix of the variants can meet."""
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise ValueError(f"variants repeat a name: {names}")
    if floor is None:
        return
    if not variants:
        raise ValueError(
            "slo.accuracy_floor needs variants with their accuracies ('variants:' in the "
            "manifest); a model of one artifact has no accuracy to trade"
        )
    best = max(v.accuracy for v in variants)
    if floor > best + 1e-12:
        raise ValueError(
            f"slo.accuracy_floor {floor:g} is above the most accurate variant's accuracy "
            f"({best:g}): no mix of the variants meets it; lower it to at most {best:g}"
        )
