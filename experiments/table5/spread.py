"""Table 5's ratios over seeds and windows: mean, spread and range, not one run.

For each model, `mark simulate` runs on every (window, seed) pair with the policies
mark, mark-spot, sagemaker and clairvoyant (`ec2-target-tracking` is in `run.py`'s
single table), and the ratios a reviewer asks for are summarised over the runs:
cost / bound for mark and mark-spot, mark / clairvoyant, SM(ml.*)/mark,
SM(ml.*)/mark-spot, and the share within RT_max. The seed draws the arrivals
(a Poisson process on the trace's per-second rate) and the spot interruptions; the
window is a different 8 hours of the trace. The windows and seeds are fixed here,
before any run: days 10 (the paper's) and 12, seeds 0, 1, 2.

    .venv/bin/python experiments/table5/spread.py [--jobs 2] [--hours 8]

Each run's JSON goes to `results-spread/<label>/<model>/day<D>-seed<S>.json` (the label is
the predictor's name unless `--label` gives another, so a later sweep of the same predictor
keeps the earlier one's files); a run whose file exists is not run again (delete the folder
to start afresh), so an interrupted sweep resumes. The summary is written to
`spread-<label>.md` and printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from run import MODELS, PAPER_SM_OVER  # noqa: E402

DAYS = (10.0, 12.0)
SEEDS = (0, 1, 2)
POLICIES = "mark,mark-spot,sagemaker,clairvoyant"

Doc = dict[str, dict[str, float]]


def out_path(label: str, model: str, day: float, seed: int) -> Path:
    return HERE / "results-spread" / label / model / f"day{day:g}-seed{seed}.json"


def run_one(model: str, day: float, seed: int, hours: float, predictor: str, label: str) -> Path:
    path = out_path(label, model, day, seed)
    if path.exists():
        return path
    cmd = [
        sys.executable, "-m", "mark.cli.main", "simulate",
        "--trace", "twitter", "--start-day", f"{day:g}", "--hours", f"{hours:g}",
        "--model", model, "--rate-scale", f"{MODELS[model]:g}", "--policies", POLICIES,
        "--predictor", predictor, "--seed", str(seed), "--format", "json",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[3:])} failed:\n{done.stderr[-2000:]}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(done.stdout)
    tmp.replace(path)  # a killed sweep leaves no half-written result
    return path


def load(path: Path) -> Doc:
    return {r["policy"]: r for r in json.loads(path.read_text())["results"]}


METRICS: list[tuple[str, Callable[[Doc], float], str]] = [
    ("mark cost / bound", lambda d: d["mark"]["cost_over_bound"], "×"),
    ("mark-spot cost / bound", lambda d: d["mark-spot"]["cost_over_bound"], "×"),
    ("mark / clairvoyant", lambda d: d["mark"]["cost_total"] / d["clairvoyant"]["cost_total"], "×"),
    ("SM(ml.*) / mark", lambda d: d["sagemaker"]["cost_total"] / d["mark"]["cost_total"], "×"),
    (
        "SM(ml.*) / mark-spot",
        lambda d: d["sagemaker"]["cost_total"] / d["mark-spot"]["cost_total"],
        "×",
    ),
    ("mark within RT_max", lambda d: 100 * d["mark"]["within_slo"], " %"),
    ("mark-spot within RT_max", lambda d: 100 * d["mark-spot"]["within_slo"], " %"),
    ("mark $", lambda d: d["mark"]["cost_total"], ""),
    ("mark-spot $", lambda d: d["mark-spot"]["cost_total"], ""),
]


def summary(values: list[float], unit: str) -> str:
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.2f}{unit} ± {sd:.2f} ({min(values):.2f}–{max(values):.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=8.0)
    ap.add_argument("--predictor", default="lstm-calendar")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--jobs", type=int, default=1, help="simulations run at once")
    ap.add_argument("--label", help="the results' folder and summary name (default: the predictor)")
    args = ap.parse_args()
    label = args.label or args.predictor
    models = args.models.split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {', '.join(MODELS)}")
    todo = [(m, d, s) for m in models for d in DAYS for s in SEEDS]
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [
            pool.submit(run_one, m, d, s, args.hours, args.predictor, label) for m, d, s in todo
        ]
        for k, ((m, d, s), f) in enumerate(zip(todo, futures, strict=True), 1):
            f.result()
            took = time.perf_counter() - started
            print(f"[{k}/{len(todo)}] {m} day {d:g} seed {s} ({took:.0f} s)", flush=True)
    lines = [
        f"Twitter trace, days {', '.join(f'{d:g}' for d in DAYS)} × seeds "
        f"{', '.join(map(str, SEEDS))}, {args.hours:g} h each, predictor {args.predictor}: "
        "mean ± standard deviation (min–max) over the runs.",
        "",
        "| model | "
        + " | ".join(name for name, _, _ in METRICS)
        + " | paper SM/mark, SM/mark-spot |",
        "|---|" + "---|" * (len(METRICS) + 1),
    ]
    for m in models:
        docs = [load(out_path(label, m, d, s)) for d in DAYS for s in SEEDS]
        cells = [summary([f(doc) for doc in docs], unit) for _, f, unit in METRICS]
        od, spot = PAPER_SM_OVER[m]
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {od:.2f}×, {spot:.2f}× |")
    (HERE / f"spread-{label}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
