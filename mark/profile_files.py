"""Profile files a user ships with a model spec (``models[].profile``).

Two formats load through here: the JSON ``mark profile`` writes (one object
with ``model``, ``instance_type`` and ``batch_latency_s`` = {batch: seconds},
or a list of them, or ``{"profiles": [...]}``), and the paper's published
profiles (``schema: mark-paper-profiles/v1``, parsed by
``provisioner.profiles``), where the model is found by its key or its name.

An entry whose instance type is ``lambda-<memory>mb`` is the spill function's batch
latency at that memory size (``mark profile --spill`` measures it through the world's
function, round trips included): it sizes batched spill (``bouncer.routing.spill_chunks``)
in a world whose function has that memory, and rates no instance type.

A profile rates only the hardware it was measured on: ``mark profile`` writes
the instance type when it runs on EC2 (the metadata service answers) or with
``--type``, else ``"local"``, which rates no type, and records the hardware
(``hardware``: CPU, vCPUs, device, GPU) either way. Older files without
``hardware`` load as before.
"""

from __future__ import annotations

import http.client
import json
import os
import platform
import urllib.request
from collections.abc import Collection
from pathlib import Path
from typing import Any

from bouncer.latency import BatchLatency
from mark.errors import ConfigError
from provisioner.profiles import parse_paper_profiles

PAPER_SCHEMA = "mark-paper-profiles/v1"
LOCAL = "local"
"""The instance type of a profile measured off EC2: it rates no catalog type."""
IMDS_URL = "http://169.254.169.254"


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


def spill_profile_type(memory_mb: int) -> str:
    """The profile entry of the spill function at ``memory_mb`` (its batch latency)."""
    return f"lambda-{memory_mb}mb"


def is_spill_profile(name: str) -> bool:
    return name.startswith("lambda-") and name.endswith("mb") and name[7:-2].isdigit()


def spill_batches(profile: Path | None, model: str, memory_mb: int) -> BatchLatency | None:
    """The spill function's batch latency for ``model`` at ``memory_mb`` from its profile
    file, None where the file has none (a curve at another memory size rates nothing)."""
    if profile is None:
        return None
    return load_profile_file(profile, model).get(spill_profile_type(memory_mb))


def unrated_entries(rates: Collection[str], known: Collection[str]) -> list[str]:
    """The instance types of a profile file that name no catalog type (``"local"``: measured
    on a machine that is no EC2 instance), which therefore rate nothing; the spill
    function's entries are not among them."""
    return sorted(t for t in rates if t not in known and not is_spill_profile(t))


def unusable_profile_warning(path: Path, model: str, stray: Collection[str]) -> str:
    """What to tell a user whose profile file rates nothing it names: why, and the ways
    to a profile the planner can use."""
    return (
        f"{model}: profile file {path} is labelled {', '.join(map(repr, stray))}, not an "
        "instance type in the catalog: it was measured on other hardware (a laptop, with "
        "`mark profile` off EC2) and rates no offering. To rate a type T, run "
        "`mark profile --type T` (world: aws), or `mark profile` on an instance of T, or let "
        "exploration measure it (planner.explore_unprofiled, on by default)"
    )


def ec2_instance_type(url: str = IMDS_URL, timeout_s: float = 0.5) -> str | None:
    """This machine's EC2 instance type from the metadata service (IMDSv2), None off EC2
    (no answer within ``timeout_s``): what a profile measured here rates."""
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy
    try:
        put = urllib.request.Request(
            f"{url}/latest/api/token",
            method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"},
        )
        with direct.open(put, timeout=timeout_s) as r:
            token = r.read().decode()
        get = urllib.request.Request(
            f"{url}/latest/meta-data/instance-type",
            headers={"X-aws-ec2-metadata-token": token},
        )
        with direct.open(get, timeout=timeout_s) as r:
            itype = r.read().decode().strip()
    except (OSError, ValueError, http.client.HTTPException):
        return None
    return itype or None


def this_hardware(device: str, gpu: str | None = None) -> dict[str, Any]:
    """What a profile taken on this machine was measured on: CPU model, vCPUs, the device
    the model ran on (as ``mark profile --device`` chose it), the GPU if any."""
    return {
        "cpu": _cpu_model(),
        "vcpus": os.cpu_count() or 0,
        "machine": platform.machine(),
        "device": device,
        "gpu": gpu,
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"
