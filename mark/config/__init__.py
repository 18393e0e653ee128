"""Typed configuration: defaults < YAML file < ``MARK_*`` environment < CLI overrides.

Every value is validated when loaded, so a typo fails at start-up with a message
that names the field, the value and what is allowed, not an hour later in a
control-loop step. Names follow the paper's notation in their descriptions
(P_u, P_w, P_s, τ, RT_max, SL_min) so the two can be read side by side.

The sections are in ``mark.config.specs``, ``models`` and ``worlds``, ``Settings`` and
its loading in ``mark.config.settings``; every name is importable from ``mark.config``.
"""

from mark.config.models import SLO, Dtype, InputSchema, ModelSpec, TensorConfig
from mark.config.settings import (
    Settings,
    World,
    dump_settings,
    format_validation_error,
    load_settings,
    parse_overrides,
)
from mark.config.specs import (
    ApiSpec,
    BudgetSpec,
    ControlSpec,
    ExploreSpec,
    OfferingsSpec,
    PlannerSpec,
    PredictorSpec,
    SloMonitorSpec,
    Timings,
)
from mark.config.worlds import AwsSpec, LocalSpec

__all__ = [
    "SLO",
    "ApiSpec",
    "AwsSpec",
    "BudgetSpec",
    "ControlSpec",
    "Dtype",
    "ExploreSpec",
    "InputSchema",
    "LocalSpec",
    "ModelSpec",
    "OfferingsSpec",
    "PlannerSpec",
    "PredictorSpec",
    "Settings",
    "SloMonitorSpec",
    "TensorConfig",
    "Timings",
    "World",
    "dump_settings",
    "format_validation_error",
    "load_settings",
    "parse_overrides",
]
