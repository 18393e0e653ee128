"""Which device an agent serves on: CUDA, a NeuronCore, or the CPU, and with how many threads.

``select_device`` is pure: what the machine offers (``Hardware``) and what was
asked for in, a ``DeviceChoice`` out, with the reason in words. ``probe`` is the
only part that looks at the real machine. The rules:

- **CUDA** whenever torch sees a CUDA device (the first one; a model runs on
  one GPU). The host side only feeds it, so it gets ``HOST_THREADS``.
- **Neuron** (Inferentia, Trainium) when a Neuron torch package is importable
  *and* the model names a compiled Neuron artifact (a TorchScript file from
  ``torch_neuronx.trace`` for inf2/trn1, ``torch.neuron.trace`` for inf1) — a
  plain torch model cannot run on a NeuronCore. Tensors stay on the host; the
  Neuron runtime moves them.
- Otherwise the **CPU**, with one intra-op thread per vCPU of the instance.

An ONNX model follows the same choice through ``onnx_providers`` (CUDA's
provider on the chosen GPU, else the CPU's), so the rule has this one home.

On an accelerator instance whose accelerator cannot be used (a GPU type but
torch sees no CUDA; an Inferentia type without an artifact or without the
Neuron package) the agent still serves on the CPU, and the choice carries a
``warning`` saying why, for the agent to log.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

DeviceKind = Literal["cuda", "neuron", "cpu"]
Requested = Literal["auto", "cpu", "cuda"]

HOST_THREADS = 2  # intra-op threads on the host when an accelerator does the work
NEURON_PACKAGES = ("torch_neuronx", "torch_neuron")  # inf2/trn1, inf1
NEURON_ACCELERATORS = ("inferentia", "trainium")


class DeviceUnavailable(Exception):
    """The device asked for explicitly is not on this machine; the message says why."""


@dataclass(frozen=True, slots=True)
class Hardware:
    """What this machine offers torch (``probe`` reads it; tests write it).

    ``accelerator`` is the instance's accelerator in the catalog's words
    ("cpu", "gpu", "inferentia", "trainium") when known, ``None`` when not.
    """

    cuda_available: bool
    cuda_devices: int
    neuron_package: str | None  # the importable Neuron torch package, if any
    vcpus: int
    accelerator: str | None = None


@dataclass(frozen=True, slots=True)
class DeviceChoice:
    """Where a model runs: ``device`` is the torch device its tensors go to."""

    kind: DeviceKind
    device: str
    threads: int  # torch intra-op threads
    why: str
    interop_threads: int | None = None  # None: leave torch's inter-op pool alone
    neuron_package: str | None = None  # imported before the artifact is loaded
    neuron_artifact: str | None = None  # the compiled model loaded instead of the source
    warning: str | None = None  # an accelerator this instance has goes unused

    @classmethod
    def cpu(cls, threads: int = 1, why: str = "the CPU (default)") -> DeviceChoice:
        """The CPU, as every runner ran before devices were chosen: one thread by default."""
        return cls(kind="cpu", device="cpu", threads=max(1, threads), why=why)

    def describe(self) -> str:
        return f"{self.kind} on {self.device}, {self.threads} intra-op thread(s) — {self.why}"


def select_device(
    hw: Hardware,
    *,
    neuron_artifact: str | None = None,
    requested: Requested = "auto",
    threads: int | None = None,
) -> DeviceChoice:
    """The device to serve on; ``threads`` overrides the intra-op thread count.

    ``requested="cuda"`` without a CUDA device raises ``DeviceUnavailable``
    (asked for explicitly, so not silently replaced); ``"cpu"`` always serves
    on the CPU; ``"auto"`` applies the rules in the module docstring.
    """
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    vcpus = max(1, hw.vcpus)
    host = threads or min(HOST_THREADS, vcpus)
    cuda = hw.cuda_available and hw.cuda_devices > 0
    if requested == "cuda" and not cuda:
        raise DeviceUnavailable(
            "--device cuda, but torch sees no CUDA device "
            "(a CPU-only torch build, no NVIDIA driver, or no GPU)"
        )
    if requested in ("auto", "cuda") and cuda:
        return DeviceChoice(
            kind="cuda",
            device="cuda:0",
            threads=host,
            interop_threads=1,
            why=f"torch sees {hw.cuda_devices} CUDA device(s); serving on cuda:0",
        )
    cpu_threads = threads or vcpus
    thread_note = "threads as given" if threads else f"one thread per vCPU ({vcpus})"
    if requested == "cpu":
        return DeviceChoice(
            kind="cpu",
            device="cpu",
            threads=cpu_threads,
            interop_threads=1,
            why=f"--device cpu; {thread_note}",
        )
    neuron_host = hw.accelerator is None or hw.accelerator in NEURON_ACCELERATORS
    if neuron_artifact and hw.neuron_package and neuron_host:
        return DeviceChoice(
            kind="neuron",
            device="cpu",  # inputs are host tensors; the Neuron runtime feeds the NeuronCore
            threads=host,
            interop_threads=1,
            neuron_package=hw.neuron_package,
            neuron_artifact=neuron_artifact,
            why=f"{hw.neuron_package} is installed and the model names {neuron_artifact}",
        )
    unused, note = _unused_accelerator(hw, neuron_artifact)
    why = f"{unused or note or 'no accelerator'}; the CPU, {thread_note}"
    return DeviceChoice(
        kind="cpu", device="cpu", threads=cpu_threads, interop_threads=1, why=why, warning=unused
    )


def _unused_accelerator(hw: Hardware, artifact: str | None) -> tuple[str | None, str | None]:
    """(why an accelerator this instance has goes unused, a note on an unused artifact).

    The first is a warning: the instance was bought for an accelerator the model
    does not use. The second is only said: a Neuron artifact named for a machine
    without Neuron (the same command line may start agents on every type).
    """
    packages = " nor ".join(NEURON_PACKAGES)
    if hw.accelerator == "gpu":
        return "GPU unused: torch sees no CUDA device (a CPU-only torch build or no driver)", None
    if hw.accelerator in NEURON_ACCELERATORS:
        name = hw.accelerator.capitalize()
        if not artifact:
            return (
                f"{name} unused: it needs a compiled Neuron artifact "
                "(models[].neuron_artifact, --neuron-artifact) and none is named",
                None,
            )
        return f"{name} unused: {artifact} is named but neither {packages} is installed", None
    if artifact and not hw.neuron_package:
        return None, f"Neuron artifact {artifact} unused: neither {packages} is installed"
    if artifact:
        return None, f"Neuron artifact {artifact} unused: this is a {hw.accelerator} instance"
    return None, None


def probe(vcpus: int | None = None, accelerator: str | None = None) -> Hardware:
    """Read this machine: CUDA as torch sees it, Neuron packages, vCPUs, accelerator devices.

    ``vcpus`` defaults to the CPUs this process may run on (``os.cpu_count()``
    where affinity is unknown); ``accelerator`` to what ``/dev`` shows: a
    Neuron device node means Inferentia (or Trainium), an NVIDIA one a GPU.
    """
    import torch  # imported here: the selection rules above need no torch

    cuda = bool(torch.cuda.is_available())
    count = torch.cuda.device_count() if cuda else 0
    package = next((p for p in NEURON_PACKAGES if importlib.util.find_spec(p) is not None), None)
    if vcpus is None:
        try:
            vcpus = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            vcpus = os.cpu_count() or 1
    if accelerator is None:
        if Path("/dev/neuron0").exists():
            accelerator = "inferentia"
        elif cuda or Path("/dev/nvidia0").exists():
            accelerator = "gpu"
    return Hardware(
        cuda_available=cuda,
        cuda_devices=count,
        neuron_package=package,
        vcpus=vcpus,
        accelerator=accelerator,
    )


OnnxProvider = str | tuple[str, dict[str, object]]


def onnx_providers(choice: DeviceChoice) -> list[OnnxProvider]:
    """onnxruntime's execution providers for ``choice``, most preferred first.

    CUDA runs on the chosen device with the CPU behind it for the operators CUDA
    lacks (onnxruntime places each node on the first provider that has it); every
    other choice, a NeuronCore included (it runs only compiled TorchScript), is the CPU.
    """
    if choice.kind == "cuda":
        _, _, index = choice.device.partition(":")
        device_id = int(index) if index else 0
        return [("CUDAExecutionProvider", {"device_id": device_id}), "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]
