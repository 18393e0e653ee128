"""`mark config check` loads every model and runs it once: each broken model of the issue
exits non-zero naming the model, the field and the fix, before anything is created."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml

from tests.model_zoo import mlp_module, mlp_torchscript, two_io_onnx

ROOT = Path(__file__).resolve().parents[2]


class _Logits(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": x * 2.0}


def _model_dir(tmp: Path, manifest: dict[str, object]) -> Path:
    d = tmp / "models" / "m"
    d.mkdir(parents=True, exist_ok=True)
    (d / "model.yaml").write_text(yaml.safe_dump(manifest))
    return d


def _check(tmp: Path) -> subprocess.CompletedProcess[str]:
    cfg = tmp / "mark.yaml"
    cfg.write_text(yaml.safe_dump({"repository": str(tmp / "models"), "data_dir": str(tmp)}))
    return subprocess.run(
        [sys.executable, "-m", "mark.cli.main", "--config", str(cfg), "config", "check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


SLO = {"rt_max_ms": 200, "sl_min": 0.98}
MLP_IN = [{"name": "input", "dtype": "float32", "shape": [16]}]


def _missing_file(tmp: Path) -> dict[str, object]:
    return {"format": "torchscript", "artifact": "gone.pt", "inputs": MLP_IN, "slo": SLO}


def _missing_factory(tmp: Path) -> dict[str, object]:
    return {"format": "pytorch", "source": "no_such_pkg.models:make", "inputs": MLP_IN, "slo": SLO}


def _state_dict(tmp: Path) -> dict[str, object]:
    (tmp / "models" / "m").mkdir(parents=True, exist_ok=True)
    torch.save(mlp_module().state_dict(), tmp / "models" / "m" / "model.pt")
    return {"format": "torchscript", "inputs": MLP_IN, "slo": SLO}


def _narrow_input(tmp: Path) -> dict[str, object]:
    mlp_torchscript(tmp / "models" / "m" / "model.pt")
    inputs = [{"name": "input", "dtype": "float32", "shape": [15]}]
    return {"format": "torchscript", "inputs": inputs, "slo": SLO}


def _dict_output(tmp: Path) -> dict[str, object]:
    path = tmp / "models" / "m" / "model.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(_Logits()), str(path))
    inputs = [{"name": "input", "dtype": "float32", "shape": [4]}]
    return {"format": "torchscript", "inputs": inputs, "slo": SLO}


@pytest.mark.parametrize(
    ("broken", "says"),
    [
        (_missing_file, ["artifact", "gone.pt", "does not exist"]),
        (_missing_factory, ["no_such_pkg", "install the package"]),
        (_state_dict, ["state_dict", "torch.jit.save", "torch.onnx.export"]),
        (_narrow_input, ["inputs[0].shape [15]", "2x15 and 16x32", "Fix:"]),
        (_dict_output, ["'output'", "'logits'", "Fix:"]),
    ],
)
def test_a_broken_model_fails_the_check_naming_the_model_field_and_fix(
    tmp_path: Path, broken: object, says: list[str]
) -> None:
    manifest = broken(tmp_path)  # type: ignore[operator]
    _model_dir(tmp_path, manifest)
    out = _check(tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    err = " ".join(out.stderr.split())
    assert "model 'm'" in err
    for part in says:
        assert part in err, (part, err)
    assert not (tmp_path / "mark.db").exists()  # nothing created


def doubling_onnx(path: Path) -> Path:
    """An ONNX model ``y = 2x`` with a variable last dimension: input "x", output "y"."""
    from onnx import TensorProto, helper, save_model

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "len"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "len"])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["y"])], "g", [x], [y], [two])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    save_model(model, str(path))
    return path


def test_a_good_onnx_model_directory_passes(tmp_path: Path) -> None:
    doubling_onnx(tmp_path / "models" / "m" / "2" / "model.onnx")
    inputs = [{"name": "x", "dtype": "float32", "shape": [-1]}]
    _model_dir(
        tmp_path, {"format": "onnx", "inputs": inputs, "outputs": [{"name": "y"}], "slo": SLO}
    )
    out = _check(tmp_path)
    assert out.returncode == 0, out.stderr
    assert "1 model(s) loaded and run" in out.stdout


def test_a_model_of_two_tensors_each_way_passes_and_a_wrong_name_does_not(
    tmp_path: Path,
) -> None:
    two_io_onnx(tmp_path / "models" / "m" / "model.onnx")
    tensors = {
        "inputs": [
            {"name": "tokens", "dtype": "float32", "shape": [-1, 8]},
            {"name": "scale", "dtype": "float32", "shape": [1]},
        ],
        "outputs": [{"name": "pooled", "shape": [8]}, {"name": "norm", "shape": [1]}],
    }
    _model_dir(tmp_path, {"format": "onnx", **tensors, "slo": SLO})
    assert _check(tmp_path).returncode == 0
    tensors["inputs"][1]["name"] = "weight"
    _model_dir(tmp_path, {"format": "onnx", **tensors, "slo": SLO})
    out = _check(tmp_path)
    err = " ".join(out.stderr.split())
    assert out.returncode == 1 and "model 'm'" in err and "'weight'" in err and "'scale'" in err


def test_models_list_shows_each_model_of_the_repository(tmp_path: Path) -> None:
    doubling_onnx(tmp_path / "models" / "m" / "2" / "model.onnx")
    inputs = [{"name": "x", "dtype": "float32", "shape": [-1]}]
    _model_dir(
        tmp_path, {"format": "onnx", "inputs": inputs, "outputs": [{"name": "y"}], "slo": SLO}
    )
    cfg = tmp_path / "mark.yaml"
    cfg.write_text(
        yaml.safe_dump({"repository": str(tmp_path / "models"), "data_dir": str(tmp_path)})
    )
    base = [sys.executable, "-m", "mark.cli.main", "--config", str(cfg), "models", "list"]
    listed = subprocess.run(
        [*base, "--format", "json", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    (model,) = json.loads(listed.stdout)
    assert (model["name"], model["version"], model["format"]) == ("m", "2", "onnx")
    assert model["artifact"] == str(tmp_path / "models" / "m" / "2" / "model.onnx")
    assert model["outputs"] == [{"name": "y", "dtype": "float32", "shape": [-1]}]  # learnt
