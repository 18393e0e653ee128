"""Value types of the catalog and the loader of the shipped data."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from mark.errors import UnknownOffering

SECONDS_PER_HOUR = 3600.0


class Market(StrEnum):
    ON_DEMAND = "on-demand"
    SPOT = "spot"


class Accelerator(StrEnum):
    CPU = "cpu"
    GPU = "gpu"
    INFERENTIA = "inferentia"
    TRAINIUM = "trainium"


@dataclass(frozen=True, slots=True)
class InstanceType:
    """Hardware of one EC2 instance type (from DescribeInstanceTypes)."""

    name: str
    vcpus: int
    memory_mib: int
    accelerator: Accelerator
    burstable: bool
    arch: str
    gpus: int
    gpu_model: str | None
    neuron_cores: int
    spot_supported: bool

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]


@dataclass(frozen=True, slots=True)
class Offering:
    """An instance type bought in one market, at one price."""

    instance_type: InstanceType
    market: Market
    price_per_hour: float

    @property
    def name(self) -> str:
        """Stable key, e.g. ``c5.large/spot``."""
        return f"{self.instance_type.name}/{self.market.value}"

    @property
    def type_name(self) -> str:
        return self.instance_type.name

    @property
    def price_per_second(self) -> float:
        return self.price_per_hour / SECONDS_PER_HOUR

    @property
    def accelerator(self) -> Accelerator:
        return self.instance_type.accelerator


class Offerings(tuple[Offering, ...]):
    """A filterable list of offerings; each filter returns a new ``Offerings``."""

    def compatible(
        self,
        *,
        accelerator: Accelerator | str | None = None,
        market: Market | str | None = None,
        burstable: bool | None = None,
        families: Iterable[str] | None = None,
        arch: str | None = None,
    ) -> Offerings:
        fams = set(families) if families is not None else None
        acc = Accelerator(accelerator) if accelerator is not None else None
        mkt = Market(market) if market is not None else None
        return Offerings(
            o
            for o in self
            if (acc is None or o.instance_type.accelerator is acc)
            and (mkt is None or o.market is mkt)
            and (burstable is None or o.instance_type.burstable == burstable)
            and (fams is None or o.instance_type.family in fams)
            and (arch is None or o.instance_type.arch == arch)
        )

    def of_types(self, names: Iterable[str]) -> Offerings:
        wanted = set(names)
        return Offerings(o for o in self if o.instance_type.name in wanted)

    def cheapest(self) -> Offering:
        if not self:
            raise UnknownOffering("no offering matches")
        return min(self, key=lambda o: (o.price_per_hour, o.name))

    def sorted(self) -> Offerings:
        return Offerings(sorted(self, key=lambda o: (o.instance_type.name, o.market.value)))


@dataclass(frozen=True, slots=True)
class LambdaPrices:
    per_gb_second_x86: float
    per_gb_second_arm64: float
    per_million_requests: float
    # Provisioned concurrency, x86, us-east-1 (https://aws.amazon.com/lambda/pricing/,
    # "Provisioned Concurrency Pricing"): the configured concurrency times memory, per
    # GB-second while it is configured (rounded up to 5 minutes), and the duration of
    # requests it serves at this rate instead of per_gb_second_x86.
    provisioned_concurrency_per_gb_second_x86: float
    provisioned_duration_per_gb_second_x86: float

    @property
    def per_request(self) -> float:
        return self.per_million_requests / 1_000_000


@dataclass(frozen=True)
class Catalog:
    """Instance types, their offerings, Lambda and EBS prices for one region."""

    region: str
    types: Mapping[str, InstanceType]
    on_demand: Mapping[str, float]
    spot: Mapping[str, float]
    lambda_prices: LambdaPrices
    ebs_gb_month: float
    """$ per GB-month of gp3 storage (the price file's ``ebs_gp3_per_gb_month``): what a
    stopped instance still costs, its volume (``mark.billing.ebs_charge``)."""

    def instance_type(self, name: str) -> InstanceType:
        try:
            return self.types[name]
        except KeyError:
            raise UnknownOffering(
                f"unknown instance type {name!r}; `mark catalog` lists the "
                f"{len(self.types)} known types"
            ) from None

    def offerings(self) -> Offerings:
        """Every (type, market) with hardware data and a price; spot only where supported."""
        out: list[Offering] = []
        for name, itype in self.types.items():
            if name in self.on_demand:
                out.append(Offering(itype, Market.ON_DEMAND, self.on_demand[name]))
            if itype.spot_supported and name in self.spot:
                out.append(Offering(itype, Market.SPOT, self.spot[name]))
        return Offerings(out).sorted()

    def offering(self, type_name: str, market: Market | str) -> Offering:
        itype = self.instance_type(type_name)
        mkt = Market(market)
        prices = self.on_demand if mkt is Market.ON_DEMAND else self.spot
        if mkt is Market.SPOT and not itype.spot_supported:
            raise UnknownOffering(f"{type_name} cannot be bought as spot")
        if type_name not in prices:
            raise UnknownOffering(f"no {mkt.value} price for {type_name} in {self.region}")
        return Offering(itype, mkt, prices[type_name])

    def with_spot_prices(self, prices: Mapping[str, float]) -> Catalog:
        """A copy with fresher spot prices (e.g. from describe_spot_price_history)."""
        merged = dict(self.spot)
        merged.update({k: float(v) for k, v in prices.items() if v > 0})
        return replace(self, spot=merged)


def _instance_type(name: str, rec: Mapping[str, Any]) -> InstanceType:
    return InstanceType(
        name=name,
        vcpus=int(rec["vcpus"]),
        memory_mib=int(rec["memory_mib"]),
        accelerator=Accelerator(rec["accelerator"]),
        burstable=bool(rec["burstable"]),
        arch=str(rec["arch"]),
        gpus=int(rec.get("gpus", 0)),
        gpu_model=rec.get("gpu_model"),
        neuron_cores=int(rec.get("neuron_cores", 0)),
        spot_supported=bool(rec.get("spot_supported", True)),
    )


def _read_json(data_dir: Path | None, name: str) -> Any:
    if data_dir is not None:
        return json.loads((data_dir / name).read_text())
    return json.loads(resources.files("mark.catalog").joinpath("data", name).read_text())


def _load(data_dir: Path | None) -> Catalog:
    raw_types: dict[str, Any] = dict(_read_json(data_dir, "instance-types.json"))
    for name, rec in _read_json(data_dir, "supplementary-types.json").items():
        raw_types.setdefault(name, rec)
    prices = _read_json(data_dir, "prices-us-east-1.json")
    lam = prices["lambda"]
    return Catalog(
        region=str(prices["region"]),
        types={n: _instance_type(n, r) for n, r in sorted(raw_types.items())},
        on_demand={k: float(v) for k, v in prices["on_demand_per_hour"].items()},
        spot={k: float(v) for k, v in prices["spot_per_hour"].items()},
        lambda_prices=LambdaPrices(
            per_gb_second_x86=float(lam["per_gb_second_x86"]),
            per_gb_second_arm64=float(lam["per_gb_second_arm64"]),
            per_million_requests=float(lam["per_million_requests"]),
            provisioned_concurrency_per_gb_second_x86=float(
                lam["provisioned_concurrency_per_gb_second_x86"]
            ),
            provisioned_duration_per_gb_second_x86=float(
                lam["provisioned_duration_per_gb_second_x86"]
            ),
        ),
        ebs_gb_month=float(prices["ebs_gp3_per_gb_month"]),
    )


@cache
def _load_shipped() -> Catalog:
    return _load(None)


def load_catalog(data_dir: Path | None = None) -> Catalog:
    """The shipped us-east-1 catalog (cached), or one read from ``data_dir``."""
    return _load_shipped() if data_dir is None else _load(data_dir)
