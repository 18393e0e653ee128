"""`mark demo ramp`: the local world under a load that ramps up and down, and what the loop did.

The daemon is started in-process (``mark.daemon.start``/``stop``, as the
end-to-end tests do), the open-loop load generator follows a rate profile, a
sampler notes every second which instances are pending and which serve, and
afterwards the store's plans, decisions and instance events are read back and
checked against the load that actually arrived:

* a launch of k instances is *ahead* when the load that needs all k of them
  (more than the fleet before it plus k - 1 of them carry) had not arrived yet
  when it was decided (and better, when they were already serving when that
  load came). For one instance that is the load the fleet before it could not
  carry; a launch of two from an empty fleet at start is not "late" because a
  base load that Lambda serves was there before any instance could be;
* a retirement is judged by how long after the load fell below what the rest
  of the fleet carries it happened, next to the cool-down.

Nothing here tells the forecaster the schedule. The forecasters speak per
minute and the LSTM is trained on per-minute maxima, so the demo keeps
P_u = 60 s and lasts about 13 minutes; see experiments/local-ramp/README.md.
SIGTERM stops it as Ctrl-C does: the daemon and every child process first.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import signal
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np

if TYPE_CHECKING:  # not at run time: agents import this module for ``digits_x40``
    from mark.config import Settings
    from mark.loadgen import Api, LoadResult, ProgressFn, RateProfile
    from mark.state.records import ArrivalWindow, Decision, InstanceRecord, PlanRecord

ForecasterChoice = Literal["lstm", "last", "config"]
T = TypeVar("T")

DEFAULT_PROFILE = "0:4,60:4,240:60,360:60,480:4,780:4"
"""1 min at 4 r/s, 3 min up to 60, 2 min at 60, 2 min down, 5 min at 4 (cool-down visible)."""


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` wins, nested mappings merged key by key (so --set still beats the demo's values)."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def demo_overrides(
    *,
    update_period_s: float = 60.0,
    cooldown_s: float = 90.0,
    billing_minimum_s: float = 60.0,
    boot_delay_s: float = 5.0,
    slowdown: float = 15.0,
    window_steps: int = 15,
) -> dict[str, Any]:
    """Demo-friendly settings: one instance type, slowed so a few instances carry the ramp.

    τ is one P_u (an agent boots in seconds here, not minutes), the cool-down
    short enough to see inside the run; the 60 s EC2 billing minimum is kept.
    """
    return {
        "api": {"port": 0},
        "offerings": {"types": ["c5.large"], "markets": ["on-demand"], "max_instances": 10},
        "local": {"boot_delay_s": boot_delay_s, "slowdown": {"c5.large": slowdown}},
        "timings": {
            "update_period_s": update_period_s,
            "window_steps": window_steps,
            "sample_window_s": 5,
            "lead_time_s": update_period_s,
            "cooldown_s": cooldown_s,
            "billing_minimum_s": billing_minimum_s,
        },
    }


# -- the forecaster ---------------------------------------------------------------


def training_history(
    profile: RateProfile, repetitions: int, rng: np.random.Generator
) -> tuple[np.ndarray[Any, np.dtype[np.float64]], int]:
    """Per-minute max 5 s rates of ``repetitions`` earlier days of the same ramp shape.

    Each repetition is stretched in time and scaled in height by up to ±25 %,
    and preceded by 0-40 idle minutes, so the model learns the shape ("once it
    climbs from the base, it keeps climbing, holds, then falls") and not this
    run's timing or exact levels. Returns the series and its length in minutes.
    """
    minutes: list[float] = []
    for _ in range(repetitions):
        minutes += [0.0] * int(rng.integers(0, 41))
        stretch, height = rng.uniform(0.75, 1.25, size=2)
        span = profile.duration * stretch
        n_windows = int(span // 5)
        mid = (np.arange(n_windows) + 0.5) * 5.0 / stretch
        rates = rng.poisson(profile.rate(mid) * height * 5.0) / 5.0
        usable = n_windows - n_windows % 12
        minutes += list(rates[:usable].reshape(-1, 12).max(axis=1))
    return np.asarray(minutes, dtype=np.float64), len(minutes)


def train_lstm(profile: RateProfile, path: Path, horizon: int, seed: int = 0) -> Path:
    """Fit the LSTM on earlier repetitions of the ramp shape and save it (cached by inputs)."""
    from predictor.base import History
    from predictor.registry import create

    values, _ = training_history(profile, 150, np.random.default_rng(seed))
    model = create(
        "lstm",
        horizon=horizon,
        lookback=30,
        level_minutes=5,
        under_weight=2.0,
        epochs=40,
        patience=6,
        seed=seed,
    )
    model.fit(History(values, np.datetime64("2026-01-01T00:00", "m")))
    return model.save(path)


def prepare_forecaster(
    choice: ForecasterChoice, profile: RateProfile, data_dir: Path, horizon: int, seed: int = 0
) -> Path | None:
    """The model file the predictor config should load, or None to keep the configured one."""
    from predictor.base import History
    from predictor.registry import create

    if choice == "config":
        return None
    out = data_dir / "ramp-demo"
    out.mkdir(parents=True, exist_ok=True)
    if choice == "last":
        path = out / "last.npz"
        if not path.exists():  # nothing to learn: saved only so the loop uses it from the start
            create("last").fit(History(np.ones(1), np.datetime64("2026-01-01T00:00", "m"))).save(
                path
            )
        return path
    key = hashlib.sha256(f"{profile}|{horizon}|{seed}|v1".encode()).hexdigest()[:12]
    path = out / f"lstm-{key}.npz"
    if not path.exists():
        train_lstm(profile, path, horizon, seed)
    return path


def forecaster_overrides(model_file: Path | None) -> dict[str, Any]:
    """Load ``model_file`` from the start, with 60 min of history as in its training."""
    if model_file is None:
        return {}
    return {"predictor": {"model_file": str(model_file), "history_minutes": 60}}


# -- the run ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FleetSample:
    at: float
    pending: tuple[str, ...]  # launched, agent not serving yet
    serving: tuple[str, ...]  # the dispatcher routes to it


@dataclass
class RampRun:
    """Everything observed: the load's outcomes, the fleet each second, the store's records."""

    model: str
    started_at: float  # epoch of load offset 0
    ended_at: float
    update_period_s: float
    cooldown_s: float
    load: LoadResult
    samples: list[FleetSample]
    plans: list[PlanRecord]  # oldest first
    decisions: list[Decision]
    windows: list[ArrivalWindow]
    instances: list[InstanceRecord]
    first_event: dict[str, tuple[float, str]]  # id -> (when decided, by whom)
    retired_at: dict[str, float]
    capacity: dict[tuple[str, str], float]  # (type, market) -> r/s within the SLO
    boot_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def cap_of(self, iid: str) -> float:
        rec = next((i for i in self.instances if i.instance_id == iid), None)
        return 0.0 if rec is None else self.capacity.get((rec.instance_type, rec.market), 0.0)


async def _wait_until_second(second: float) -> None:
    """Sleep until the wall clock's second-of-minute is ``second`` (at most a minute)."""
    await asyncio.sleep((second - time.time() % 60.0) % 60.0)


async def run_ramp(
    settings: Settings,
    profile: RateProfile,
    *,
    seed: int = 0,
    api: Api = "v2",
    align_start_second: float | None = 57.0,
    load_offset_at_minute: float | None = None,
    progress: ProgressFn | None = None,
) -> RampRun:
    """Start the daemon, run the profile against it, read back what the control loop did.

    ``align_start_second``: start the daemon at this second of a minute, so its
    control steps (every P_u from start) fall just after minute boundaries and
    line up with the per-minute latency roll-ups. ``load_offset_at_minute``:
    start the load so that this offset of the profile falls on a minute boundary.
    """
    from mark.controller import LIVE
    from mark.daemon import start, stop
    from mark.loadgen import run_load
    from mark.ports import InstanceRole

    model = settings.models[0].name
    if align_start_second is not None:
        await _wait_until_second(align_start_second)
    began = time.time()
    run = await start(settings)
    samples: list[FleetSample] = []

    async def sample() -> None:
        assert run.world.fleet is not None
        disp = run.models[model].dispatcher
        while True:
            try:
                fleet = await run.world.fleet.list()
            except Exception:  # a missed sample is a gap in the plot, not a failed demo
                fleet = []
            serving = set(disp.backends) if disp is not None else set()
            live = [
                i.instance_id
                for i in fleet
                if i.model == model
                and i.state in LIVE
                and i.role in (InstanceRole.SERVING, InstanceRole.BACKUP)
            ]
            samples.append(
                FleetSample(
                    time.time(),
                    tuple(i for i in live if i not in serving),
                    tuple(i for i in live if i in serving),
                )
            )
            await asyncio.sleep(1.0)

    sampler = asyncio.create_task(sample())
    try:
        if load_offset_at_minute is not None:
            await asyncio.sleep((-(time.time() + load_offset_at_minute)) % 60.0)
        load = await run_load(run.url, model, profile, api=api, seed=seed, progress=progress)
        ended = time.time()
        sampler.cancel()
        plans = list(reversed(await run.store.plans(model, limit=100_000)))
        decisions = await run.store.decisions(0.0, ended + 3600.0)
        windows = await run.store.arrivals(model, load.started_at - 120.0, ended + 60.0)
        instances = [  # a reused store may hold earlier runs' instances
            i for i in await run.store.instances(model=model) if i.launched_at >= began - 5.0
        ]
        first: dict[str, tuple[float, str]] = {}
        retired: dict[str, float] = {}
        for rec in instances:
            events = await run.store.instance_events(rec.instance_id)
            if events:
                first[rec.instance_id] = (events[0].at, events[0].reason or "")
            for e in events:
                if e.state == "terminated":
                    retired.setdefault(rec.instance_id, e.at)
        capacity = {}
        if run.controller is not None:
            capacity = {o.key: o.capacity_rps for o in run.controller.options.get(model, ())}
        boot_s = run.controller.boot_s if run.controller is not None else 0.0
    finally:
        sampler.cancel()
        await stop(run)
    t = settings.timings
    return RampRun(
        model=model,
        started_at=load.started_at,
        ended_at=ended,
        update_period_s=t.update_period_s,
        cooldown_s=t.cooldown_s,
        load=load,
        samples=samples,
        plans=plans,
        decisions=decisions,
        windows=windows,
        instances=instances,
        first_event=first,
        retired_at=retired,
        capacity=capacity,
        boot_s=boot_s,
    )


async def cancelled_on_sigterm(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro``; SIGTERM cancels it as Ctrl-C does, so its ``finally`` stops every child.

    Without this SIGTERM kills the process at once and leaves the agents (in
    their own sessions), the Lambda runtimes and moto's port behind.
    """
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await coro
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


# -- reading it back -------------------------------------------------------------------


def _live_at(run: RampRun, t: float, *, decided_before: float | None = None) -> list[str]:
    """Instances decided (launched) before ``decided_before`` (default t) and not retired by t."""
    cut = t if decided_before is None else decided_before
    return [
        iid
        for iid, (at, _) in run.first_event.items()
        if at < cut and run.retired_at.get(iid, math.inf) > t
    ]


def _ready_at(run: RampRun, iid: str) -> float | None:
    return next((s.at for s in run.samples if iid in s.serving), None)


def _max_rate(windows: Sequence[ArrivalWindow], since: float, until: float) -> float:
    return max((w.rate for w in windows if since <= w.window_start < until), default=0.0)


@dataclass(frozen=True)
class LaunchCheck:
    at: float  # offset from the load's start
    count: int
    instance_type: str
    by: str  # planner | SLO monitor
    capacity_before: float
    need_at: float | None  # offset when the load first exceeded needs_all_above
    ready_at: float | None
    already_there: bool  # the load exceeded needs_all_above in the minute before
    needs_all_above: float = 0.0  # capacity_before + all but one of the launched instances

    @property
    def ahead(self) -> bool:
        return not self.already_there

    def verdict(self) -> str:
        if self.already_there:
            return "after the load (it was already above the fleet's capacity)"
        if self.need_at is None:
            return "ahead; the load never exceeded the fleet before it"
        lead = self.need_at - self.at
        if self.ready_at is not None and self.ready_at <= self.need_at:
            return f"ahead by {lead:.0f} s, serving {self.need_at - self.ready_at:.0f} s early"
        return f"ahead by {lead:.0f} s, still booting when the load came"


@dataclass(frozen=True)
class RetireCheck:
    at: float
    instance_id: str
    capacity_after: float
    fell_at: float | None  # offset when the load last exceeded capacity_after
    last_wanted_at: float | None  # offset of the last plan that kept it
    cooldown_s: float

    @property
    def quiet_s(self) -> float | None:
        return None if self.fell_at is None else self.at - self.fell_at

    @property
    def after_cooldown(self) -> bool:
        return self.quiet_s is None or self.quiet_s >= self.cooldown_s

    def verdict(self) -> str:
        wanted = (
            f"; last wanted {self.at - self.last_wanted_at:.0f} s before"
            if self.last_wanted_at is not None
            else ""
        )
        if self.fell_at is None:
            return f"the load never needed it{wanted}"
        cmp = "≥" if self.after_cooldown else "<"
        cd = self.cooldown_s
        return f"{self.quiet_s:.0f} s after the load fell {cmp} cool-down {cd:g} s{wanted}"


def launch_checks(run: RampRun) -> list[LaunchCheck]:
    """One row per launch decision (instances decided at the same moment form one launch)."""
    groups: dict[tuple[float, str], list[str]] = {}
    for iid, (at, by) in run.first_event.items():
        groups.setdefault((at, by), []).append(iid)
    out = []
    t0 = run.started_at
    for (at, by), ids in sorted(groups.items()):
        before = sum(run.cap_of(i) for i in _live_at(run, at))
        caps = sorted(run.cap_of(i) for i in ids)
        needs_all = before + sum(caps[:-1])  # the last of them is needed above this
        already = _max_rate(run.windows, at - 60.0, at) > needs_all
        need = next(
            (w.window_start for w in run.windows if w.window_start >= at and w.rate > needs_all),
            None,
        )
        readies = [r for r in (_ready_at(run, i) for i in ids) if r is not None]
        rec = next(i for i in run.instances if i.instance_id == ids[0])
        out.append(
            LaunchCheck(
                at - t0,
                len(ids),
                rec.instance_type,
                "planner" if by == "planner" else by,
                before,
                None if need is None else need - t0,
                None if not readies else max(readies) - t0,
                already,
                needs_all,
            )
        )
    return out


def retire_checks(run: RampRun) -> list[RetireCheck]:
    out = []
    t0 = run.started_at
    for iid, at in sorted(run.retired_at.items(), key=lambda kv: kv[1]):
        gone_now = {i for i, t in run.retired_at.items() if t == at}
        after = sum(run.cap_of(i) for i in _live_at(run, at - 1e-6) if i not in gone_now)
        above = [w for w in run.windows if w.window_start < at and w.rate > after]
        fell = above[-1].window_start + above[-1].window_s if above else None
        wanted = None
        for p in run.plans:
            if p.at >= at:
                break
            held = {h[0] for h in p.explanation.get("held", [])}
            if iid not in held and run.first_event.get(iid, (math.inf, ""))[0] <= p.at:
                wanted = p.at
        out.append(
            RetireCheck(
                at - t0,
                iid,
                after,
                None if fell is None else fell - t0,
                None if wanted is None else wanted - t0,
                run.cooldown_s,
            )
        )
    return out


@dataclass(frozen=True)
class StepRow:
    at: float  # offset of the control step
    forecast_now: float
    forecast_target: float  # the step τ ahead: what launches now are for
    seen_max: float  # max 5 s rate since the previous step
    pending: int
    serving: int
    capacity: float  # of the instances serving
    actions: tuple[str, ...]


def timeline(run: RampRun) -> list[StepRow]:
    """One row per control step inside the run, with its decisions and the fleet at that time."""
    t0 = run.started_at
    tau = 1  # demo_overrides sets τ = P_u
    rows = []
    prev = t0 - run.update_period_s
    for p in run.plans:
        if p.at < t0 - run.update_period_s or p.at > run.ended_at:
            continue
        sample = next((s for s in reversed(run.samples) if s.at <= p.at), None)
        f = list(p.forecast)
        acts = []
        for d in p.decisions:
            if d.action == "launch":
                acts.append(f"launch {d.count}× {d.instance_type}")
            elif d.action == "retire":
                acts.append(f"retire {d.instance_id}")
            else:
                acts.append(d.action)
        for iid, why in p.explanation.get("held", []):
            if str(why).startswith("cool-down"):
                acts.append(f"hold {iid} ({why.split(' until ')[0]})")
            elif str(why).startswith("SLO missed"):
                acts.append(f"hold {iid} (SLO missed)")
        rows.append(
            StepRow(
                p.at - t0,
                f[0] if f else 0.0,
                f[min(tau, len(f) - 1)] if f else 0.0,
                _max_rate(run.windows, prev, p.at),
                len(sample.pending) if sample else 0,
                len(sample.serving) if sample else 0,
                sum(run.cap_of(i) for i in sample.serving) if sample else 0.0,
                tuple(acts),
            )
        )
        prev = p.at
    for d in run.decisions:  # decisions outside any plan: SLO-monitor backups, standbys
        if d.action in ("backup", "backup-failed", "start-standby") and t0 <= d.at <= run.ended_at:
            rows.append(
                StepRow(d.at - t0, math.nan, math.nan, math.nan, -1, -1, math.nan, (d.action,))
            )
    return sorted(rows, key=lambda r: r.at)


def _mmss(offset: float) -> str:
    sign = "-" if offset < 0 else ""
    s = abs(offset)
    return f"{sign}{int(s // 60)}:{s % 60:04.1f}"


def format_report(run: RampRun) -> str:
    """Plain-text tables (Markdown) of the timeline and the checks, for the terminal and README."""
    lines = [
        "| t (m:s) | forecast now / τ ahead (r/s) | load seen (max 5 s r/s) | pending | serving "
        "| serving capacity (r/s) | decisions |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in timeline(run):
        if r.pending < 0:
            lines.append(f"| {_mmss(r.at)} | | | | | | SLO monitor: {', '.join(r.actions)} |")
            continue
        lines.append(
            f"| {_mmss(r.at)} | {r.forecast_now:.1f} / {r.forecast_target:.1f} | {r.seen_max:.1f} "
            f"| {r.pending} | {r.serving} | {r.capacity:.0f} | {'; '.join(r.actions)} |"
        )
    lines += [
        "",
        "| launch at | what | by | fleet capacity before (r/s) | all of it needed from "
        "| serving from | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in launch_checks(run):
        lines.append(
            f"| {_mmss(c.at)} | {c.count}× {c.instance_type} | {c.by} | {c.capacity_before:.0f}"
            f"{f' (+{c.needs_all_above - c.capacity_before:.0f})' if c.count > 1 else ''} "
            f"| {'-' if c.need_at is None else _mmss(c.need_at)} "
            f"| {'-' if c.ready_at is None else _mmss(c.ready_at)} | {c.verdict()} |"
        )
    lines += [
        "",
        "| retired at | instance | capacity left (r/s) | load last above it | verdict |",
        "|---|---|---|---|---|",
    ]
    for rc in retire_checks(run):
        lines.append(
            f"| {_mmss(rc.at)} | {rc.instance_id} | {rc.capacity_after:.0f} "
            f"| {'-' if rc.fell_at is None else _mmss(rc.fell_at)} | {rc.verdict()} |"
        )
    return "\n".join(lines)


def plot(run: RampRun, path: Path) -> Path:
    """PNG: offered load, forecast, serving capacity, and instances pending/serving over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = run.started_at
    fig, (ax, ax2) = plt.subplots(
        2, 1, figsize=(12, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    w = [x for x in run.windows if x.window_start >= t0 - 60]
    ax.step(
        [(x.window_start - t0) / 60 for x in w],
        [x.rate for x in w],
        where="post",
        color="black",
        lw=0.8,
        label="load seen (5 s windows)",
    )
    prof_t = np.linspace(0, run.load.profile.duration, 400)
    ax.plot(prof_t / 60, run.load.profile.rate(prof_t), color="grey", ls=":", label="profile")
    steps = [r for r in timeline(run) if r.pending >= 0]
    ax.step(  # drawn over the minute it is for, one P_u after the step that made it
        [(r.at + run.update_period_s) / 60 for r in steps],
        [r.forecast_target for r in steps],
        where="post",
        color="tab:orange",
        label="forecast (for the step it is for)",
    )
    st = [s.at for s in run.samples]
    cap = [sum(run.cap_of(i) for i in s.serving) for s in run.samples]
    cap_all = [sum(run.cap_of(i) for i in (*s.serving, *s.pending)) for s in run.samples]
    ax.step(
        [(x - t0) / 60 for x in st], cap, where="post", color="tab:blue", label="capacity serving"
    )
    ax.step(
        [(x - t0) / 60 for x in st],
        cap_all,
        where="post",
        color="tab:blue",
        ls="--",
        lw=0.8,
        label="capacity incl. booting",
    )
    for c in launch_checks(run):
        ax.axvline(c.at / 60, color="tab:green", lw=0.8, alpha=0.7)
    for r in retire_checks(run):
        ax.axvline(r.at / 60, color="tab:red", lw=0.8, alpha=0.7)
    ax.set_ylabel("requests/s")
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title("mark demo ramp: launches (green) and retirements (red)")
    ax2.step(
        [(x - t0) / 60 for x in st],
        [len(s.serving) for s in run.samples],
        where="post",
        color="tab:blue",
        label="serving",
    )
    ax2.step(
        [(x - t0) / 60 for x in st],
        [len(s.pending) for s in run.samples],
        where="post",
        color="tab:purple",
        label="pending",
    )
    ax2.set_ylabel("instances")
    ax2.set_xlabel("minutes since the load started")
    ax2.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def calibrated_slowdown(settings: Settings, t1_s: float) -> tuple[float, float]:
    """The slowdown that makes the first model's emulated T_1 ``t1_s`` on this machine.

    The local world emulates an instance type as this machine's time × a
    factor, so a fixed factor buys a different instance on a different (or a
    busier) machine: the same 15 that made a c5.large ~25 r/s on one machine
    made it ~1 r/s on one 4x slower. Measured once, with the estimator the
    world and the planner use. Returns (slowdown, measured T_1).
    """
    from mark.cloud.local.agents import AgentModel
    from mark.cloud.local.world import measure_profile
    from mark.daemon import resolve_source

    spec = settings.models[0]
    model = AgentModel(
        resolve_source(spec, settings.data_dir), tuple(spec.input.shape), spec.input.dtype
    )
    t1 = measure_profile(model)(1)
    return max(1.0, t1_s / t1), t1


DIGITS_REPEAT = 40
HEAVY_DIGITS = "mark.ramp_demo:digits_x40"


def digits_x40() -> Any:
    """The demo digits CNN evaluated 40 times per call: same answers, a few ms of real compute.

    Why: the emulated instance takes the profiled time × slowdown, or its real
    time if longer; the real time of a tiny model after an idle gap is many
    times its warm profile (0.3-0.5 ms against 0.05 ms for the plain CNN), a
    few ms of real work per call keeps that overhead a small share of what is
    measured, and the factor needed for a c5.large a modest one.
    """
    import torch

    from mark.demo import digits_model

    class Repeated(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module, times: int) -> None:
            super().__init__()
            self.inner = inner
            self.times = times

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.inner(x)
            for _ in range(self.times - 1):
                out = self.inner(x)
            return out

    return Repeated(digits_model(), DIGITS_REPEAT).eval()


def heavy_model_overrides(rt_max_ms: float = 100.0) -> dict[str, Any]:
    """Serve the digits model through ``digits_x40`` (same name, input and SLO as the default)."""
    return {
        "models": [
            {
                "name": "digits",
                "source": HEAVY_DIGITS,
                "input": {"shape": [1, 8, 8], "dtype": "float32"},
                "slo": {"rt_max_ms": rt_max_ms, "sl_min": 0.98},
            }
        ]
    }
