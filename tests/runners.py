"""Runners of bare model sources for tests: one input named ``input``, one output."""

from __future__ import annotations

from typing import Any

import numpy as np

from bouncer.contract import legacy_contract
from bouncer.device import DeviceChoice
from bouncer.runner import ModelRunner


def source_runner(
    source: str,
    shape: tuple[int, ...] = (),
    dtype: str = "float32",
    *,
    choice: DeviceChoice | None = None,
) -> SourceRunner:
    """A runner of ``source`` whose ``run`` takes and gives one array, as before contracts."""
    return SourceRunner(legacy_contract("model", source, shape, dtype), choice=choice)


class SourceRunner(ModelRunner):
    """``ModelRunner`` on the one input and the one output of a bare source."""

    def run(self, inputs: Any) -> Any:
        if isinstance(inputs, dict):
            return super().run(inputs)
        return super().run({"input": np.asarray(inputs)})["output"]
