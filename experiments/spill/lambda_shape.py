"""Measure how a model's batch latency grows with the batch on two CPU threads: the shape
the simulator gives the spill function's batch curve (``mark/sim/models.py``).

A Lambda function at 3,072 MB has about 1.7 vCPUs (1,769 MB is one, AWS Lambda
developer guide, "Configuring function memory"), so two threads on this machine stand in
for it. Only the shape T_k / T_1 is kept; the paper's measured (or derived) Lambda T_1
scales it. The model is the LSTM-ptb of the paper (Zaremba et al.'s "medium" language
model: 2 layers of 650, a 10,000-word vocabulary, 35 steps per request), built in torch
with random weights (the time does not depend on them). Inception-v3 is not measured
here: no torchvision builds for this torch; it keeps k × T_1 (no batching gain).

    .venv/bin/python experiments/spill/lambda_shape.py > mark/sim/data/lambda-batch-shapes.json
"""

from __future__ import annotations

import json
import statistics
import time

import torch
from torch import nn

from mark.profile_files import this_hardware

BATCHES = (1, 2, 4, 8, 16)
REPEAT = 30


class PtbLstm(nn.Module):
    def __init__(self, vocab: int = 10_000, hidden: int = 650, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.lstm = nn.LSTM(hidden, hidden, layers, batch_first=True)
        self.decode = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(tokens))
        return self.decode(out)


def median_s(model: nn.Module, batch: int) -> float:
    x = torch.randint(0, 10_000, (batch, 35))
    with torch.inference_mode():
        for _ in range(3):
            model(x)
        times = []
        for _ in range(REPEAT):
            t = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(2)
    model = PtbLstm().eval()
    t = {b: median_s(model, b) for b in BATCHES}
    doc = {
        "about": "T_k / T_1 of a batch of k on two CPU threads, the shape of the spill "
        "function's batch curve in the simulator; produced by experiments/spill/lambda_shape.py",
        "machine": {"cpu": this_hardware("cpu")["cpu"], "threads": 2},
        "shapes": {
            "lstm-ptb": {
                "model": "PTB LSTM medium (2 x 650, vocab 10,000, 35 steps), torch "
                + torch.__version__,
                "t1_ms": round(t[1] * 1000, 2),
                "ratio": {str(b): round(t[b] / t[1], 3) for b in BATCHES},
            }
        },
    }
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
