"""The spill handler as a plain function: what it answers for good and bad events."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lambda_handlers import spill
from tests.model_zoo import two_io_contract, two_io_onnx, two_io_reference

pytestmark = pytest.mark.filterwarnings(
    "ignore:`torch.jit.script` is deprecated:DeprecationWarning"
)


@pytest.fixture
def scripted(tmp_path: Path) -> tuple[str, torch.nn.Module]:
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Tanh()).eval()
    path = tmp_path / "model.pt"
    torch.jit.script(model).save(str(path))  # type: ignore[no-untyped-call]
    return str(path), model


def test_torchscript_model_runs_once_loaded_and_matches_a_direct_run(
    scripted: tuple[str, torch.nn.Module],
) -> None:
    source, model = scripted
    batch = [[0.1, 0.2, 0.3], [1.0, -1.0, 0.5]]
    first = spill.handler({"model": "m", "instances": batch, "source": source}, None)
    second = spill.handler({"model": "m", "instances": batch[:1], "source": source}, None)
    with torch.inference_mode():
        want = model(torch.tensor(batch))
    assert first["model"] == "m"
    assert first["cold_start"] is True and second["cold_start"] is False
    assert torch.allclose(torch.tensor(first["outputs"]), want)
    assert torch.allclose(torch.tensor(second["outputs"]), want[:1])


def test_factory_source_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(spill.SOURCE_ENV, "torch.nn:Identity")
    reply = spill.handler({"model": "id", "instances": [[1, 2], [3, 4]], "dtype": "int64"}, None)
    assert reply["outputs"] == [[1, 2], [3, 4]]


def test_empty_batch_is_a_warm_up_that_loads_the_model() -> None:
    reply = spill.handler({"model": "id", "instances": [], "source": "torch.nn:Flatten"}, None)
    assert reply == {"model": "id", "outputs": [], "cold_start": True}
    again = spill.handler({"model": "id", "instances": [], "source": "torch.nn:Flatten"}, None)
    assert again["cold_start"] is False


@pytest.mark.parametrize(
    ("event", "says"),
    [
        ([1, 2], "must be a JSON object"),
        ({"instances": [[1]]}, "'model' must be"),
        ({"model": "m", "instances": {"a": 1}}, "'instances' must be a JSON array"),
        ({"model": "m", "instances": [[1]], "dtype": "complex128"}, "'dtype' must be one of"),
        ({"model": "m", "instances": [[1]]}, "has no contract or source"),
        ({"model": "m", "instances": [[1]], "source": "no_such_pkg_x:f"}, "cannot import"),
        (
            {"model": "m", "instances": [[1]], "source": "torch.nn:NoSuchThing"},
            "has no factory 'NoSuchThing'",
        ),
        ({"model": "m", "instances": [[1]], "source": "builtins:dict"}, "builtins:dict"),
        ({"model": "m", "instances": [[1]], "source": "/no/such/model.pt"}, "does not exist"),
        ({"model": "m", "instances": [[1, 2], [3]], "source": "torch.nn:Identity"}, "rectangular"),
        ({"model": "m", "instances": [["a"]], "source": "torch.nn:Identity"}, "rectangular"),
    ],
)
def test_a_callers_mistake_is_an_error_reply_never_an_exception(event: Any, says: str) -> None:
    reply = spill.handler(event, None)
    assert set(reply) == {"error"}
    assert says in reply["error"]


def test_wrong_shape_for_the_model_is_an_error_reply(
    scripted: tuple[str, torch.nn.Module],
) -> None:
    source, _ = scripted
    reply = spill.handler({"model": "m", "instances": [[1.0, 2.0]], "source": source}, None)
    assert "cannot run this batch (shape [1, 2])" in reply["error"]


def test_a_file_that_is_not_torchscript_is_an_error_reply(tmp_path: Path) -> None:
    bad = tmp_path / "junk.pt"
    bad.write_bytes(b"not a model")
    reply = spill.handler({"model": "m", "instances": [[1]], "source": str(bad)}, None)
    assert "not a TorchScript file" in reply["error"]


def test_a_contract_in_the_event_runs_named_rows_and_answers_by_name(tmp_path: Path) -> None:
    """A model with several tensors (the ONNX one, a variable sequence length): rows are
    objects by input name, outputs objects by output name, cast to the declared types."""
    contract = two_io_contract("onnx", two_io_onnx(tmp_path / "two_io.onnx"))
    rng = np.random.default_rng(1)
    tokens = rng.random((2, 4, 8), dtype=np.float32)
    scale = rng.random((2, 1), dtype=np.float32)
    rows = [{"tokens": tokens[i].tolist(), "scale": scale[i].tolist()} for i in range(2)]
    event = {"model": "two_io", "instances": rows, "contract": json.loads(contract.to_json())}
    reply = spill.handler(event, None)
    want = two_io_reference(tokens, scale)
    for i, out in enumerate(reply["outputs"]):
        assert set(out) == {"pooled", "norm"}
        np.testing.assert_allclose(out["pooled"], want["pooled"][i], rtol=1e-6)
    bad = spill.handler({**event, "instances": [{"tokens": rows[0]["tokens"]}]}, None)
    assert "must hold the inputs ['tokens', 'scale']" in bad["error"]
