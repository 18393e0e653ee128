"""Each format's runtime serves what running the model directly gives, by name and in type.

The models come from ``tests.model_zoo``. This machine has no GPU: the CUDA paths
are the pure provider rule (``onnx_providers``) and the clear error a CPU-only
onnxruntime gives when CUDA is chosen; a session on a real GPU is not exercised.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from bouncer.contract import ContractError, ModelContract, TensorSpec
from bouncer.device import DeviceChoice, Hardware, onnx_providers, select_device
from bouncer.runner import ModelLoadError, ModelRunner
from tests.model_zoo import (
    TwoIO,
    mlp_contract,
    mlp_module,
    mlp_torchscript,
    python_handler_contract,
    python_handler_dir,
    python_handler_reference,
    two_io_contract,
    two_io_onnx,
    two_io_reference,
    two_io_torchscript,
)

ROOT = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(7)


def _two_io_batch(batch: int, seq: int) -> dict[str, np.ndarray[Any, Any]]:
    return {
        "tokens": RNG.standard_normal((batch, seq, 8)).astype(np.float32),
        "scale": RNG.standard_normal((batch, 1)).astype(np.float32),
    }


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("zoo")
    two_io_onnx(d / "two_io.onnx")
    two_io_torchscript(d / "two_io_tuple.pt")
    two_io_torchscript(d / "two_io_dict.pt", as_dict=True)
    mlp_torchscript(d / "mlp.pt")
    python_handler_dir(d / "handler")
    return d


def test_onnx_equals_the_session_run_directly_for_two_sequence_lengths(zoo: Path) -> None:
    runner = ModelRunner(two_io_contract("onnx", zoo / "two_io.onnx"), warm=True)
    direct = ort.InferenceSession(str(zoo / "two_io.onnx"), providers=["CPUExecutionProvider"])
    for seq in (3, 11):
        batch = _two_io_batch(4, seq)
        out = runner.run(batch)
        pooled, norm = direct.run(["pooled", "norm"], batch)
        assert np.array_equal(out["pooled"], pooled) and np.array_equal(out["norm"], norm)
        ref = two_io_reference(batch["tokens"], batch["scale"])
        assert all(np.allclose(out[k], ref[k], atol=1e-5) for k in ref)
        assert out["pooled"].shape == (4, 8) and out["norm"].shape == (4, 1)


@pytest.mark.parametrize("artifact", ["two_io_tuple.pt", "two_io_dict.pt"])
def test_torchscript_with_two_inputs_equals_the_module(zoo: Path, artifact: str) -> None:
    """A tuple is taken in the declared order, a dict by name; inputs go in positionally."""
    runner = ModelRunner(two_io_contract("torchscript", zoo / artifact))
    for seq in (2, 9):
        batch = _two_io_batch(3, seq)
        out = runner.run(batch)
        pooled, norm = TwoIO()(torch.from_numpy(batch["tokens"]), torch.from_numpy(batch["scale"]))
        assert np.array_equal(out["pooled"], pooled.numpy())
        assert np.array_equal(out["norm"], norm.numpy())


def test_a_factory_and_its_torchscript_serve_the_same_numbers(zoo: Path) -> None:
    x = RNG.standard_normal((5, 16)).astype(np.float32)
    with torch.no_grad():
        direct = mlp_module()(torch.from_numpy(x)).numpy()
    for artifact in (str(zoo / "mlp.pt"), "tests.model_zoo:mlp_module"):
        contract = mlp_contract(artifact)
        out = ModelRunner(contract).run({"input": x})
        assert np.allclose(out["output"], direct, atol=1e-6), contract.format
    assert mlp_contract("tests.model_zoo:mlp_module").format == "pytorch"


def test_python_handler_runs_preprocess_predict_postprocess(zoo: Path) -> None:
    runner = ModelRunner(python_handler_contract(zoo / "handler"))
    x = RNG.standard_normal((6, 4)).astype(np.float32)
    out = runner.run({"x": x})
    ref = python_handler_reference(x)
    assert np.allclose(out["scores"], ref["scores"]) and np.array_equal(out["label"], ref["label"])
    assert out["label"].dtype == np.int64


def test_python_handler_by_file_and_class_name_without_pre_or_postprocess(tmp_path: Path) -> None:
    """Two handlers named alike load as separate modules; predict alone may return one array."""
    for k in (2, 3):
        (tmp_path / f"h{k}.py").write_text(
            f"class Times:\n    def __init__(self, d):\n        self.k = {k}\n"
            "    def predict(self, inputs):\n        return inputs['x'] * self.k\n"
        )
    specs = ((TensorSpec("x", "int64", (2,)),), (TensorSpec("y", "int64", (2,)),))
    runners = [
        ModelRunner(
            ModelContract("times", "1", "python", str(tmp_path / f"h{k}.py"), *specs, "Times")
        )
        for k in (2, 3)
    ]
    x = np.array([[1, 2], [3, 4]])
    assert [r.run({"x": x})["y"].tolist() for r in runners] == [(x * 2).tolist(), (x * 3).tolist()]


def _cast_onnx(path: Path) -> Path:
    """int64 ids [batch, -1] -> "total" float16 [batch]: the sum of the ids, as float16."""
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["ids"], ["half"], to=TensorProto.FLOAT16),
            helper.make_node("ReduceSum", ["half", "axis"], ["total"], keepdims=0),
        ],
        "cast",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("total", TensorProto.FLOAT16, ["batch"])],
        initializer=[helper.make_tensor("axis", TensorProto.INT64, [1], [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("declared", ["float16", "float32"])
def test_int64_inputs_and_outputs_cast_to_the_declared_type(tmp_path: Path, declared: str) -> None:
    contract = ModelContract(
        "cast",
        "1",
        "onnx",
        str(_cast_onnx(tmp_path / "cast.onnx")),
        (TensorSpec("ids", "int64", (-1,)),),
        (TensorSpec("total", declared, ()),),
    )
    out = ModelRunner(contract).run({"ids": np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int64)})
    assert out["total"].dtype == np.dtype(declared)
    assert out["total"].tolist() == [6.0, 15.0]


def test_a_torch_float32_output_declared_float16_comes_back_float16(zoo: Path) -> None:
    contract = mlp_contract(str(zoo / "mlp.pt"))
    half = replace(contract, outputs=(TensorSpec("output", "float16", (4,)),))
    x = RNG.standard_normal((3, 16)).astype(np.float32)
    out = ModelRunner(half).run({"input": x})
    assert out["output"].dtype == np.float16
    assert np.array_equal(
        out["output"], ModelRunner(contract).run({"input": x})["output"].astype(np.float16)
    )


def test_onnx_names_that_are_not_the_graphs_fail_at_load_naming_both(zoo: Path) -> None:
    good = two_io_contract("onnx", zoo / "two_io.onnx")
    bad_in = replace(good, inputs=(TensorSpec("tok", "float32", (-1, 8)), good.inputs[1]))
    with pytest.raises(ModelLoadError, match=r"inputs \('scale', 'tok'\) .* \('scale', 'tokens'\)"):
        ModelRunner(bad_in)
    bad_out = replace(good, outputs=(TensorSpec("mean", "float32", (8,)),))
    with pytest.raises(ModelLoadError, match=r"outputs 'mean' .* 'norm', 'pooled'") as err:
        ModelRunner(bad_out)
    assert err.value.field == "outputs" and "model 'two_io'" in str(err.value)
    subset = replace(good, outputs=(TensorSpec("norm", "float32", None),))
    assert list(ModelRunner(subset).run(_two_io_batch(2, 3))) == ["norm"]


def test_torch_results_that_do_not_match_the_declared_outputs(zoo: Path) -> None:
    contract = two_io_contract("torchscript", zoo / "two_io_dict.pt")
    renamed = replace(contract, outputs=(TensorSpec("output", "float32", None),))
    with pytest.raises(
        ContractError, match="gave no output 'output' \\(it gave 'pooled', 'norm'\\)"
    ):
        ModelRunner(renamed).run(_two_io_batch(2, 3))
    one = replace(two_io_contract("torchscript", zoo / "two_io_tuple.pt"), outputs=renamed.outputs)
    with pytest.raises(ContractError, match="returned 2 tensors, the manifest declares 1"):
        ModelRunner(one).run(_two_io_batch(2, 3))
    mlp = mlp_contract(str(zoo / "mlp.pt"))
    two = replace(mlp, outputs=(*mlp.outputs, TensorSpec("extra", "float32", None)))
    with pytest.raises(ContractError, match="returned one tensor, the manifest declares 2"):
        ModelRunner(two).run({"input": np.zeros((1, 16), np.float32)})


def test_a_batch_missing_an_input_or_disagreeing_on_its_size_is_refused(zoo: Path) -> None:
    runner = ModelRunner(two_io_contract("onnx", zoo / "two_io.onnx"))
    with pytest.raises(ContractError, match="needs input 'scale'"):
        runner.run({"tokens": np.zeros((2, 3, 8), np.float32)})
    bad = {"tokens": np.zeros((2, 3, 8), np.float32), "scale": np.zeros((3, 1), np.float32)}
    with pytest.raises(ContractError, match=r"disagree on the batch size: \[2, 3\]"):
        runner.run(bad)


def test_profile_measures_every_size_non_decreasing(zoo: Path) -> None:
    lat = ModelRunner(two_io_contract("onnx", zoo / "two_io.onnx")).profile(sizes=(1, 4, 2), runs=2)
    sizes = [b for b, _ in lat.points]
    times = [t for _, t in lat.points]
    assert sizes == [1, 2, 4] and times == sorted(times) and times[0] > 0


def _hw(cuda: int = 0) -> Hardware:
    return Hardware(cuda_available=cuda > 0, cuda_devices=cuda, neuron_package=None, vcpus=4)


def test_onnx_providers_follow_the_device_choice() -> None:
    assert onnx_providers(DeviceChoice.cpu()) == ["CPUExecutionProvider"]
    assert onnx_providers(select_device(_hw(cuda=1))) == [
        ("CUDAExecutionProvider", {"device_id": 0}),
        "CPUExecutionProvider",
    ]
    second = DeviceChoice(kind="cuda", device="cuda:1", threads=2, why="test")
    assert onnx_providers(second)[0] == ("CUDAExecutionProvider", {"device_id": 1})
    neuron = DeviceChoice(kind="neuron", device="cpu", threads=2, why="test")
    assert onnx_providers(neuron) == ["CPUExecutionProvider"]


@pytest.mark.skipif(
    "CUDAExecutionProvider" in ort.get_available_providers(), reason="onnxruntime-gpu is installed"
)
def test_cuda_chosen_with_a_cpu_only_onnxruntime_says_which_package_to_install(zoo: Path) -> None:
    with pytest.raises(ModelLoadError, match="onnxruntime-gpu") as err:
        ModelRunner(two_io_contract("onnx", zoo / "two_io.onnx"), choice=select_device(_hw(cuda=1)))
    assert "CUDAExecutionProvider" in str(err.value) and err.value.field == "device"


def test_load_errors_name_the_model_the_problem_and_the_fix(zoo: Path, tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not a model")
    onnx_contract = two_io_contract("onnx", zoo / "two_io.onnx")
    cases: list[tuple[ModelContract, str]] = [
        (mlp_contract(str(tmp_path / "none.pt")), r"artifact: .*none\.pt does not exist; put"),
        (
            replace(onnx_contract, artifact=str(zoo / "mlp.pt")),
            "not an ONNX model .*set format to torchscript",
        ),
        (replace(onnx_contract, artifact=str(text)), "not an ONNX model .*torch.onnx.export"),
        (mlp_contract(str(text)), "not a TorchScript file .*set format to onnx"),
        (mlp_contract(str(zoo / "two_io.onnx")), "not a TorchScript file .*set format to onnx"),
        (mlp_contract("tests.model_zoo:no_such"), "has no factory 'no_such'"),
        (mlp_contract("tests.model_zoo:HANDLER_WEIGHTS"), "has no factory"),
        (mlp_contract("tests.model_zoo:two_io_reference"), "failed: TypeError"),
        (
            replace(mlp_contract("x:y"), artifact="tests.model_zoo"),
            "is not 'package.module:factory'",
        ),
        (
            replace(python_handler_contract(zoo / "handler"), handler="Nope"),
            "no class 'Nope' \\(it defines Model\\); set handler",
        ),
        (python_handler_contract(tmp_path), r"model\.py is not a Python file"),
    ]
    for contract, pattern in cases:
        with pytest.raises(ModelLoadError, match=pattern) as err:
            ModelRunner(contract)
        assert str(err.value).startswith(f"model {contract.name!r}: ")


def test_an_onnx_model_is_served_without_importing_torch(zoo: Path) -> None:
    """Lambda's cold start: the ONNX path must not pay for torch's import."""
    code = (
        "import sys, numpy as np\n"
        "from bouncer.contract import ModelContract, TensorSpec\n"
        "from bouncer.runner import ModelRunner\n"
        f"c = ModelContract('m', '1', 'onnx', {str(zoo / 'two_io.onnx')!r},"
        " (TensorSpec('tokens', 'float32', (-1, 8)), TensorSpec('scale', 'float32', (1,))),"
        " (TensorSpec('pooled', 'float32', (8,)),))\n"
        "out = ModelRunner(c).run({'tokens': np.ones((2, 3, 8), 'float32'),"
        " 'scale': np.ones((2, 1), 'float32')})\n"
        "assert out['pooled'].shape == (2, 8)\n"
        "print('torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
