"""Tiny torch models the spill handler loads by import path in the runtime processes.

Weights come from a fixed seed, so the test process builds the very same model
and can compare the Lambda's outputs with a direct run.
"""

from __future__ import annotations

import torch
from torch import nn

IN_FEATURES = 4


class FixtureFault(Exception):
    """A bug inside a model (not the caller's fault): must surface as a Lambda function error."""


def tiny_mlp() -> nn.Module:
    """4 → 8 → 3 with deterministic weights."""
    gen = torch.Generator().manual_seed(1234)
    model = nn.Sequential(nn.Linear(IN_FEATURES, 8), nn.ReLU(), nn.Linear(8, 3))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    return model


class _Exploding(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise FixtureFault(f"exploded on a batch of {x.shape[0]}")


def exploding() -> nn.Module:
    return _Exploding()


def not_a_module() -> object:
    return {"weights": [1, 2, 3]}
