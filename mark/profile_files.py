"""Profile files a user ships with a model spec (``models[].profile``).

Two formats load through here: the JSON ``mark profile`` writes (one object
with ``model``, ``instance_type`` and ``batch_latency_s`` = {batch: seconds},
or a list of them, or ``{"profiles": [...]}``), and the paper's published
profiles (``schema: mark-paper-profiles/v1``, parsed by
``provisioner.profiles``), where the model is found by its key or its name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bouncer.latency import BatchLatency
from mark.errors import ConfigError
from provisioner.profiles import parse_paper_profiles

PAPER_SCHEMA = "mark-paper-profiles/v1"


def load_profile_file(path: Path, model: str) -> dict[str, BatchLatency]:
    """T_b per instance type for ``model`` from ``path``; ConfigError if unreadable."""
    try:
        doc: Any = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"profile file {path}: {exc}") from None
    try:
        if isinstance(doc, dict) and doc.get("schema") == PAPER_SCHEMA:
            return _paper(doc, model, path)
        entries = doc if isinstance(doc, list) else doc.get("profiles", [doc])
        out: dict[str, BatchLatency] = {}
        for e in entries:
            if e.get("model", model) != model:
                continue
            table = {int(b): float(t) for b, t in dict(e["batch_latency_s"]).items()}
            if not table or min(table.values()) <= 0:
                raise ValueError("batch_latency_s needs positive seconds per batch size")
            out[str(e["instance_type"])] = BatchLatency.from_mapping(table)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"profile file {path}: not the format `mark profile` writes ({exc})"
        ) from None
    if not out:
        raise ConfigError(f"profile file {path} has no profile for model {model!r}")
    return out


def _paper(doc: dict[str, Any], model: str, path: Path) -> dict[str, BatchLatency]:
    wanted = model.lower()
    for key, prof in parse_paper_profiles(doc).items():
        if wanted in (key.lower(), prof.model.lower()):
            return {
                t: BatchLatency.from_mapping(p.batch_latency_s()) for t, p in prof.instances.items()
            }
    raise ConfigError(f"profile file {path} has no profile for model {model!r}")
