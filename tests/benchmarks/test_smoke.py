"""Every script in ``benchmarks/`` runs, briefly, and prints its figures.

Nothing else ran them, so one rotted unseen (``bench_frontend.py`` met the agent token
and the agent's changed health reply). Each runs here for a few seconds with small
arguments; the test asserts that it exits cleanly and prints the lines that carry its
figures, not what the figures are (a busy CI machine is no place to judge speed).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

RUNS = {
    "bench_frontend.py": (
        ["--seconds", "1", "--repeats", "1", "--rate", "100", "--think-connections", "4"],
        [
            r"direct to agent\s+p50\s+[\d.]+ ms\s+p99\s+[\d.]+ ms",
            r"through frontend\s+p50\s+[\d.]+ ms",
            r"frontend adds\s+p50\s+-?[\d.]+ ms",
            r"maximum sustained rate through the frontend .*: \d+ req/s",
        ],
    ),
    "bench_overload.py": (
        ["--seconds", "3"],
        [r"sent", r"lost"],
    ),
    "bench_planner.py": (
        ["2"],
        [r"max [\d.]+ ms over 2 runs"],
    ),
    "bench_predictor.py": (
        ["--epochs", "1", "--calls", "3"],
        [r"training on \d+ minutes .*: [\d.]+ s", r"one 60-step forecast: median [\d.]+ ms"],
    ),
    "bench_simulator.py": (
        ["--hours", "0.1", "--policies", "sagemaker"],
        [r"arrivals: [\d,]+ requests", r"sagemaker: [\d,]+ requests in [\d.]+ s"],
    ),
    "greedy_vs_milp.py": (
        ["2"],
        [r"deferred launches", r"paper \(launch all\)"],
    ),
}


def test_every_benchmark_has_a_smoke_run() -> None:
    scripts = {p.name for p in (ROOT / "benchmarks").glob("*.py")}
    assert scripts == set(RUNS), "give each script in benchmarks/ a smoke run here"


@pytest.mark.parametrize("script", sorted(RUNS))
def test_the_benchmark_runs_and_prints_its_figures(script: str) -> None:
    args, expected = RUNS[script]
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for pattern in expected:
        assert re.search(pattern, done.stdout), (pattern, done.stdout[-3000:])
