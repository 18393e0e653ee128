"""A model's variants as a manifest declares them: the most accurate is the model's own
artifact, the floor must be reachable, every variant is checked to serve the model's
interface, and the contract carries them to agents."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from bouncer.contract import ModelContract
from bouncer.model_check import ModelCheckError, check_model
from mark.config import ModelSpec
from mark.demo import save_torchscript


def _save(path: Path, out: int, seed: int = 0) -> None:
    torch.manual_seed(seed)
    save_torchscript(torch.nn.Sequential(torch.nn.Linear(4, out)).eval(), path)


def _model_dir(tmp_path: Path, floor: str = "0.75", small_out: int = 2) -> Path:
    d = tmp_path / "pair"
    (d / "1").mkdir(parents=True)
    _save(d / "1" / "large.pt", 2, seed=1)
    _save(d / "1" / "small.pt", small_out, seed=2)
    (d / "model.yaml").write_text(
        "format: torchscript\n"
        "inputs: [{name: input, dtype: float32, shape: [4]}]\n"
        "outputs: [{name: output, dtype: float32, shape: [2]}]\n"
        f"slo: {{rt_max_ms: 200, sl_min: 0.98, accuracy_floor: {floor}}}\n"
        "variants:\n"
        "  - {name: small, artifact: small.pt, accuracy: 0.70, metric: top-1}\n"
        "  - {name: large, artifact: large.pt, accuracy: 0.80, metric: top-1}\n"
    )
    return d


def test_the_most_accurate_variant_is_the_models_own_artifact(tmp_path: Path) -> None:
    d = _model_dir(tmp_path)
    spec = ModelSpec.model_validate({"path": str(d)})
    assert spec.source == str(d / "1" / "large.pt")
    assert [v.name for v in spec.variants] == ["large", "small"]
    assert spec.accuracy_floor == 0.75
    contract = spec.contract()
    assert [(v.name, v.accuracy) for v in contract.variants] == [("large", 0.8), ("small", 0.7)]
    assert contract.variant("small").artifact == str(d / "1" / "small.pt")
    assert ModelContract.from_json(contract.to_json()) == contract  # as agents get it
    assert check_model(contract).outputs == contract.outputs


def test_without_a_floor_the_most_accurate_always_serves(tmp_path: Path) -> None:
    d = _model_dir(tmp_path)
    spec = ModelSpec.model_validate({"path": str(d), "slo": {"rt_max_ms": 200, "sl_min": 0.98}})
    assert spec.accuracy_floor == 0.8


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            {"slo": {"rt_max_ms": 200, "sl_min": 0.98, "accuracy_floor": 0.9}},
            "lower it to at most 0.8",
        ),
        ({"source": "x.pt"}, "give each variant its 'artifact', and none to the model"),
    ],
)
def test_a_floor_no_variant_reaches_or_a_second_artifact_is_refused(
    tmp_path: Path, change: dict[str, object], says: str
) -> None:
    d = _model_dir(tmp_path)
    with pytest.raises(ValidationError, match=says):
        ModelSpec.model_validate({"path": str(d), **change})


def test_a_floor_needs_variants_and_names_are_unique() -> None:
    plain = {
        "name": "m",
        "source": "m.pt",
        "input": {"shape": [4]},
        "slo": {"rt_max_ms": 100, "sl_min": 0.98, "accuracy_floor": 0.7},
    }
    with pytest.raises(ValidationError, match="needs variants with their accuracies"):
        ModelSpec.model_validate(plain)
    twice = {"name": "a", "source": "a.pt", "accuracy": 0.8, "metric": "top-1"}
    with pytest.raises(ValidationError, match="variants repeat a name"):
        ModelSpec.model_validate(
            {**plain, "source": None, "variants": [twice, {**twice, "accuracy": 0.7}]}
        )


def test_a_variant_with_other_outputs_fails_the_check_naming_it(tmp_path: Path) -> None:
    d = _model_dir(tmp_path, small_out=3)
    contract = ModelSpec.model_validate({"path": str(d)}).contract()
    with pytest.raises(ModelCheckError, match="variant 'small'") as err:
        check_model(contract)
    assert "every variant must take the model's inputs and give its outputs" in str(err.value)
