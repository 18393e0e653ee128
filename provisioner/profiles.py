"""Per-instance-type inference profiles of a model, as plain dataclasses.

The paper's published numbers ship in ``provisioner/data/mark-paper.json`` (a
copy of ``shared/data/profiles/mark-paper.json``; its README explains every
field). Loading is the only I/O here, and it is explicit.

The published profile is a throughput, not a batch-latency curve: the code's
``AllCapacity`` gives requests per minute, written as batches/min × batch size
where the instance batches (p2.xlarge; OpenNMT on CPU). So each instance yields
exactly one point T_b: b is the batch the number was measured with and
T_b = 60 s × b / requests_per_minute. Where the capacity is not written as a
product (e.g. Inception-v3 on c5.xlarge, 490 r/m) the number is per request and
b = 1, whatever batch the code later sent. Entries the file marks as
placeholders (``mx`` on three types: "value 1 ... is a placeholder") are
dropped so no planner mistakes them for 1 request per minute. ``mx`` has no
model name or SLO in the code; its name falls back to the key and its SLO is
NaN.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class InstanceProfile:
    """One model on one instance type."""

    instance_type: str
    requests_per_minute: float
    profiled_batch: int
    paper_n_batch: int | None = None
    paper_w_batch_ms: float | None = None
    latency_ms: tuple[float, ...] = ()

    @property
    def capacity_rps(self) -> float:
        return self.requests_per_minute / 60.0

    @property
    def batch_time_s(self) -> float:
        """T_b at the profiled batch size b (seconds per batch)."""
        return 60.0 * self.profiled_batch / self.requests_per_minute

    def batch_latency_s(self) -> dict[int, float]:
        """The batch-latency curve {b: T_b} this profile supports (one point)."""
        return {self.profiled_batch: self.batch_time_s}


@dataclass(frozen=True)
class ModelProfile:
    """A model's SLO and its profile on every instance type it was measured on."""

    key: str
    model: str
    framework: str
    rt_max_s: float
    sl_min: float
    instances: Mapping[str, InstanceProfile]

    def instance(self, instance_type: str) -> InstanceProfile:
        try:
            return self.instances[instance_type]
        except KeyError:
            raise KeyError(f"{self.model} has no profile for {instance_type}") from None


def _instance(name: str, raw: Mapping[str, Any]) -> InstanceProfile:
    rpm = float(raw["requests_per_minute"])
    weight = float(raw["load_balancer_weight"])
    batch = round(rpm / weight) if rpm != weight else 1
    return InstanceProfile(
        instance_type=name,
        requests_per_minute=rpm,
        profiled_batch=batch,
        paper_n_batch=raw.get("paper_n_batch"),
        paper_w_batch_ms=raw.get("paper_w_batch_ms"),
        latency_ms=tuple(float(e["value"]) for e in raw.get("latency_ms") or ()),
    )


def parse_paper_profiles(document: Mapping[str, Any]) -> dict[str, ModelProfile]:
    """Models keyed by the code's key (``tf``, ``kr``, ``nmt``, ``mx``)."""
    models: dict[str, ModelProfile] = {}
    for key, raw in document["models"].items():
        slo = raw.get("slo") or {}
        models[key] = ModelProfile(
            key=key,
            model=raw["model"] or key,
            framework=raw["framework"],
            rt_max_s=float(slo.get("rt_max_ms", "nan")) / 1000.0,
            sl_min=float(slo.get("sl_min_percent", "nan")) / 100.0,
            instances={
                n: _instance(n, i)
                for n, i in raw["instances"].items()
                if "placeholder" not in str(i.get("note", ""))
            },
        )
    return models


def load_paper_profiles(path: Path | None = None) -> dict[str, ModelProfile]:
    """Read the paper's profiles; by default the copy shipped in this package."""
    if path is None:
        text = resources.files("provisioner").joinpath("data/mark-paper.json").read_text()
    else:
        text = path.read_text()
    return parse_paper_profiles(json.loads(text))
