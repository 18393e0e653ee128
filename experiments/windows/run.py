"""mark against its baselines over many windows nobody chose: every day × start hour × seed.

Each run is one `mark simulate` of one model on one 8-hour window of the Twitter trace
(`--start-day D + H/24`, a 3-hour warm-up before it, the LSTM trained on every day
before the warm-up), with one seed drawing the arrivals and the spot interruptions.
The windows are every day the history allows (the calendar forecaster learns from ten
days, so days 10–13 of the 14 shipped) × start hours 0, 8 and 16, and seeds 0, 1, 2:
36 windows per model, fixed here before any run.

Run sets (`--sets`):

- `mark`: mark and mark-spot (spot interrupted at each type's Spot Instance Advisor
  rate), declines off (the default).
- `baselines`: sagemaker and ec2-target-tracking (sized at pooled capacity, 2×
  over-provisioned as the paper), and each at an equal SLO (`-equal-slo`).
- `stressed`: mark-spot with every spot instance interrupted at `STRESSED_RATE` (seed 0).
- `ablation`: mark with one rule switched off (or, for declines, on), each alone, on
  seed 0 of every window, paired with that window's `mark` run.
- `spot-ablation`: mark-spot with the persisting floor, or the calendar's rises planned
  ahead, switched off alone, paired alike with mark-spot's run.
- `together`: mark and mark-spot with the persisting floor and the calendar's rises
  planned ahead both off, paired alike: the first round rejected each on `mark`; this
  set is the check on `mark-spot` that brought them back.
- `candidates`: a rule tried before it was in mark's defaults, on mark and mark-spot,
  paired alike: adopted only by the ablation's rule, the other way round.
- `warmup`: mark after a 1 h and a 6 h warm-up instead of the default 3 h, paired alike:
  the warm-up is a measurement, chosen on these windows, not on one.

Each run's JSON goes to `results/<set>/<model>/d<D>h<H>s<S>.json`; a run whose file
exists is not run again, so a sweep resumes where it stopped. Runs are ordered seed by
seed, so a sweep cut short still covers every window once. `--report` writes
`results.md` from whatever runs exist, and says how many each row rests on.

    .venv/bin/python experiments/windows/run.py --jobs 2 [--models M,...] [--sets ...]
    .venv/bin/python experiments/windows/run.py --report
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import KW_ONLY, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

# Each model's load is the Twitter trace times a factor that keeps SageMaker's 2× fleet
# within the paper's testbed size (tens of instances): a setup choice, made before any run.
MODELS = {"inception-v3": 1.0, "nasnet": 0.1, "lstm-ptb": 1.0, "opennmt-ende": 0.01}
DAYS = (10, 11, 12, 13)
START_HOURS = (0, 8, 16)
SEEDS = (0, 1, 2)
HOURS = 8.0
BASELINES = "sagemaker,sagemaker-equal-slo,ec2-target-tracking,ec2-target-tracking-equal-slo"
STRESSED_RATE = 0.02
"""Interruptions per spot instance-hour under stress: each spot instance interrupted
every 50 hours on average, 73× the Advisor's worst bucket (>20 % a month). A stress,
not an estimate: it shows what standbys and replacements cost when spot turns bad."""


@dataclass(frozen=True)
class RunSet:
    name: str
    policies: str
    args: tuple[str, ...] = ()
    rule: str = ""
    """For an ablation: the rule the run switches (off, or on for declines)."""
    seeds: tuple[int, ...] = SEEDS
    """The seeds it runs: an ablation is paired window by window with mark on the same
    arrivals, so one seed per window (12 pairs a model) is its evidence, and the
    compute goes to the windows rather than to draws of the same window."""
    _: KW_ONLY
    gone: bool = False
    """Its rule left the code after it ran: its results stay in the report, it runs no more."""
    bound: bool = True
    """Whether its runs solve the lower bound: a set judged on cost alone against its base
    (the warm-up, whose other start draws other arrivals and so other bounds) skips it."""
    base: str = "mark"
    """The set its runs are paired with, window by window: ``mark`` as the code is now, or
    ``WITH_FLOOR`` for the sets that ran while the persisting floor was in the code."""


WITH_FLOOR = "mark-with-floor"
"""mark's runs made while the persisting floor was in the code (up to 1d447c9): the base
of the ablation sets that ran then, so each pair differs in its one rule alone."""

UNCOUNTED = "mark-uncounted"
"""mark's runs made while misses went uncounted with declines off (up to 152e167), so a
pool sized for rises carried the worst rise the history shows: the base of the sets
that ran then with that rule acting."""

NO_RISE_BY_MISSES = "no-rise-by-misses"
"""mark with the whole counted rise carried where spill is late: the candidate tried
against it (``rise-by-misses-hour``) ran when this was mark's default."""

ONE = (0,)  # the seed the paired sets run (RunSet.seeds)

SETS: dict[str, list[RunSet]] = {
    "mark": [RunSet("mark", "mark,mark-spot")],
    "baselines": [RunSet("baselines", BASELINES)],
    "stressed": [
        RunSet("spot-stressed", "mark-spot", ("--interrupt-rate", str(STRESSED_RATE)), seeds=ONE)
    ],
    "ablation": [
        RunSet("no-warm-pool", "mark", ("--no-warm-pool",), "warm pool", ONE, base=WITH_FLOOR),
        RunSet(
            "no-early-steps", "mark", ("--no-early-steps",), "early steps", ONE, base=WITH_FLOOR
        ),
        RunSet(
            "no-persisting-floor",
            "mark",
            ("--no-persisting-floor",),
            "persisting floor",
            ONE,
            gone=True,
            base=WITH_FLOOR,
        ),
        RunSet(
            "no-capacity-target",
            "mark",
            ("--no-capacity-target",),
            "capacity target",
            ONE,
            base=WITH_FLOOR,
        ),
        RunSet(
            "no-pooled-capacity",
            "mark",
            ("--pooled-capacity", "false"),
            "pooled capacity",
            ONE,
            base=WITH_FLOOR,
        ),
        RunSet(
            "no-rise-headroom",
            "mark",
            ("--pooled-capacity", "true"),
            "rises carried where spill is late",
            ONE,
        ),
        RunSet(
            NO_RISE_BY_MISSES,
            "mark,mark-spot",
            ("--no-rise-by-misses",),
            "rise carried as the misses show",
            ONE,
        ),
        RunSet(
            "no-calendar",
            "mark",
            ("--predictor", "lstm"),
            "rise-ahead (calendar)",
            ONE,
            base=WITH_FLOOR,
        ),
        RunSet(
            "declines-on",
            "mark",
            ("--decline-share", "0.9"),
            "declines (0.9)",
            ONE,
            base=WITH_FLOOR,
        ),
        RunSet(
            "no-spill-batching",
            "mark,mark-spot",
            ("--no-spill-batching",),
            "batched spill",
            ONE,
            base=UNCOUNTED,
        ),
    ],
    "spot-ablation": [
        RunSet(
            "no-persisting-floor-spot",
            "mark-spot",
            ("--no-persisting-floor",),
            "persisting floor (mark-spot)",
            ONE,
            gone=True,
            base=WITH_FLOOR,
        ),
        RunSet(
            "no-calendar-spot",
            "mark-spot",
            ("--predictor", "lstm"),
            "rise-ahead (calendar) (mark-spot)",
            ONE,
            base=WITH_FLOOR,
        ),
        RunSet(
            "no-rise-headroom-spot",
            "mark-spot",
            ("--pooled-capacity", "true"),
            "rises carried where spill is late (mark-spot)",
            ONE,
        ),
    ],
    "together": [
        RunSet(
            "no-floor-no-calendar",
            "mark,mark-spot",
            ("--no-persisting-floor", "--predictor", "lstm"),
            "persisting floor and calendar, together",
            ONE,
            gone=True,
            base=WITH_FLOOR,
        ),
    ],
    "variants": [
        RunSet(
            f"variants-{floor}",
            "mark",
            ("--variants", "resnet-50,resnet-18", "--accuracy-floor", floor),
            f"variants at floor {floor}",
            ONE,
            base=UNCOUNTED,
        )
        for floor in ("0.77", "0.75")
    ],
    "candidates": [
        RunSet(
            "rise-by-misses-hour",
            "mark,mark-spot",
            ("--rise-by-misses",),
            "rise carried as the last hour's misses show",
            ONE,
            gone=True,
            base=NO_RISE_BY_MISSES,
        ),
    ],
    "warmup": [
        RunSet(
            "warmup-1h",
            "mark",
            ("--warmup-s", "3600"),
            "3 h warm-up (against 1 h)",
            ONE,
            bound=False,
        ),
        RunSet(
            "warmup-6h",
            "mark",
            ("--warmup-s", "21600"),
            "3 h warm-up (against 6 h)",
            ONE,
            bound=False,
        ),
    ],
}


@dataclass(frozen=True)
class Window:
    day: int
    hour: int
    seed: int

    @property
    def key(self) -> str:
        return f"d{self.day}h{self.hour:02d}s{self.seed}"


def windows(seeds: tuple[int, ...] = SEEDS) -> list[Window]:
    return [Window(d, h, s) for s in seeds for d in DAYS for h in START_HOURS]


def out_path(run_set: RunSet, model: str, w: Window) -> Path:
    return RESULTS / run_set.name / model / f"{w.key}.json"


def commit() -> str:
    """The commit the runs are made at, ``-dirty`` if the code a simulation runs (not the
    results or their report) differs from it."""
    git = ["git", "-C", str(HERE)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    code = ("mark", "provisioner", "bouncer", "predictor")
    dirty = subprocess.run([*git, "diff", "--quiet", "HEAD", "--", *code], cwd=HERE.parents[1])
    return (head.stdout.strip() or "unknown") + ("-dirty" if dirty.returncode else "")


def run_one(run_set: RunSet, model: str, w: Window, code: str) -> float:
    """Run one window unless its result exists; the seconds it took (0 if it existed)."""
    path = out_path(run_set, model, w)
    if path.exists():
        return 0.0
    cmd = [
        sys.executable, "-m", "mark.cli.main", "simulate", "--trace", "twitter",
        "--start-day", repr(w.day + w.hour / 24), "--hours", f"{HOURS:g}",
        "--model", model, "--rate-scale", f"{MODELS[model]:g}",
        "--policies", run_set.policies, "--seed", str(w.seed), "--format", "json",
        "--no-bound-own-misses",  # no table reports it; rebound.py --own-misses adds it
        *(() if run_set.bound else ("--no-bound",)),
        *run_set.args,
    ]  # fmt: skip
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[3:])} failed:\n{done.stderr[-2000:]}")
    doc = json.loads(done.stdout)
    doc["window"] = {"day": w.day, "hour": w.hour, "seed": w.seed, "hours": HOURS}
    doc["code"] = code
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)  # a killed sweep leaves no half-written result
    return time.perf_counter() - t


def sweep(
    models: list[str], sets: list[str], seeds: tuple[int, ...], jobs: int, only: set[str]
) -> None:
    code = commit()
    todo = [
        (rs, m, w)
        for w_seed in seeds
        for name in sets
        for rs in SETS[name]
        if w_seed in rs.seeds and not rs.gone and (not only or rs.name in only)
        for m in models
        for w in windows((w_seed,))
    ]
    left = [t for t in todo if not out_path(t[0], t[1], t[2]).exists()]
    print(f"{len(todo)} runs, {len(todo) - len(left)} done before, {len(left)} to run", flush=True)
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(run_one, rs, m, w, code) for rs, m, w in left]
        for k, ((rs, m, w), f) in enumerate(zip(left, futures, strict=True), 1):
            took = f.result()
            spent = time.perf_counter() - started
            eta = spent / k * (len(left) - k)
            print(
                f"[{k}/{len(left)}] {rs.name} {m} {w.key} {took:.0f} s "
                f"(elapsed {spent / 60:.0f} min, about {eta / 60:.0f} min left)",
                flush=True,
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument(
        "--sets", default="mark,ablation,baselines,stressed,warmup,together,spot-ablation"
    )
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    ap.add_argument("--only", default="", help="only these runs of the sets, e.g. no-warm-pool")
    ap.add_argument("--jobs", type=int, default=1, help="simulations run at once")
    ap.add_argument("--report", action="store_true", help="only write results.md")
    args = ap.parse_args()
    models = args.models.split(",")
    sets = args.sets.split(",")
    only = {o for o in args.only.split(",") if o}
    names = {rs.name for group in SETS.values() for rs in group}
    bad = [m for m in models if m not in MODELS] + [s for s in sets if s not in SETS]
    bad += sorted(only - names)
    if bad:
        ap.error(f"unknown {bad}; models: {', '.join(MODELS)}; sets: {', '.join(SETS)}")
    if not args.report:
        sweep(models, sets, tuple(int(s) for s in args.seeds.split(",")), args.jobs, only)
    from report import write_report

    print(write_report(HERE, list(MODELS)))


if __name__ == "__main__":
    main()
