"""A model for fault tests: the demo model, which hangs inside an agent once a flag exists.

Only an agent process (``python -m bouncer.agent``) hangs, and only while the
file named by ``MARK_TEST_STALL_FILE`` exists: the daemon's own profiling and
the Lambda runtimes run it normally, as a model stuck on one instance would be.
"""

from __future__ import annotations

import os
import sys
import time

import torch

from mark.demo import digits_model


def _in_agent() -> bool:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and spec.name == "bouncer.agent"


class Stalling(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = digits_model()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flag = os.environ.get("MARK_TEST_STALL_FILE", "")
        if flag and _in_agent() and os.path.exists(flag):
            time.sleep(3600)
        out: torch.Tensor = self.inner(x)
        return out


def stalling_digits() -> torch.nn.Module:
    return Stalling().eval()
