"""Fit a simulation's forecaster the same way whatever vector width the CPU offers.

Why: the forecaster is fitted once per window and steers every plan after it, and a
seeded fit still came out different on different machines (Inception-v3 on Twitter
day 10, commit f9953df: mark $13.28 on one machine, $13.05 on another). The difference
is numerical: libraries pick kernels for the CPU they find, and a last-bit difference
in one feature grows through thousands of gradient steps.
Three of them reach the fit:

- numpy's vectorised math and reductions (AVX-512 against AVX2 loops differ in the
  last bit): held at numpy's baseline (x86-64-v2 for its wheels) with
  ``NPY_DISABLE_CPU_FEATURES``;
- MKL's BLAS (what ``torch`` multiplies with): pinned to its compatible code path with
  ``MKL_CBWR=COMPATIBLE``, Intel's documented way to the same results on Intel and
  AMD processors;
- oneDNN's LSTM, compiled for the CPU at run time: not used (``predictor.lstm``).

The first two are read when the libraries load, so the fit runs in a child process
started with them set, and writes the fitted model where the parent loads it from; the
parent's own numerics (the simulator's, the daemon's serving) are left alone. Measured
on one AVX-512 machine by emulating an AVX2 one (``ATEN_CPU_CAPABILITY=avx2``,
``MKL_ENABLE_INSTRUCTIONS=AVX2``, numpy's AVX-512 off): the fitted weights differ
without these settings and are identical with them (Inception-v3, Twitter day 10,
seed 0: mark $13.0255 native and $13.0807 emulated before, $13.0363 both ways after;
git history of experiments/table5/README.md, 2026-11-28).
Not every difference between machines is a vector width: with these settings a simulation
driven by the forecaster cost differently on an AMD EPYC than on the previous AVX-512
machine (the same run with a perfect forecast cost the same to the cent), and no
emulation on one CPU reproduces that (the same day-10 run: mark $13.0363 on the
first machine, $12.9235 on the EPYC, 0.9 % apart; with ``--predictor oracle``
$12.5112 on both; git history of experiments/table5/README.md, 2026-11-28). Other
architectures (ARM) get their own, equally repeatable, numbers.

Run as ``python -m mark.sim.pinned_fit SPEC HISTORY.npz OUT``.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from predictor.base import Forecaster, ForecasterError, History

MKL_PIN = {"MKL_CBWR": "COMPATIBLE"}


def pinned_env() -> dict[str, str]:
    """The settings the child is started with: MKL's compatible path, and every
    optimisation numpy dispatches to above its baseline turned off (on this numpy:
    x86-64-v3 and v4 and the AVX-512 groups; the baseline itself cannot be turned off,
    so a numpy built for a higher baseline keeps it)."""
    umath = importlib.import_module("numpy._core._multiarray_umath")
    dispatched: list[str] = list(getattr(umath, "__cpu_dispatch__", []))
    return {**MKL_PIN, "NPY_DISABLE_CPU_FEATURES": " ".join(dispatched)}


NUMERICS = "pinned-1"
"""Names these numerics in the forecaster cache's key: a model fitted otherwise is refitted."""

TAIL_LINES = 20  # of the child's stderr, in the error when it fails


def fit_pinned(spec: str, history: History, out: Path) -> Forecaster:
    """``spec`` (a predictor registry name) fitted on ``history`` with the pinned numerics,
    saved at ``out`` and loaded back; raises ``ForecasterError`` with the child's own
    error when the fit fails."""
    from predictor.registry import load

    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "history.npz"
        np.savez(src, values=history.values, start=np.array(str(history.start)))
        env = {**os.environ, **pinned_env()}
        done = subprocess.run(
            [sys.executable, "-m", "mark.sim.pinned_fit", spec, str(src), str(out)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-TAIL_LINES:])
        raise ForecasterError(f"fitting {spec!r} failed:\n{tail}")
    return load(out)


def main(argv: list[str]) -> int:
    from predictor.registry import create

    if len(argv) != 3:
        print("usage: python -m mark.sim.pinned_fit SPEC HISTORY.npz OUT", file=sys.stderr)
        return 2
    spec, src, out = argv
    with np.load(src, allow_pickle=False) as z:
        history = History(z["values"], np.datetime64(str(z["start"]), "m"))
    create(spec).fit(history).save(Path(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
