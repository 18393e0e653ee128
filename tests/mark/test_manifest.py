"""Model directories: the manifest, versions as subdirectories, and a repository of them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from mark.config import ModelSpec, load_settings
from mark.errors import ConfigError

SLO = {"rt_max_ms": 100, "sl_min": 0.99}
INPUTS = [{"name": "x", "dtype": "float16", "shape": [-1, 4]}]


def _dir(root: Path, name: str, manifest: dict[str, object], files: list[str]) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "model.yaml").write_text(yaml.safe_dump(manifest))
    for f in files:
        (d / f).parent.mkdir(parents=True, exist_ok=True)
        (d / f).write_bytes(b"")
    return d


def test_the_highest_version_is_served_with_its_format_default_artifact(tmp_path: Path) -> None:
    d = _dir(tmp_path, "ranker", {"format": "onnx", "inputs": INPUTS, "slo": SLO},
             ["1/model.onnx", "10/model.onnx", "2/model.onnx"])  # fmt: skip
    spec = ModelSpec.model_validate({"path": str(d)})
    assert (spec.name, spec.version, spec.model_format) == ("ranker", "10", "onnx")
    assert spec.source == str(d / "10" / "model.onnx")
    assert spec.input_tensor.shape == (-1, 4) and spec.input_tensor.dtype == "float16"
    assert spec.outputs[0].shape is None  # undeclared: learnt when checked
    pinned = ModelSpec.model_validate({"path": str(d), "version": "2"})
    assert pinned.source == str(d / "2" / "model.onnx")
    with pytest.raises(ValidationError, match="has versions 1, 2, 10, not 3"):
        ModelSpec.model_validate({"path": str(d), "version": "3"})


def test_keys_beside_path_override_the_manifest_and_paths_are_the_directorys(
    tmp_path: Path,
) -> None:
    d = _dir(
        tmp_path,
        "m",
        {"artifact": "weights/net.pt", "inputs": INPUTS, "slo": SLO, "profile": "p.json"},
        ["weights/net.pt"],
    )
    spec = ModelSpec.model_validate({"path": str(d), "slo": {"rt_max_ms": 50, "sl_min": 0.9}})
    assert spec.model_format == "torchscript" and spec.source == str(d / "weights" / "net.pt")
    assert spec.slo.rt_max_ms == 50 and spec.profile == d / "p.json"


@pytest.mark.parametrize(
    ("manifest", "files", "says"),
    [
        ({"inputs": INPUTS, "slo": SLO}, ["model.onnx", "model.pt"], "name the file"),
        ({"format": "onnx", "slo": SLO}, ["model.onnx"], "declare the model's input"),
        ({"format": "onnx", "inputs": [{"name": "x", "shape": [0]}], "slo": SLO}, [], "-1"),
        ({"format": "onnx", "inputs": INPUTS * 2, "slo": SLO}, [], "repeat a name"),
        ({"path": "elsewhere", "inputs": INPUTS, "slo": SLO}, [], "belongs in the configuration"),
    ],
)
def test_manifest_mistakes_name_what_to_fix(
    tmp_path: Path, manifest: dict[str, object], files: list[str], says: str
) -> None:
    d = _dir(tmp_path, "m", manifest, files)
    with pytest.raises(ValidationError, match=says):
        ModelSpec.model_validate({"path": str(d)})


def test_a_directory_without_a_manifest_says_how_to_write_one(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"has no model\.yaml"):
        ModelSpec.model_validate({"path": str(tmp_path)})


def test_a_repository_serves_every_model_directory_beside_the_listed_models(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "models"
    _dir(repo, "b", {"format": "onnx", "inputs": INPUTS, "slo": SLO}, ["model.onnx"])
    _dir(repo, "a", {"format": "onnx", "inputs": INPUTS, "slo": SLO}, ["1/model.onnx"])
    (repo / "notes").mkdir()  # no manifest: not a model
    listed = {"name": "c", "source": "m.pt", "input": {"shape": [2]}, "slo": SLO}
    s = load_settings(overrides={"repository": str(repo), "models": [listed]})
    assert [m.name for m in s.models] == ["c", "a", "b"]
    with pytest.raises(ConfigError, match="has no model directory"):
        load_settings(overrides={"repository": str(tmp_path / "models" / "notes")})
