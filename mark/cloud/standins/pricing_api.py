"""Stand-in for the AWS Price List Query API's ``GetProducts``, answering from given prices.

moto has no Pricing backend (its server answers 500), so this server speaks
the API's JSON 1.1 protocol (``POST /``, ``X-Amz-Target:
AWSPriceListService.GetProducts``) for ``ServiceCode=AmazonEC2`` and returns
each price as a Price List item in AWS's shape: a JSON *string* holding
``product.attributes`` (instanceType, regionCode, operatingSystem, tenancy,
preInstalledSw, capacitystatus, licenseModel) and ``terms.OnDemand`` with one
hourly USD price dimension. ``TERM_MATCH`` filters select items; ``MaxResults``
and ``NextToken`` page them. By default it serves the shipped catalog's
on-demand prices, so it is "the Pricing API with the shipped prices".

Not emulated: other services and attribute values (only the Linux, shared,
no-licence product of each type exists), ``DescribeServices``,
``GetAttributeValues``, reserved terms.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from mark.catalog import load_catalog
from mark.cloud.aws.pricing import LINUX_ON_DEMAND

_TARGET = "AWSPriceListService.GetProducts"
_ON_DEMAND_TERM = "JRTCKXETXF"  # AWS's offer term code for on-demand
_HOURLY_RATE = "6YS6EN2CT7"  # and for its hourly price dimension


def price_item(instance_type: str, region: str, usd_per_hour: float) -> str:
    """One Price List item, as the JSON string GetProducts returns in ``PriceList``."""
    sku = hashlib.sha1(f"{region}/{instance_type}".encode()).hexdigest()[:16].upper()
    term = f"{sku}.{_ON_DEMAND_TERM}"
    rate = f"{term}.{_HOURLY_RATE}"
    doc = {
        "product": {
            "productFamily": "Compute Instance",
            "attributes": {
                "servicecode": "AmazonEC2",
                "instanceType": instance_type,
                "regionCode": region,
                **LINUX_ON_DEMAND,
                "operation": "RunInstances",
            },
            "sku": sku,
        },
        "serviceCode": "AmazonEC2",
        "terms": {
            "OnDemand": {
                term: {
                    "priceDimensions": {
                        rate: {
                            "unit": "Hrs",
                            "endRange": "Inf",
                            "description": f"${usd_per_hour} per On Demand Linux "
                            f"{instance_type} Instance Hour",
                            "appliesTo": [],
                            "rateCode": rate,
                            "beginRange": "0",
                            "pricePerUnit": {"USD": f"{usd_per_hour:.10f}"},
                        }
                    },
                    "sku": sku,
                    "effectiveDate": "2026-01-01T00:00:00Z",
                    "offerTermCode": _ON_DEMAND_TERM,
                    "termAttributes": {},
                }
            }
        },
        "version": "20260101000000",
        "publicationDate": "2026-01-01T00:00:00Z",
    }
    return json.dumps(doc)


class PricingApi:
    def __init__(
        self,
        prices: Mapping[str, float] | None = None,
        region: str = "us-east-1",
        host: str = "127.0.0.1",
    ) -> None:
        catalog = load_catalog()
        self.prices = dict(prices if prices is not None else catalog.on_demand)
        self.region = region
        self.host = host
        self.url = ""
        self.calls = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        self.url = f"http://{self.host}:{self._runner.addresses[0][1]}"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _products(self) -> list[dict[str, str]]:
        return [
            {"instanceType": t, "regionCode": self.region, **LINUX_ON_DEMAND}
            for t in sorted(self.prices)
        ]

    async def _handle(self, request: web.Request) -> web.Response:
        if request.headers.get("X-Amz-Target") != _TARGET:
            return _error(400, "UnknownOperationException", "only GetProducts is served here")
        try:
            body: dict[str, Any] = json.loads(await request.read())
            filters = body.get("Filters", [])
            wanted = {str(f["Field"]): str(f["Value"]) for f in filters}
            if any(f.get("Type", "TERM_MATCH") != "TERM_MATCH" for f in filters):
                raise ValueError("only TERM_MATCH filters")
            max_results = int(body.get("MaxResults", 100))
            start = int(body.get("NextToken") or 0)
        except (ValueError, KeyError, TypeError) as exc:
            return _error(400, "InvalidParameterException", str(exc))
        if body.get("ServiceCode") != "AmazonEC2":
            return _error(404, "NotFoundException", "only AmazonEC2 is served here")
        self.calls += 1
        matches = [p for p in self._products() if all(p.get(k) == v for k, v in wanted.items())]
        page = matches[start : start + max_results]
        out: dict[str, Any] = {
            "FormatVersion": "aws_v1",
            "PriceList": [
                price_item(p["instanceType"], self.region, self.prices[p["instanceType"]])
                for p in page
            ],
        }
        if start + max_results < len(matches):
            out["NextToken"] = str(start + max_results)
        return web.json_response(out, content_type="application/x-amz-json-1.1")


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response(
        {"__type": code, "Message": message},
        status=status,
        content_type="application/x-amz-json-1.1",
    )
