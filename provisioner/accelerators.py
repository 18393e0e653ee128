"""Which instance types' accelerators a model can use, and why not.

The planner plans a model only on offerings whose accelerator it can use:
the CPU always; a GPU always (torch's CUDA backend runs any torch model);
Inferentia (and Trainium, the other Neuron device) only when the model names a
compiled Neuron artifact, because a NeuronCore runs only a model compiled for
it. Plain values in (the catalog's accelerator names), so the planner, the
simulator and ``mark config check`` share one rule.
"""

from __future__ import annotations

NEURON_ARTIFACT_FIELD = "models[].neuron_artifact"


def usable(accelerator: str, has_neuron_artifact: bool) -> tuple[bool, str]:
    """(can a model use this accelerator, why not — empty when it can)."""
    if accelerator in ("cpu", "gpu"):
        return True, ""
    if accelerator in ("inferentia", "trainium"):
        if has_neuron_artifact:
            return True, ""
        name = accelerator.capitalize()
        return False, f"{name} needs a compiled Neuron artifact ({NEURON_ARTIFACT_FIELD})"
    return False, f"unknown accelerator {accelerator!r}: mark serves on cpu, gpu or inferentia"
