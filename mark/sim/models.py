"""Simulated models: the paper's published profiles as batch-latency curves.

Each model has an SLO (the paper's RT_max and SL_min), a batch-latency curve
T_b per instance type it was profiled on (``provisioner.profiles``), and what
the profiles do not give, derived by a stated rule:

- **Lambda latency.** Table 2 measured Lambda (3 GB) at 380 ms for
  Inception-v3 and 3.1 s for OpenNMT-ende; those are used as they are. For the
  other models T_1 on Lambda is 1.81 × their c5.large T_1 (the Inception-v3
  ratio 380/210). A batch of k on Lambda takes T_1 × the ratio T_k / T_1 measured
  on two CPU threads of this repository's machine where one was
  (``data/lambda-batch-shapes.json``, made by ``experiments/spill/lambda_shape.py``:
  LSTM-ptb), up to the largest batch measured; elsewhere k × T_1, and spill goes one
  request per invocation.
- **c5.large T_1** where only c5.xlarge was profiled: × 1.725, the
  Inception-v3 ratio of the two capacities (490/284 r/min).
- **Burstable standbys** (t3) run at c5.large speed per 2 vCPUs while they hold
  CPU credits and at their baseline fraction after.
- **Current types only, for every policy.** The paper profiled P2 (p2.xlarge, a K80),
  which AWS is retiring on EC2 and SageMaker alike (the hosting table's ``retiring``:
  aws/deep-learning-containers PR #3950, "EC2 Instance retirement for P2 and M4
  instances"). A profile of a retiring family is dropped, so mark, the target-tracking
  baselines, the clairvoyant schedule and the bound all choose among the same types. No
  current GPU type (g4dn, g5, inf2) has a profile of these models, and none can be
  derived from a measurement shipped here, so the paper's models run on C5 alone.

A model named here is also a ``ModelSpec`` so the controller can be configured
with it; its ``source`` names the profile, never a file that is loaded.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources

from bouncer.latency import BatchLatency
from mark.catalog import load_hosting_prices
from mark.catalog.hosting import family_of
from mark.config import SLO, InputSchema, ModelSpec
from mark.errors import ConfigError
from provisioner.profiles import ModelProfile, load_paper_profiles

LAMBDA_OVER_C5_LARGE = 380.0 / 210.0
C5_LARGE_OVER_XLARGE = 490.0 / 284.0
LAMBDA_T1_MEASURED_S = {"tf": 0.380, "nmt": 3.100}

# Burstable baselines (fraction of each vCPU) and credits earned per hour (AWS docs).
T3_BASELINE = {
    "t3.nano": (0.05, 6),
    "t3.micro": (0.10, 12),
    "t3.small": (0.20, 24),
    "t3.medium": (0.20, 24),
    "t3.large": (0.30, 36),
    "t3.xlarge": (0.40, 96),
    "t3.2xlarge": (0.40, 192),
}

PAPER_MODELS = {
    "inception-v3": ("tf", None),
    "nasnet": ("kr", None),
    "opennmt-ende": ("nmt", None),
    # The code's "mx" profile, read as LSTM-ptb (the paper's one MXNet model), with its SLO.
    "lstm-ptb": ("mx", (100.0, 0.98)),
}


@dataclass(frozen=True)
class SimVariant:
    """One of a simulated model's variants: its accuracy and its T_b per type."""

    name: str
    accuracy: float
    latency: Mapping[str, BatchLatency]


@dataclass(frozen=True)
class SimModel:
    name: str
    rt_max_s: float
    sl_min: float
    latency: Mapping[str, BatchLatency]  # per profiled instance type
    lambda_t1_s: float
    lambda_memory_mb: int = 3072
    lambda_cold_start_s: float = 2.5
    standby_t1_s: float = 0.0  # per request on a 2-vCPU burstable standby at full speed
    notes: tuple[str, ...] = field(default_factory=tuple)

    def spec(self) -> ModelSpec:
        return ModelSpec(
            name=self.name,
            source=f"profile:{self.name}",
            input=InputSchema(shape=(1,), dtype="float32"),
            slo=SLO(rt_max_ms=self.rt_max_s * 1000.0, sl_min=self.sl_min),
        )

    variants: tuple[SimVariant, ...] = ()
    """Where the model has variants (``with_variants``), all of them, most accurate first:
    the first is the model itself (``latency``)."""
    lambda_batches: BatchLatency | None = None
    """The spill function's batch latency at ``lambda_memory_mb`` where a batch curve is
    known (``LAMBDA_BATCH_SHAPES``): it sizes batched spill (``bouncer.routing.spill_chunks``)
    and times each invocation. None: k × T_1, and one request per invocation."""

    def lambda_latency(self, k: int) -> float:
        if self.lambda_batches is not None:
            return self.lambda_batches(k)
        return self.lambda_t1_s * k

    def standby_latency(self, vcpus: int) -> BatchLatency:
        """T_b of a burstable standby at full speed (c5.large speed per 2 vCPUs)."""
        t1 = self.standby_t1_s * 2.0 / max(vcpus, 1)
        return BatchLatency(((1, t1),))


def _c5_large_t1(profile: ModelProfile, curves: Mapping[str, BatchLatency]) -> float:
    if "c5.large" in curves:
        return curves["c5.large"](1)
    if "c5.xlarge" in curves:
        return curves["c5.xlarge"](1) * C5_LARGE_OVER_XLARGE
    raise ConfigError(f"{profile.model}: no CPU profile to derive Lambda and standby speed from")


@cache
def lambda_batch_shapes() -> dict[str, dict[int, float]]:
    """Per model, T_k / T_1 on two CPU threads (``data/lambda-batch-shapes.json``)."""
    doc = json.loads(
        resources.files("mark.sim").joinpath("data/lambda-batch-shapes.json").read_text()
    )
    return {
        name: {int(k): float(r) for k, r in shape["ratio"].items()}
        for name, shape in doc["shapes"].items()
    }


def lambda_curve(name: str, t1_s: float) -> BatchLatency | None:
    """The spill function's batch curve for ``name`` with T_1 ``t1_s``, where a shape was
    measured."""
    shape = lambda_batch_shapes().get(name)
    return (
        None
        if shape is None
        else BatchLatency.from_mapping({k: t1_s * r for k, r in shape.items()})
    )


GFLOPS = {"inception-v3": 5.71, "resnet-50": 4.09, "resnet-18": 1.81}
"""Forward GFLOPS per image at each model's input size (torchvision's model table,
https://pytorch.org/vision/stable/models.html, "GFLOPS" column)."""
TOP1 = {"inception-v3": 0.7729, "resnet-50": 0.7613, "resnet-18": 0.6976}
"""ImageNet-1k top-1 of torchvision's weights (the same table, "Acc@1", IMAGENET1K_V1)."""


def with_variants(model: SimModel, family: Sequence[str]) -> SimModel:
    """``model`` (Inception-v3) with the variants ``family`` names, most accurate first:
    each rated on every type at the model's T_b × its GFLOPS over the model's (a stated
    rule, not a measurement: CPU inference time roughly follows FLOPs within one family of
    dense convolutional networks), with torchvision's published top-1."""
    base = GFLOPS[model.name]
    variants = [
        SimVariant(
            name,
            TOP1[name],
            {t: c.scaled(GFLOPS[name] / base) for t, c in model.latency.items()},
        )
        for name in [model.name, *family]
    ]
    return replace(model, variants=tuple(sorted(variants, key=lambda v: -v.accuracy)))


def current_types(types: Iterable[str]) -> list[str]:
    """``types`` less those of a family AWS is retiring (the module docstring)."""
    retiring = load_hosting_prices().retiring
    return [t for t in types if family_of(t) not in retiring]


def paper_model(name: str) -> SimModel:
    """One of the paper's four evaluation models (Table 4) from its published profile, on
    the types AWS still offers (the module docstring)."""
    try:
        key, slo = PAPER_MODELS[name]
    except KeyError:
        raise ConfigError(
            f"unknown simulated model {name!r}; known: {', '.join(PAPER_MODELS)}"
        ) from None
    profile = load_paper_profiles()[key]
    current = current_types(profile.instances)
    curves = {
        t: BatchLatency.from_mapping(p.batch_latency_s())
        for t, p in profile.instances.items()
        if t in current
    }
    rt_max_s, sl_min = (slo[0] / 1000.0, slo[1]) if slo else (profile.rt_max_s, profile.sl_min)
    c5l = _c5_large_t1(profile, curves)
    lam = LAMBDA_T1_MEASURED_S.get(key, c5l * LAMBDA_OVER_C5_LARGE)
    return SimModel(
        name=name,
        rt_max_s=rt_max_s,
        sl_min=sl_min,
        latency=curves,
        lambda_t1_s=lam,
        lambda_batches=lambda_curve(name, lam),
        standby_t1_s=c5l,
        notes=(
            f"profile {key!r} from the paper's code; types {', '.join(sorted(curves))}"
            + (
                f" (retiring, left out: {', '.join(sorted(gone))})"
                if (gone := set(profile.instances) - set(curves))
                else ""
            ),
            f"Lambda T_1 {lam * 1000:.0f} ms"
            + (" (paper Table 2)" if key in LAMBDA_T1_MEASURED_S else " (derived)"),
        ),
    )
