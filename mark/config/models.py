"""A model as the configuration declares it: its artifact, format, tensors and SLO.

Two ways to declare one, both validated into the same ``ModelSpec``:

- in the configuration itself (``source`` and ``input``: the original form, one
  input tensor named ``input`` and one output named ``output``), or
- as a model directory (``path``) holding a manifest, ``model.yaml``, with the
  same fields (``mark.config.manifest``); keys given beside ``path`` override the
  manifest's (an SLO per deployment, say).

``ModelSpec.contract`` is what agents and the spill function load
(``bouncer.contract``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from bouncer.contract import (
    FORMATS,
    Format,
    ModelContract,
    TensorSpec,
    VariantArtifact,
    infer_format,
)
from bouncer.miss_budget import DEFAULT_PERIOD_S
from bouncer.miss_budget import DEFAULT_SHARE as DEFAULT_DECLINE_SHARE
from mark.config.variants import VariantSpec, check_variants, url_safe, with_primary

Dtype = Literal["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"]
_TENSOR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:/-]{0,127}$")
LEGACY_INPUT = "input"
"""The input's name for a model declared with ``input:`` (no manifest)."""
LEGACY_OUTPUT = "output"
"""The output's name for a model declared without ``outputs``."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SLO(_Strict):
    """A model's latency objective (paper §4.1, following Swayam)."""

    rt_max_ms: float = Field(gt=0, le=600_000, description="RT_max: response-time threshold")
    sl_min: float = Field(
        gt=0, le=1, description="SL_min: fraction of requests that must finish within RT_max"
    )
    decline_share: float = Field(
        default=DEFAULT_DECLINE_SHARE,
        ge=0,
        le=1,
        description="share of the miss allowance (1 - SL_min) mark may spend declining, with "
        "an immediate explicit error, requests no instance can finish in time instead of "
        "paying Lambda for them; the rest, and at least as many as the misses nobody chose so "
        "far, is kept for misses nobody chooses. 0 (the default): never decline, spill all",
    )
    accuracy_floor: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="the accuracy the model must deliver, averaged over the requests of "
        "period_s, where it has variants: batches that would miss RT_max go on faster "
        "variants while the average stays at or above it. None: always the most accurate",
    )
    period_s: float = Field(
        default=DEFAULT_PERIOD_S,
        ge=60,
        le=31 * 86_400,
        description="the period SL_min is kept over, in seconds: declines keep the misses of "
        "the last period_s within decline_share of its allowance (default a day; 3600 keeps "
        "every hour within it, at the price of spilling more of a rise to Lambda)",
    )


class InputSchema(_Strict):
    """Shape of one instance (without the batch dimension) and its dtype."""

    shape: tuple[int, ...] = Field(min_length=1)
    dtype: Dtype = "float32"

    @field_validator("shape")
    @classmethod
    def _positive(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if any(d <= 0 for d in v):
            raise ValueError(f"every dimension must be a positive integer, got {list(v)}")
        return v


class TensorConfig(_Strict):
    """One named tensor: element type and one instance's shape (no batch dimension);
    ``-1`` is a variable dimension. An output's shape may be left out: then it is
    learnt when the model is checked (`mark config check`, `mark up`)."""

    name: str = Field(description="the tensor's name, as the model and the V2 protocol call it")
    dtype: Dtype = "float32"
    shape: tuple[int, ...] | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _TENSOR_NAME.match(v):
            raise ValueError(f"{v!r} is not a valid tensor name (letters, digits, _ . : / -)")
        return v

    @field_validator("shape")
    @classmethod
    def _dims(cls, v: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if v is not None and any(d == 0 or d < -1 for d in v):
            raise ValueError(f"each dimension must be positive or -1 (variable), got {list(v)}")
        return v

    def spec(self) -> TensorSpec:
        return TensorSpec(self.name, self.dtype, self.shape)


def _legacy_inputs(schema: InputSchema) -> tuple[TensorConfig, ...]:
    return (TensorConfig(name=LEGACY_INPUT, dtype=schema.dtype, shape=schema.shape),)


class ModelSpec(_Strict):
    """A model served by mark."""

    name: str = Field(description="URL-safe name: lowercase letters, digits, '.', '_' and '-'")
    path: Path | None = Field(
        default=None,
        description="the model directory whose manifest (model.yaml) declares the rest",
    )
    location: str | None = Field(
        default=None,
        description="where the model directory lives in S3 (s3://bucket/prefix/name): "
        "instances and the spill function fetch the model from there",
    )
    version: str = Field(default="1", pattern=r"^[0-9]{1,9}$", description="the version served")
    format: Format | None = Field(
        default=None,
        description=f"{', '.join(FORMATS)}; default: from the source (.onnx: onnx, "
        "package.module:factory: pytorch, another file: torchscript)",
    )
    source: str = Field(
        description="the artifact: a TorchScript or ONNX file, a Python handler file, or "
        "'package.module:factory' returning a torch module"
    )
    handler: str | None = Field(
        default=None, description="python format: the handler class in the file (default Model)"
    )
    input: InputSchema | None = Field(
        default=None, description="the one input, named 'input' (the form without a manifest)"
    )
    inputs: tuple[TensorConfig, ...] = ()
    outputs: tuple[TensorConfig, ...] = ()
    slo: SLO
    profile: Path | None = Field(
        default=None, description="profile file (batch latencies per instance type)"
    )
    max_rate_rps: float | None = Field(
        default=None,
        gt=0,
        description="the most load this model can see (r/s); forecasts above it are clipped",
    )
    variants: tuple[VariantSpec, ...] = Field(
        default=(),
        description="the model's variants, each {name, artifact, accuracy, metric}; the "
        "most accurate is the model's own artifact (mark.config.variants)",
    )
    neuron_artifact: str | None = Field(
        default=None,
        min_length=1,
        description="the model compiled for Inferentia (TorchScript from torch_neuronx.trace "
        "for inf2, torch.neuron.trace for inf1); without it no Inferentia type is planned",
    )

    @model_validator(mode="before")
    @classmethod
    def _manifest(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("path") is not None:
            from mark.config.manifest import merged_with_manifest

            data = merged_with_manifest(data)
        return with_primary(data) if isinstance(data, dict) else data

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return url_safe(v, "model")

    @model_validator(mode="after")
    def _tensors(self) -> ModelSpec:
        legacy = self.input
        if legacy is not None and self.inputs and self.inputs != _legacy_inputs(legacy):
            raise ValueError("declare the model's tensors with 'inputs' or 'input', not both")
        if legacy is None and not self.inputs:
            raise ValueError(
                "declare the model's input: 'inputs: [{name, dtype, shape}]' in its manifest, "
                "or 'input: {shape, dtype}'"
            )
        inputs = self.inputs or (_legacy_inputs(legacy) if legacy is not None else ())
        outputs = self.outputs or (TensorConfig(name=LEGACY_OUTPUT),)
        for kind, tensors in (("inputs", inputs), ("outputs", outputs)):
            names = [t.name for t in tensors]
            if len(set(names)) != len(names):
                raise ValueError(f"{kind} repeat a name: {names}")
        if any(t.shape is None for t in inputs):
            raise ValueError("every input needs a shape (-1 for a variable dimension)")
        object.__setattr__(self, "inputs", inputs)
        object.__setattr__(self, "outputs", outputs)
        check_variants(self.variants, self.slo.accuracy_floor)
        return self

    @property
    def accuracy_floor(self) -> float:
        """The floor the data plane keeps: the SLO's, else the most accurate variant's
        accuracy (never trade it); 0 for a model without variants."""
        if self.slo.accuracy_floor is not None:
            return self.slo.accuracy_floor
        return max((v.accuracy for v in self.variants), default=0.0)

    @property
    def model_format(self) -> Format:
        return self.format if self.format is not None else infer_format(self.source)

    @property
    def remote_source(self) -> str:
        """The artifact where other machines read it: in S3 for a model fetched from
        there, else the source itself."""
        return self._remote(self.source)

    def _remote(self, source: str) -> str:
        if self.location is None or self.path is None:
            return source
        rel = Path(source).relative_to(self.path).as_posix()
        return f"{self.location.rstrip('/')}/{rel}"

    @property
    def input_specs(self) -> tuple[TensorSpec, ...]:
        return tuple(t.spec() for t in self.inputs)

    @property
    def output_specs(self) -> tuple[TensorSpec, ...]:
        return tuple(t.spec() for t in self.outputs)

    @property
    def input_tensor(self) -> TensorSpec:
        return self.inputs[0].spec()

    def contract(self, artifact: str | None = None) -> ModelContract:
        """What runners load; ``artifact`` replaces the source (the demo model built on
        this machine, a file fetched from S3)."""
        located = artifact if artifact is not None else self.remote_source
        return ModelContract(
            name=self.name,
            version=self.version,
            format=self.format if self.format is not None else infer_format(located),
            artifact=located,
            inputs=tuple(t.spec() for t in self.inputs),
            outputs=tuple(t.spec() for t in self.outputs),
            handler=self.handler,
            variants=tuple(
                VariantArtifact(
                    name=v.name,
                    format=v.format if v.format is not None else infer_format(v.source),
                    # The primary's artifact is the model's (the demo built here, say).
                    artifact=located if i == 0 else self._remote(v.source),
                    handler=v.handler,
                    accuracy=v.accuracy,
                )
                for i, v in enumerate(self.variants)
            ),
        )

    def with_outputs(self, contract: ModelContract) -> ModelSpec:
        """This spec with the output shapes a check learnt (``bouncer.model_check``)."""
        outputs = tuple(
            TensorConfig(name=t.name, dtype=t.dtype, shape=t.shape)  # type: ignore[arg-type]
            for t in contract.outputs
        )
        return self.model_copy(update={"outputs": outputs})
