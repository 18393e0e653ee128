"""The demo model is a real, accurate, deterministic torch model."""

from __future__ import annotations

from pathlib import Path

import torch

from mark.demo import load_digits_tensors, load_torchscript, save_torchscript, train_digits


def test_demo_cnn_learns_digits_and_round_trips_as_torchscript(tmp_path: Path) -> None:
    a = train_digits(seed=1, epochs=4)
    assert a.test_accuracy > 0.9  # chance is 0.1
    path = save_torchscript(a.model, tmp_path / "m" / "digits.pt")
    loaded = load_torchscript(path)
    x, _ = load_digits_tensors()
    with torch.inference_mode():
        assert torch.equal(loaded(x[:32]).argmax(1), a.model(x[:32]).argmax(1))
    b = train_digits(seed=1, epochs=4)
    with torch.inference_mode():
        assert torch.allclose(a.model(x[:8]), b.model(x[:8]))  # same seed, same model
