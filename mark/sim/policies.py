"""The policies a simulation compares, each a named set of switches.

``mark`` and ``mark-spot`` are the full system (the daemon's controller,
planner, Bouncer, Lambda spill, SLO monitor; spot with burstable standbys).
The ablations take one part away from ``mark-spot``; ``mark`` itself is the
"no spot" ablation. ``reactive`` has no forecast (it plans for the load just
seen) and no Lambda, only the SLO monitor to catch up. ``sagemaker`` is AWS
target tracking on one instance type with the paper's 2× over-provisioning, as
a SageMaker user pays it: ml.* hosting prices, a type SageMaker offers,
CloudWatch's metric delay, cooldowns from completion, no re-scaling while the
endpoint updates, InvokeEndpoint's 60 s timeout (``mark.sim.drive_sagemaker``).
``ec2-target-tracking`` is the same target tracking in a kinder world, the
strong comparison: EC2 on-demand prices, any EC2 type, none of those delays.
Both size their target from the pooled capacity mark plans with; each also runs
``-equal-slo``: at the loosest target that meets SL_min (``mark.sim.equal_slo``).
``clairvoyant`` is an instance-only clairvoyant schedule (the MILP on the true
future load's per-minute peaks; served with the Bouncer, which spills to Lambda
what its instances cannot finish in time). It is not a lower bound: that is
``mark.sim.bound``, reported beside every policy. ``optimal`` and
``optimal-spot``, its former names, are still accepted, with a note.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from mark.errors import ConfigError

Kind = Literal["mark", "sagemaker", "clairvoyant"]
Hosting = Literal["ec2", "sagemaker"]


@dataclass(frozen=True)
class Policy:
    name: str
    kind: Kind
    markets: tuple[str, ...] = ("on-demand",)
    spill: bool = True  # Bouncer admission with Lambda spill
    batching: bool = True
    prediction: bool = True
    slo_monitor: bool = True
    standbys: bool = False
    hosting: Hosting = "ec2"
    """What the instances are bought as: EC2, or SageMaker ml.* hosting (its prices and
    types, its delays, InvokeEndpoint's timeout)."""
    equal_slo: bool = False
    """A target-tracking baseline run at the loosest target that still meets SL_min
    (``mark.sim.equal_slo``), so it is compared with mark at an equal SLO."""
    description: str = ""


POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy("mark", "mark", description="MArk, on-demand instances only"),
        Policy(
            "mark-spot",
            "mark",
            markets=("on-demand", "spot"),
            standbys=True,
            description="MArk with spot instances and burstable standbys",
        ),
        Policy(
            "sagemaker",
            "sagemaker",
            spill=False,
            slo_monitor=False,
            hosting="sagemaker",
            description="the paper's baseline as users pay it: target tracking, 2× "
            "over-provisioned, on the ml.* type SageMaker offers that is cheapest per request, "
            "at ml.* prices, with CloudWatch's delay, cooldowns from completion and a 60 s "
            "invocation timeout",
        ),
        Policy(
            "ec2-target-tracking",
            "sagemaker",
            spill=False,
            slo_monitor=False,
            description="the same target tracking in a kinder world: EC2 on-demand prices, "
            "the EC2 type cheapest per request, no metric delay, cooldowns from the decision",
        ),
        Policy(
            "sagemaker-equal-slo",
            "sagemaker",
            spill=False,
            slo_monitor=False,
            hosting="sagemaker",
            equal_slo=True,
            description="sagemaker at the loosest target that meets SL_min on the window "
            "(found by search on the window itself: a kindness to the baseline)",
        ),
        Policy(
            "ec2-target-tracking-equal-slo",
            "sagemaker",
            spill=False,
            slo_monitor=False,
            equal_slo=True,
            description="ec2-target-tracking at the loosest target that meets SL_min on "
            "the window (found by search on the window itself)",
        ),
        Policy(
            "reactive",
            "mark",
            spill=False,
            prediction=False,
            description="plans for the load just seen; SLO monitor, no Lambda",
        ),
        Policy(
            "no-lambda",
            "mark",
            markets=("on-demand", "spot"),
            standbys=True,
            spill=False,
            description="mark-spot without the Bouncer's Lambda spill",
        ),
        Policy(
            "no-batching",
            "mark",
            markets=("on-demand", "spot"),
            standbys=True,
            batching=False,
            description="mark-spot with N_batch = 1 everywhere",
        ),
        Policy(
            "no-prediction",
            "mark",
            markets=("on-demand", "spot"),
            standbys=True,
            prediction=False,
            description="mark-spot planning for the load just seen",
        ),
        Policy(
            "clairvoyant",
            "clairvoyant",
            description="instance-only clairvoyant schedule: the MILP covering each minute's "
            "true peak with instances, on-demand (not a lower bound; see the bound)",
        ),
        Policy(
            "clairvoyant-spot",
            "clairvoyant",
            markets=("on-demand", "spot"),
            description="instance-only clairvoyant schedule, with spot",
        ),
    )
}

# Former names, still accepted: each is resolved with a deprecation note.
ALIASES: dict[str, str] = {"optimal": "clairvoyant", "optimal-spot": "clairvoyant-spot"}


def parse_policies(text: str, note: Callable[[str], None] | None = None) -> list[Policy]:
    """The policies named in ``text`` (comma-separated), in order, each once. A former
    name (``ALIASES``) is resolved and ``note`` told (a ``DeprecationWarning`` if None)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ConfigError("no policy given")
    for old in dict.fromkeys(n for n in names if n in ALIASES):
        msg = (
            f"policy {old!r} is now {ALIASES[old]!r} (an instance-only clairvoyant schedule, "
            "not a lower bound); the old name will go"
        )
        if note is not None:
            note(msg)
        else:
            warnings.warn(msg, DeprecationWarning, stacklevel=2)
    names = [ALIASES.get(n, n) for n in names]
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        raise ConfigError(
            f"unknown polic{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
            f"known: {', '.join(POLICIES)}"
        )
    return [POLICIES[n] for n in dict.fromkeys(names)]
