"""The demo model: a small CNN trained offline on scikit-learn's bundled digits.

It makes `mark up` give real predictions on a laptop with no downloads: the
8×8 digit images ship with scikit-learn, training takes seconds on a CPU and is
deterministic for a seed, and the result is saved as TorchScript like any
user's model.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

DIGITS_SHAPE = (1, 8, 8)
DEMO_SOURCE = "mark.demo:digits_model"  # what the default configuration names


class DigitsCNN(nn.Module):
    """Two conv layers and a small head; input (N, 1, 8, 8) scaled to [0, 1], 10 logits out."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))  # type: ignore[no-any-return]


@dataclass(frozen=True)
class TrainedDigits:
    model: nn.Module
    test_accuracy: float
    train_size: int
    test_size: int


def load_digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    """Images as (N, 1, 8, 8) float32 in [0, 1] and labels as int64."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.from_numpy((data.images / 16.0).astype(np.float32)).unsqueeze(1)
    y = torch.from_numpy(data.target.astype(np.int64))
    return x, y


def train_digits(seed: int = 0, epochs: int = 15, batch_size: int = 64) -> TrainedDigits:
    """Train on a seeded 80/20 split and report accuracy on the held-out 20 %."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small trains fastest on one thread
    try:
        return _train(seed, epochs, batch_size)
    finally:
        torch.set_num_threads(threads)


def _train(seed: int, epochs: int, batch_size: int) -> TrainedDigits:
    torch.manual_seed(seed)
    x, y = load_digits_tensors()
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(x), generator=gen)
    cut = int(0.8 * len(x))
    train_idx, test_idx = perm[:cut], perm[cut:]
    model = DigitsCNN()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(epochs):
        model.train()
        order = train_idx[torch.randperm(len(train_idx), generator=gen)]
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            opt.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
    model.eval()
    with torch.inference_mode():
        pred = model(x[test_idx]).argmax(dim=1)
    acc = float((pred == y[test_idx]).float().mean())
    return TrainedDigits(model, acc, len(train_idx), len(test_idx))


def save_torchscript(model: nn.Module, path: Path) -> Path:
    """Script the model and write it atomically (a crash never leaves half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with warnings.catch_warnings():  # TorchScript is deprecated in torch 2.x but still the
        warnings.simplefilter("ignore", DeprecationWarning)  # one portable format users have
        torch.jit.save(torch.jit.script(model.eval()), str(tmp))
    os.replace(tmp, path)
    return path


def default_model_path(data_dir: Path | None = None) -> Path:
    if data_dir is None:
        env = os.environ.get("MARK_DATA_DIR")
        data_dir = Path(env) if env else Path.home() / ".local" / "share" / "mark"
    return data_dir / "models" / "digits.pt"


def ensure_demo_model(data_dir: Path | None = None) -> Path:
    """The demo model's TorchScript file, trained and saved first if it is not there yet."""
    path = default_model_path(data_dir)
    if not path.is_file():
        save_torchscript(train_digits().model, path)
    return path


def digits_model() -> torch.jit.ScriptModule:
    """Factory named by the default config: load the demo model, training it on first use."""
    return load_torchscript(ensure_demo_model())


def load_torchscript(path: Path) -> torch.jit.ScriptModule:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        module: torch.jit.ScriptModule = torch.jit.load(str(path), map_location="cpu")  # type: ignore[no-untyped-call]
    return module.eval()
