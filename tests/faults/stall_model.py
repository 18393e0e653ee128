"""The hung-model scenario's model: the demo model, which hangs inside one agent process.

It hangs in the agent whose process id is in the file named by
``MARK_TEST_STALL_FILE``, and only there: the other agents, agents started later
(their warm-up runs the model) and the Lambda runtimes run it normally, as when
the model is stuck on one instance. (``tests/e2e/stall_model.py`` hangs every
agent while its flag exists, a new agent's warm-up included.)
"""

from __future__ import annotations

import os
import time

import torch

from mark.demo import digits_model


def _stuck_here() -> bool:
    path = os.environ.get("MARK_TEST_STALL_FILE", "")
    try:
        with open(path) as f:
            return f.read().strip() == str(os.getpid())
    except OSError:
        return False


class StuckInOneAgent(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = digits_model()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _stuck_here():
            time.sleep(3600)
        out: torch.Tensor = self.inner(x)
        return out


def stalling_digits() -> torch.nn.Module:
    return StuckInOneAgent().eval()
