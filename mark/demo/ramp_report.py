"""The ramp demo's run read back: per-launch and per-retirement checks, the timeline, the plot.

What ``mark.demo.ramp.run_ramp`` observed is checked against the load that
actually arrived:

* a launch of k instances is *ahead* when the load that needs all k of them
  (more than the fleet before it plus k - 1 of them carry) had not arrived yet
  when it was decided (and better, when they were already serving when that
  load came). For one instance that is the load the fleet before it could not
  carry; a launch of two from an empty fleet at start is not "late" because a
  base load that Lambda serves was there before any instance could be;
* a retirement is judged by how long after the load fell below what the rest
  of the fleet carries it happened, next to the cool-down.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from mark.demo.ramp import RampRun
    from mark.state.records import ArrivalWindow


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
    by: str = "planner"  # who launched it: planner | SLO monitor (never wanted by a plan)

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
            # The plan that retires it does not want it: its terminate is recorded a moment
            # after the plan (once the other frontends have read the retiring mark).
            retiring = {d.instance_id for d in p.decisions if d.action.startswith("retire")}
            if (
                iid not in held
                and iid not in retiring
                and run.first_event.get(iid, (math.inf, ""))[0] <= p.at
            ):
                wanted = p.at
        out.append(
            RetireCheck(
                at - t0,
                iid,
                after,
                None if fell is None else fell - t0,
                None if wanted is None else wanted - t0,
                run.cooldown_s,
                run.first_event.get(iid, (0.0, "planner"))[1],
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
