"""`mark demo ramp`: the local world under a load that ramps up and down, and what the loop did.

The daemon is started in-process with the demo's settings, by the
``start``/``stop`` the caller hands in (``mark.daemon``'s: the CLI and the
end-to-end tests import it, this module does not), the open-loop load generator
follows a rate profile, a sampler notes every second which instances are
pending and which serve, and afterwards the store's plans, decisions and
instance events are read back into a ``RampRun``; ``mark.demo.ramp_report``
checks it against the load that actually arrived.

Nothing here tells the forecaster the schedule. The forecasters speak per
minute and the LSTM is trained on per-minute maxima, so the demo keeps
P_u = 60 s and lasts about 13 minutes; see experiments/local-ramp/README.md.
SIGTERM stops it as Ctrl-C does: the daemon and every child process first.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

import numpy as np

if TYPE_CHECKING:  # not at run time: agents import this module for ``digits_x40``
    from bouncer.latency import BatchLatency
    from mark.config import Settings
    from mark.control import Controller
    from mark.demo.loadgen import Api, LoadResult, ProgressFn
    from mark.demo.rate_profile import RateProfile
    from mark.ports import Store
    from mark.serve.endpoint import Served
    from mark.state.records import ArrivalWindow, Decision, InstanceRecord, PlanRecord
    from mark.world import World

ForecasterChoice = Literal["lstm", "last", "config"]
R = TypeVar("R", bound="DaemonRun")

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
    from predictor.registry import code_digest, create

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
    # The predictor's code in the key: a model fitted by an older version is fitted again.
    digest = code_digest("lstm")
    key = hashlib.sha256(f"{profile}|{horizon}|{seed}|{digest}".encode()).hexdigest()[:12]
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


class DaemonRun(Protocol):
    """What ``run_ramp`` reads of a started daemon (``mark.daemon.Running``)."""

    @property
    def url(self) -> str: ...

    @property
    def world(self) -> World: ...

    @property
    def models(self) -> Mapping[str, Served]: ...

    @property
    def store(self) -> Store: ...

    @property
    def controller(self) -> Controller | None: ...


async def _wait_until_second(second: float) -> None:
    """Sleep until the wall clock's second-of-minute is ``second`` (at most a minute)."""
    await asyncio.sleep((second - time.time() % 60.0) % 60.0)


async def run_ramp(
    settings: Settings,
    profile: RateProfile,
    *,
    start: Callable[[Settings], Awaitable[R]],
    stop: Callable[[R], Awaitable[None]],
    seed: int = 0,
    api: Api = "v2",
    align_start_second: float | None = 57.0,
    load_offset_at_minute: float | None = None,
    progress: ProgressFn | None = None,
) -> RampRun:
    """Start the daemon, run the profile against it, read back what the control loop did.

    ``start``/``stop`` start and stop the daemon in-process (``mark.daemon``'s).
    ``align_start_second``: start the daemon at this second of a minute, so its
    control steps (every P_u from start) fall just after minute boundaries and
    line up with the per-minute latency roll-ups. ``load_offset_at_minute``:
    start the load so that this offset of the profile falls on a minute boundary.
    """
    from mark.control import LIVE
    from mark.demo.loadgen import run_load
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
        cooldown_s=t.cooldown(boot_s),
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


def calibrated_slowdown(settings: Settings, t1_s: float) -> tuple[float, BatchLatency]:
    """The slowdown that makes the first model's emulated T_1 ``t1_s`` on this machine.

    The local world emulates an instance type as this machine's time × a
    factor, so a fixed factor buys a different instance on a different (or a
    busier) machine: the same 15 that made a c5.large ~25 r/s on one machine
    made it ~1 r/s on one 4x slower. Measured once, with the estimator the
    world and the planner use. Returns (slowdown, the measured profile): the
    world must emulate that very profile (``local.reference_profile``), not
    measure its own at start, or the factor applies to another measurement.
    """
    from mark.cloud.local.agents import AgentModel
    from mark.cloud.local.world import measure_profile
    from mark.control import resolve_source

    spec = settings.models[0]
    model = AgentModel(spec.contract(resolve_source(spec, settings.data_dir)))
    profile = measure_profile(model)
    return max(1.0, t1_s / profile(1)), profile


DIGITS_REPEAT = 40
HEAVY_DIGITS = "mark.demo.ramp:digits_x40"


def digits_x40() -> Any:
    """The demo digits CNN evaluated 40 times per call: same answers, a few ms of real compute.

    Why: the emulated instance takes the profiled time × slowdown, or its real
    time if longer; the real time of a tiny model after an idle gap is many
    times its warm profile (0.3-0.5 ms against 0.05 ms for the plain CNN), a
    few ms of real work per call keeps that overhead a small share of what is
    measured, and the factor needed for a c5.large a modest one.
    """
    import torch

    from mark.demo.model import digits_model

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
