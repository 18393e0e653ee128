"""SageMaker real-time hosting (ml.*) prices: what a user of the paper's baseline pays.

SageMaker runs an endpoint on ``ml.*`` instances billed per instance-hour at
their own price, above the EC2 on-demand price of the type they run on. The
shipped table (``data/sagemaker-hosting-us-east-1.json``, sources in
``data/README.md``) gives each priced type either a cited price (``source`` is
where AWS gives it) or a derived one (``source == "derived"``, ``rule`` = the
family's documented markup × the EC2 on-demand price of the shipped catalog).
A family with no documented markup has no price, so nothing can run on it as
SageMaker. Families AWS is retiring (P2, P3) keep their price but are not
*offered*: they are used only when a user asks for the type by name.

Keyed by the EC2 type name (``c5.xlarge`` for ``ml.c5.xlarge``), the name the
simulator's profiles and the catalog use.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from mark.errors import UnknownOffering

HOSTING_FILE = "sagemaker-hosting-us-east-1.json"
DERIVED = "derived"


def family_of(instance_type: str) -> str:
    return instance_type.split(".", 1)[0]


@dataclass(frozen=True, slots=True)
class HostingPrice:
    """The ml.* real-time hosting price of one type, and where it comes from."""

    instance_type: str
    """The EC2 type the ml.* type runs on, e.g. ``c5.xlarge``."""
    price_per_hour: float
    source: str
    """A citation, or ``"derived"`` (then ``rule`` says how)."""
    rule: str | None = None
    offered: bool = True
    """False for a family AWS is retiring: used only when asked for by name."""

    @property
    def ml_type(self) -> str:
        return f"ml.{self.instance_type}"

    @property
    def derived(self) -> bool:
        return self.source == DERIVED


@dataclass(frozen=True, slots=True)
class Markup:
    """ml.* price / EC2 on-demand price of a family, and how it was derived."""

    family: str
    ratio: float
    derivation: str


@dataclass(frozen=True)
class HostingPrices:
    region: str
    prices: Mapping[str, HostingPrice]
    markups: Mapping[str, Markup]
    retiring: Mapping[str, str]
    """family → why SageMaker users would not pick it today."""
    unpriced: Mapping[str, str]
    """family → why it has no price here."""

    def why_not(self, instance_type: str) -> str:
        """Why ``instance_type`` has no ml.* price (for an error message)."""
        fam = family_of(instance_type)
        reason = self.unpriced.get(fam)
        if reason is None:
            reason = f"no citable ml.{fam} price and no documented {fam} markup"
        if fam in self.retiring:
            reason += f"; {self.retiring[fam]}"
        return reason

    def price(self, instance_type: str) -> HostingPrice:
        """The ml.* price of the type; ``UnknownOffering`` saying why when it has none."""
        try:
            return self.prices[instance_type]
        except KeyError:
            raise UnknownOffering(
                f"no SageMaker ml.* hosting price for {instance_type} in {self.region}: "
                f"{self.why_not(instance_type)}"
            ) from None

    def offered(self) -> list[str]:
        """Types with a price in a family SageMaker users would pick today."""
        return sorted(t for t, p in self.prices.items() if p.offered)


def _read(data_dir: Path | None) -> Any:
    if data_dir is not None:
        return json.loads((data_dir / HOSTING_FILE).read_text())
    return json.loads(resources.files("mark.catalog").joinpath("data", HOSTING_FILE).read_text())


def _load(data_dir: Path | None) -> HostingPrices:
    raw = _read(data_dir)
    retiring = {str(k): str(v) for k, v in raw.get("retiring", {}).items()}
    prices = {}
    for name, rec in raw["prices"].items():
        source = str(rec["source"])
        rule = rec.get("rule")
        if source == DERIVED and not rule:
            raise ValueError(f"{HOSTING_FILE}: {name} is derived but gives no rule")
        prices[name] = HostingPrice(
            instance_type=name,
            price_per_hour=float(rec["price_per_hour"]),
            source=source,
            rule=None if rule is None else str(rule),
            offered=family_of(name) not in retiring,
        )
    return HostingPrices(
        region=str(raw["region"]),
        prices=prices,
        markups={
            f: Markup(f, float(m["ratio"]), str(m["derivation"]))
            for f, m in raw.get("markups", {}).items()
        },
        retiring=retiring,
        unpriced={str(k): str(v) for k, v in raw.get("unpriced", {}).items()},
    )


@cache
def _load_shipped() -> HostingPrices:
    return _load(None)


def load_hosting_prices(data_dir: Path | None = None) -> HostingPrices:
    """The shipped us-east-1 ml.* hosting prices (cached), or those read from ``data_dir``."""
    return _load_shipped() if data_dir is None else _load(data_dir)
