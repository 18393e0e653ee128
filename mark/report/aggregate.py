"""What mark has cost: the ledger, completed from instance events, grouped and totalled.

Pure: records from the store in, priced charges and rows out; the end of an
unfinished run (``until``) is given, never read from a clock.

The ledger holds what the daemon priced when it happened: a run of a serving
or backup instance when the planner retires it (or a spot interruption takes
it), and Lambda charges as they are flushed. Two kinds of EC2 time are not in
it, and AWS bills both, so they are priced here from the instances table and
its state transitions, with the same rule (``mark.billing.ec2_charge``: per
second, 60 s minimum for each start):

* runs that ended without a ledger entry: a standby's runs between launch or
  start and stop (the controller stops and starts standbys, it never bills
  them);
* runs still going at ``until`` ("accruing"): instances the store lists as
  live are charged from their start up to ``until``.

The ledger's rows do not say an instance was a standby; its role is in the
instances table, so charges of standby instances get component ``standby``.

Lambda has three components (``mark.billing``): ``lambda`` (on-demand
invocations), ``lambda-on-pc`` (invocations served by provisioned concurrency,
at its lower duration rate) and ``lambda-pc`` (the provisioned concurrency
itself, for the time it was configured).

A stopped instance (a standby, or one the warm pool keeps) is billed its volume while
stopped (component ``ebs``), from its stop to its next start or end, at the configured
``offerings.volume_gb`` and the gp3 price: nothing in the ledger records it.

A charge belongs to the period and the UTC day in which its run starts, as
``Store.ledger(since, until)`` selects charges by their start.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from mark.billing import (
    LAMBDA_COMPONENTS,
    LAMBDA_PC,
    LAMBDA_RUN_COMPONENTS,
    ebs_charge,
    ebs_per_hour,
    ec2_charge,
)
from mark.state.records import InstanceEvent, InstanceRecord, LedgerEntry

BILLED = "billed"
ACCRUING = "accruing"
FROM_LEDGER = "ledger"
FROM_EVENTS = "events"
STANDBY = "standby"

RUNNING_STATES = frozenset({"pending", "running", "ready"})
ENDED_STATES = frozenset({"stopping", "stopped", "shutting-down", "terminated"})
STOPPED = frozenset({"stopping", "stopped"})
EBS = "ebs"
"""The component of a stopped instance's volume (a standby, or the warm pool's)."""


@dataclass(frozen=True, slots=True)
class Charge:
    """One priced item of the report: a ledger entry, or a run priced from events."""

    entry: LedgerEntry
    status: str = BILLED  # billed | accruing
    source: str = FROM_LEDGER  # ledger | events


@dataclass(frozen=True, slots=True)
class Run:
    """One stretch of an instance between a launch or start and a stop or termination."""

    start: float
    end: float | None  # None: still running


def instance_runs(inst: InstanceRecord, events: Sequence[InstanceEvent]) -> list[Run]:
    """The runs of one instance: the first starts at its launch, each later one at
    the transition out of ``stopped``; each ends at a stop or termination."""
    runs: list[Run] = []
    start: float | None = inst.launched_at
    for ev in sorted(events, key=lambda e: e.at):
        if ev.state in ENDED_STATES and start is not None:
            runs.append(Run(start, max(start, ev.at)))
            start = None
        elif ev.state in RUNNING_STATES and start is None:
            start = ev.at
    if start is not None:
        runs.append(Run(start, None))
    return runs


def stopped_spans(inst: InstanceRecord, events: Sequence[InstanceEvent]) -> list[Run]:
    """The spans one instance lay stopped: each from a stop until its next start or its
    termination (open while it is still stopped). EBS bills a stopped volume."""
    spans: list[Run] = []
    start: float | None = None
    for ev in sorted(events, key=lambda e: e.at):
        if ev.state in STOPPED and start is None:
            start = ev.at
        elif ev.state not in STOPPED and start is not None:
            spans.append(Run(start, max(start, ev.at)))
            start = None
    if start is not None:
        spans.append(Run(start, None))
    return spans


def component_of(inst: InstanceRecord) -> str:
    return STANDBY if inst.role == STANDBY else inst.market


def _covered(run_start: float, run_end: float, spans: Iterable[tuple[float, float]]) -> bool:
    """Whether the ledger already priced this run (an entry of the instance overlaps it)."""
    return any(abs(s - run_start) < 1.0 or (s < run_end and e > run_start) for s, e in spans)


def collect_charges(
    ledger: Sequence[LedgerEntry],
    instances: Sequence[InstanceRecord],
    events: Mapping[str, Sequence[InstanceEvent]],
    *,
    since: float | None,
    until: float,
    volume_gb: float = 0.0,
    gb_month: float = 0.0,
) -> list[Charge]:
    """Every charge whose run starts in [since, until): the ledger's entries (standby
    ones relabelled), then EC2 runs the ledger lacks, closed or accruing up to ``until``,
    then the volumes of stopped instances (``volume_gb`` each at ``gb_month`` $ per
    GB-month, ``mark.billing.ebs_charge``), from their stop to their next start or end."""
    by_id = {i.instance_id: i for i in instances}
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    out: list[Charge] = []
    lo = -float("inf") if since is None else since
    for e in ledger:
        if e.kind == "ec2" and e.instance_id is not None:
            spans[e.instance_id].append((e.start, e.end))
            inst = by_id.get(e.instance_id)
            if inst is not None and inst.role == STANDBY:
                e = replace(e, component=STANDBY)
        if lo <= e.start < until:
            out.append(Charge(e))
    for inst in instances:
        for run in instance_runs(inst, events.get(inst.instance_id, ())):
            if not lo <= run.start < until:
                continue
            end = until if run.end is None else run.end
            if _covered(run.start, end, spans.get(inst.instance_id, ())):
                continue
            charge = ec2_charge(inst.price_per_hour, run.start, end)
            entry = LedgerEntry(
                kind="ec2",
                model=inst.model,
                start=run.start,
                end=end,
                component=component_of(inst),
                unit_price=inst.price_per_hour,
                cost=charge.cost,
                instance_id=inst.instance_id,
                instance_type=inst.instance_type,
                seconds=charge.seconds,
                billed_seconds=charge.billed_seconds,
            )
            out.append(Charge(entry, ACCRUING if run.end is None else BILLED, FROM_EVENTS))
        if volume_gb <= 0.0 or gb_month <= 0.0:
            continue
        for span in stopped_spans(inst, events.get(inst.instance_id, ())):
            if not lo <= span.start < until:
                continue
            end = until if span.end is None else span.end
            entry = LedgerEntry(
                kind=EBS,
                model=inst.model,
                start=span.start,
                end=end,
                component=EBS,
                unit_price=ebs_per_hour(volume_gb, gb_month),
                cost=ebs_charge(volume_gb, gb_month, span.start, end),
                instance_id=inst.instance_id,
                instance_type=inst.instance_type,
                seconds=end - span.start,
            )
            out.append(Charge(entry, ACCRUING if span.end is None else BILLED, FROM_EVENTS))
    return sorted(out, key=lambda c: (c.entry.start, c.entry.kind, c.entry.instance_id or ""))


def utc_day(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d")


@dataclass(frozen=True, slots=True)
class Row:
    """Charges of one (day, model, instance type, component, status), summed."""

    day: str
    model: str
    instance_type: str | None  # None for Lambda
    component: str  # on-demand | spot | standby | lambda | lambda-on-pc | lambda-pc
    status: str  # billed | accruing
    charges: int
    seconds: float
    billed_seconds: float
    requests: int
    gb_seconds: float
    cost: float


def aggregate(charges: Iterable[Charge]) -> list[Row]:
    groups: dict[tuple[str, str, str, str, str], list[Charge]] = defaultdict(list)
    for c in charges:
        e = c.entry
        groups[(utc_day(e.start), e.model, e.instance_type or "", e.component, c.status)].append(c)
    rows = []
    for (day, model, itype, component, status), cs in sorted(groups.items()):
        rows.append(
            Row(
                day=day,
                model=model,
                instance_type=itype or None,
                component=component,
                status=status,
                charges=len(cs),
                seconds=sum(c.entry.seconds for c in cs),
                billed_seconds=sum(c.entry.billed_seconds for c in cs),
                requests=sum(c.entry.requests for c in cs),
                gb_seconds=sum(c.entry.gb_seconds for c in cs),
                cost=sum(c.entry.cost for c in cs),
            )
        )
    return rows


@dataclass(frozen=True, slots=True)
class Totals:
    cost: float
    billed: float
    accruing: float
    by_component: Mapping[str, float]
    ec2_billed_seconds: float
    lambda_requests: int
    lambda_gb_seconds: float  # of invocations, on demand and on provisioned concurrency
    provisioned_gb_seconds: float  # of provisioned concurrency configured


def totals(rows: Sequence[Row]) -> Totals:
    by_component: dict[str, float] = defaultdict(float)
    for r in rows:
        by_component[r.component] += r.cost
    lam = [r for r in rows if r.component in LAMBDA_RUN_COMPONENTS]
    return Totals(
        cost=sum(r.cost for r in rows),
        billed=sum(r.cost for r in rows if r.status == BILLED),
        accruing=sum(r.cost for r in rows if r.status == ACCRUING),
        by_component=dict(sorted(by_component.items())),
        ec2_billed_seconds=sum(
            r.billed_seconds for r in rows if r.component not in LAMBDA_COMPONENTS | {EBS}
        ),
        lambda_requests=sum(r.requests for r in lam),
        lambda_gb_seconds=sum(r.gb_seconds for r in lam),
        provisioned_gb_seconds=sum(r.gb_seconds for r in rows if r.component == LAMBDA_PC),
    )
