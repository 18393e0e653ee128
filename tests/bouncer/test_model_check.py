"""``check_model``: a good model passes (undeclared shapes filled in); each broken one
is refused with the model, the contract's field, what is wrong and the fix."""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path

import onnx
import pytest
import torch
from onnx import TensorProto, helper

from bouncer.contract import ModelContract, TensorSpec
from bouncer.model_check import ModelCheckError, check_model
from tests.model_zoo import (
    mlp_contract,
    mlp_module,
    mlp_torchscript,
    python_handler_contract,
    python_handler_dir,
    two_io_contract,
    two_io_onnx,
    two_io_torchscript,
)


def test_good_models_of_every_format_pass_unchanged(tmp_path: Path) -> None:
    good = [
        mlp_contract(str(mlp_torchscript(tmp_path / "mlp.pt"))),
        mlp_contract("tests.model_zoo:mlp_module"),
        two_io_contract("onnx", two_io_onnx(tmp_path / "two_io.onnx")),
        two_io_contract("torchscript", two_io_torchscript(tmp_path / "two_io.pt", as_dict=True)),
        python_handler_contract(python_handler_dir(tmp_path / "handler")),
    ]
    for contract in good:
        assert check_model(contract) == contract


def test_undeclared_output_shapes_are_filled_in_as_measured(tmp_path: Path) -> None:
    """A dimension that follows the sequence length comes back -1, the rest as measured."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["tokens"], ["act"])],
        "relu",
        [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["batch", "seq", 8])],
        [helper.make_tensor_value_info("act", TensorProto.FLOAT, ["batch", "seq", 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.save(model, str(tmp_path / "relu.onnx"))
    relu = ModelContract(
        "relu",
        "1",
        "onnx",
        str(tmp_path / "relu.onnx"),
        (TensorSpec("tokens", "float32", (-1, 8)),),
        (TensorSpec("act", "float32", None),),
    )
    assert check_model(relu).outputs == (TensorSpec("act", "float32", (-1, 8)),)
    two_io = two_io_contract("onnx", two_io_onnx(tmp_path / "two_io.onnx"))
    bare = replace(two_io, outputs=tuple(replace(t, shape=None) for t in two_io.outputs))
    assert check_model(bare).outputs == two_io.outputs


def _refused(contract: ModelContract) -> ModelCheckError:
    with pytest.raises(ModelCheckError) as err:
        check_model(contract)
    assert str(err.value).startswith(f"model {contract.name!r}: {err.value.field}: ")
    assert f". Fix: {err.value.fix}" in str(err.value)
    return err.value


def test_a_missing_artifact(tmp_path: Path) -> None:
    err = _refused(mlp_contract(str(tmp_path / "model.pt"), name="m"))
    assert err.field == "artifact"
    assert err.message == f"{tmp_path / 'model.pt'} does not exist"
    assert "put the TorchScript file there or set artifact" in err.fix


def test_a_factory_whose_module_does_not_exist() -> None:
    err = _refused(mlp_contract("no_such_pkg.models:build", name="m"))
    assert err.field == "artifact"
    assert "cannot import module 'no_such_pkg.models'" in err.message
    assert "No module named 'no_such_pkg'" in err.message
    assert "install the package" in err.fix


def test_a_state_dict_declared_torchscript(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    torch.save(mlp_module().state_dict(), path)
    err = _refused(mlp_contract(str(path), name="m"))
    assert err.field == "artifact"
    assert err.message == f"{path} is a state_dict (weights only), not a model"
    assert "torch.jit.save" in err.fix and "torch.onnx.export" in err.fix


def test_an_input_shape_the_model_cannot_take(tmp_path: Path) -> None:
    contract = mlp_contract(str(mlp_torchscript(tmp_path / "mlp.pt")), n_in=15, name="m")
    err = _refused(contract)
    assert err.field == "inputs[0].shape [15]"
    assert err.message == (
        "the model cannot run a batch of shape [2, 15]: "
        "mat1 and mat2 shapes cannot be multiplied (2x15 and 16x32)"
    )
    assert err.fix.startswith("set each input's shape and dtype to what the model takes")
    two_io = two_io_contract("onnx", two_io_onnx(tmp_path / "two_io.onnx"))
    narrow = replace(two_io, inputs=(TensorSpec("tokens", "float32", (-1, 7)), two_io.inputs[1]))
    err = _refused(narrow)  # onnxruntime names the input it rejects: that one is blamed
    assert err.field == "inputs[0].shape [-1, 7]"
    assert err.message.startswith("the model cannot run a batch of shape [2, 3, 7]: ")
    assert "Got: 7 Expected: 8" in err.message


class _Logits(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": x * 2.0}


def test_a_dict_output_under_another_name(tmp_path: Path) -> None:
    path = tmp_path / "logits.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(_Logits()), str(path))
    contract = replace(
        mlp_contract(str(path), n_in=4, name="m"), outputs=(TensorSpec("output", "float32", (4,)),)
    )
    err = _refused(contract)
    assert err.field == "outputs[0].name 'output'"
    assert err.message == "the model returns no output 'output'; it returns 'logits'"
    assert err.fix == "name the outputs as the model returns them ('logits')"


def test_an_output_shape_or_type_that_differs(tmp_path: Path) -> None:
    contract = mlp_contract(str(mlp_torchscript(tmp_path / "mlp.pt")), name="m")
    wide = replace(contract, outputs=(TensorSpec("output", "float32", (5,)),))
    assert _refused(wide).fix.startswith("set the shape to [4]")
    ints = replace(contract, outputs=(TensorSpec("output", "int64", (4,)),))
    assert _refused(ints).field == "outputs[0].dtype int64"
