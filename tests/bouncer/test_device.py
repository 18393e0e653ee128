"""Device selection (pure), which accelerators a model can use, and the runner on its device.

This machine has no GPU and no Neuron device: the selection rules and the
CPU path run for real; the Neuron path runs with a stand-in package and a
plain TorchScript file as the "artifact"; the CUDA test is skipped unless
torch sees a CUDA device (on a GPU instance it runs unchanged).
"""

from __future__ import annotations

import sys
import types
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bouncer.contract import ModelContract, TensorSpec
from bouncer.device import (
    HOST_THREADS,
    DeviceChoice,
    DeviceUnavailable,
    Hardware,
    probe,
    select_device,
)
from bouncer.runner import ModelLoadError, ModelRunner
from bouncer.runtimes.torch_runtime import TorchRuntime
from mark.demo import save_torchscript
from provisioner.accelerators import usable


def hw(
    cuda: int = 0,
    neuron: str | None = None,
    vcpus: int = 4,
    accelerator: str | None = None,
) -> Hardware:
    return Hardware(
        cuda_available=cuda > 0,
        cuda_devices=cuda,
        neuron_package=neuron,
        vcpus=vcpus,
        accelerator=accelerator,
    )


@pytest.mark.parametrize(
    ("machine", "artifact", "kind", "device", "threads", "warned"),
    [
        (hw(cuda=1, accelerator="gpu"), None, "cuda", "cuda:0", HOST_THREADS, False),
        (hw(cuda=4, vcpus=48), "m.neuron.pt", "cuda", "cuda:0", HOST_THREADS, False),
        (hw(cuda=1, vcpus=1), None, "cuda", "cuda:0", 1, False),  # never more than vCPUs
        (hw(neuron="torch_neuronx", accelerator="inferentia"), "m.pt", "neuron", "cpu", 2, False),
        (hw(neuron="torch_neuron"), "m.pt", "neuron", "cpu", HOST_THREADS, False),  # inf1 SDK
        (hw(neuron="torch_neuronx", accelerator="inferentia"), None, "cpu", "cpu", 4, True),
        (hw(accelerator="inferentia"), "m.pt", "cpu", "cpu", 4, True),  # no Neuron package
        (hw(accelerator="gpu", vcpus=8), None, "cpu", "cpu", 8, True),  # CPU-only torch on g4dn
        (hw(vcpus=16, accelerator="cpu"), None, "cpu", "cpu", 16, False),
        (hw(vcpus=2), None, "cpu", "cpu", 2, False),
        (hw(vcpus=2), "m.pt", "cpu", "cpu", 2, False),  # an artifact on a CPU type: said, no alarm
        (hw(neuron="torch_neuronx", accelerator="cpu"), "m.pt", "cpu", "cpu", 4, False),
    ],
)
def test_auto_selection(
    machine: Hardware, artifact: str | None, kind: str, device: str, threads: int, warned: bool
) -> None:
    choice = select_device(machine, neuron_artifact=artifact)
    assert (choice.kind, choice.device, choice.threads) == (kind, device, threads)
    assert (choice.warning is not None) == warned
    assert choice.why
    if kind == "neuron":
        assert choice.neuron_artifact == artifact
        assert choice.neuron_package == machine.neuron_package


def test_an_inf_type_without_an_artifact_serves_on_the_cpu_and_says_why() -> None:
    choice = select_device(hw(neuron="torch_neuronx", vcpus=4, accelerator="inferentia"))
    assert choice.kind == "cpu" and choice.threads == 4
    assert choice.warning is not None and "compiled Neuron artifact" in choice.warning
    assert choice.warning in choice.why and "the CPU, one thread per vCPU (4)" in choice.why
    gpu = select_device(hw(accelerator="gpu"))
    assert gpu.warning is not None and "torch sees no CUDA device" in gpu.why
    missing = select_device(hw(accelerator="inferentia"), neuron_artifact="m.pt")
    assert missing.warning is not None and "torch_neuronx nor torch_neuron" in missing.warning


def test_asked_for_devices_and_thread_overrides() -> None:
    assert select_device(hw(cuda=1), requested="cpu").kind == "cpu"
    assert select_device(hw(cuda=1), requested="cpu").threads == 4
    assert select_device(hw(cuda=1), requested="cuda").device == "cuda:0"
    with pytest.raises(DeviceUnavailable, match="no CUDA device"):
        select_device(hw(accelerator="gpu"), requested="cuda")
    assert select_device(hw(vcpus=16), threads=1).threads == 1  # OMP_NUM_THREADS=1 locally
    assert select_device(hw(cuda=1), threads=6).threads == 6
    with pytest.raises(ValueError, match="at least 1"):
        select_device(hw(), threads=0)


def test_the_default_choice_is_todays_cpu_runner() -> None:
    default = DeviceChoice.cpu()
    assert (default.kind, default.device, default.threads) == ("cpu", "cpu", 1)
    assert default.interop_threads is None  # leaves the process's inter-op pool alone


def test_probe_reads_this_machine() -> None:
    found = probe()
    assert found.cuda_available == torch.cuda.is_available()
    assert found.vcpus >= 1 and found.cuda_devices == (
        torch.cuda.device_count() if found.cuda_available else 0
    )
    assert probe(vcpus=3, accelerator="cpu").vcpus == 3


@pytest.mark.parametrize(
    ("accelerator", "artifact", "ok"),
    [
        ("cpu", False, True),
        ("gpu", False, True),
        ("inferentia", True, True),
        ("inferentia", False, False),
        ("trainium", False, False),
        ("fpga", True, False),
    ],
)
def test_usable(accelerator: str, artifact: bool, ok: bool) -> None:
    can, why = usable(accelerator, artifact)
    assert can is ok
    assert (why == "") is ok


def test_usable_says_what_is_missing() -> None:
    assert usable("inferentia", False) == (
        False,
        "Inferentia needs a compiled Neuron artifact (models[].neuron_artifact)",
    )


# ---- the runner on its device ----


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(6, 3), torch.nn.ReLU())
    return save_torchscript(net.eval(), tmp_path_factory.mktemp("m") / "tiny.pt")


def tiny(artifact: str | Path) -> ModelContract:
    """The tiny model's contract: "input" float32 [2, 3] -> "output" float32 [3]."""
    return ModelContract(
        "tiny",
        "1",
        "torchscript",
        str(artifact),
        (TensorSpec("input", "float32", (2, 3)),),
        (TensorSpec("output", "float32", (3,)),),
    )


@pytest.fixture(autouse=True)
def _keep_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


class _Recorder(torch.nn.Module):
    """Wraps a model and notes whether each call ran under inference mode."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.modes: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.modes.append(torch.is_inference_mode_enabled())
        out: torch.Tensor = self.inner(x)
        self.modes.append(out.requires_grad)
        return out


def _direct(path: Path, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        model = torch.jit.load(str(path))  # type: ignore[no-untyped-call]
    with torch.no_grad():
        out: np.ndarray[Any, Any] = model(torch.from_numpy(x)).numpy()
    return out


def _torch(runner: ModelRunner) -> TorchRuntime:
    assert isinstance(runner.runtime, TorchRuntime)
    return runner.runtime


def test_runner_on_the_cpu_uses_the_chosen_threads_and_inference_mode(model_path: Path) -> None:
    choice = select_device(hw(vcpus=3))
    runner = ModelRunner(tiny(model_path), choice=choice, warm=True)
    assert runner.choice is choice and torch.get_num_threads() == 3
    x = np.random.default_rng(1).standard_normal((5, 2, 3)).astype(np.float32)
    assert np.array_equal(runner.run({"input": x})["output"], _direct(model_path, x))
    recorder = _Recorder(_torch(runner).module)
    _torch(runner).module = recorder
    runner.run({"input": x})
    assert recorder.modes == [True, False]  # inference mode on; the output needs no grad
    lat = runner.profile(sizes=(1, 4), runs=2)
    assert all(t > 0 for _, t in lat.points)


def test_the_chosen_threads_hold_on_a_worker_thread_that_predates_the_runner(
    model_path: Path,
) -> None:
    def threads_after(runner: ModelRunner | None) -> int:
        if runner is not None:
            runner.run({"input": np.zeros((1, 2, 3), dtype=np.float32)})
        return torch.get_num_threads()

    torch.set_num_threads(1)
    with ThreadPoolExecutor(max_workers=1) as worker:
        assert worker.submit(threads_after, None).result() == 1  # the thread exists, at 1
        runner = ModelRunner(tiny(model_path), choice=select_device(hw(vcpus=3)))
        assert worker.submit(threads_after, runner).result() == 3


def test_runner_without_a_choice_runs_as_before(model_path: Path) -> None:
    runner = ModelRunner(tiny(model_path))
    assert torch.get_num_threads() == 1 and runner.choice.kind == "cpu"
    x = np.ones((2, 2, 3), dtype=np.float32)
    assert np.array_equal(runner.run({"input": x})["output"], _direct(model_path, x))
    ModelRunner(tiny(model_path), choice=select_device(hw(vcpus=2)))  # inter-op set once


def test_runner_on_neuron_imports_the_package_and_loads_the_artifact(
    model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stand-in for torch_neuronx (its import registers the Neuron ops) and a plain
    TorchScript file for the artifact: the contract's artifact is not what gets loaded."""
    fake = types.ModuleType("fake_torch_neuronx")
    monkeypatch.setitem(sys.modules, "fake_torch_neuronx", fake)
    choice = select_device(
        hw(neuron="fake_torch_neuronx", accelerator="inferentia"), neuron_artifact=str(model_path)
    )
    assert choice.kind == "neuron"
    runner = ModelRunner(tiny(tmp_path / "nowhere.pt"), choice=choice, warm=True)
    x = np.ones((2, 2, 3), dtype=np.float32)
    assert np.array_equal(runner.run({"input": x})["output"], _direct(model_path, x))
    assert torch.get_num_threads() == HOST_THREADS
    missing = select_device(
        hw(neuron="no_such_neuron_pkg", accelerator="inferentia"), neuron_artifact=str(model_path)
    )
    with pytest.raises(ModelLoadError, match="cannot import no_such_neuron_pkg"):
        ModelRunner(tiny(model_path), choice=missing)
    gone = select_device(hw(neuron="fake_torch_neuronx"), neuron_artifact=str(tmp_path / "none.pt"))
    with pytest.raises(ModelLoadError, match=r"neuron_artifact: Neuron artifact .* is not a file"):
        ModelRunner(tiny(model_path), choice=gone)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device here")
def test_runner_on_cuda_puts_model_and_batches_on_the_gpu(model_path: Path) -> None:
    choice = select_device(probe())
    assert choice.kind == "cuda" and choice.device == "cuda:0"
    runner = ModelRunner(tiny(model_path), choice=choice, warm=True)
    assert all(p.device.type == "cuda" for p in _torch(runner).module.parameters())
    assert torch.get_num_threads() == choice.threads
    x = np.random.default_rng(2).standard_normal((16, 2, 3)).astype(np.float32)
    out = runner.run({"input": x})["output"]
    assert isinstance(out, np.ndarray) and out.shape == (16, 3)
    assert np.allclose(out, _direct(model_path, x), atol=1e-5)
    assert runner.timed({"input": x}) > 0
    lat = runner.profile(sizes=(1, 8), runs=3)
    assert all(t > 0 for _, t in lat.points)


def test_agent_device_flags(monkeypatch: pytest.MonkeyPatch, model_path: Path) -> None:
    from bouncer.agent import build_agent, choose_device, main

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # as the local world starts its agents
    local = choose_device("auto", None, None)
    assert local.threads == 1 and local.kind == ("cuda" if torch.cuda.is_available() else "cpu")
    assert choose_device("cpu", 2, None).threads == 2  # --threads wins over the environment
    monkeypatch.delenv("OMP_NUM_THREADS")
    if not torch.cuda.is_available():
        assert choose_device("auto", None, None).threads == probe().vcpus
        args = ["--model-source", str(model_path), "--input-shape", "2,3", "--device", "cuda"]
        assert main(args) == 2  # asked for CUDA on a machine without it: an error, not the CPU
    agent = build_agent(tiny(model_path), 1.0, None, choose_device("cpu", 2, None))
    assert agent.runner.choice.threads == 2 and torch.get_num_threads() == 2
