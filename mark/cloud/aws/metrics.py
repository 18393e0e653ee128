"""CloudWatch metrics of the serving fleet: what an operator alarms on.

Per model (dimension ``Model``, plus ``Cluster``) in namespace ``mark``:

* ``ArrivalRate`` — requests per second over the period (Count/Second);
* ``SLOAttainment`` — share of the period's finished requests within RT_max (Percent);
* ``FleetCostRate`` — dollars per hour of the model's live instances (None: CloudWatch has
  no currency unit), from the leading frontend only.

The daemon hands over what telemetry drained each P_s (``observe``) and what
the fleet costs now (``set_cost_rate``); ``publish`` sends one datapoint per
metric per period (a minute, CloudWatch's standard resolution) with
``PutMetricData``, so a quiet period is a 0 arrival rate, not a gap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from mark.cloud.aws.client import OwnedClient
from mark.cloud.aws.errors import map_client_error
from mark.errors import CloudError
from mark.state.records import ArrivalWindow, LatencyRollup

NAMESPACE = "mark"
_PER_CALL = 20  # entries per PutMetricData (the conservative, long-standing limit)


@dataclass
class _Period:
    requests: int = 0
    seconds: float = 0.0
    hits: int = 0
    finished: int = 0


@dataclass(frozen=True, slots=True)
class ModelMetrics:
    model: str
    arrival_rate: float
    slo_attainment: float | None  # None: nothing finished this period
    cost_rate: float | None  # None: not this frontend's to publish (it does not lead)


def metric_data(m: ModelMetrics, cluster: str, at: datetime) -> list[dict[str, Any]]:
    """The PutMetricData entries of one model's period."""
    dims = [{"Name": "Model", "Value": m.model}, {"Name": "Cluster", "Value": cluster}]
    out: list[dict[str, Any]] = [
        {
            "MetricName": "ArrivalRate",
            "Dimensions": dims,
            "Timestamp": at,
            "Value": m.arrival_rate,
            "Unit": "Count/Second",
        },
    ]
    if m.cost_rate is not None:
        out.append(
            {
                "MetricName": "FleetCostRate",
                "Dimensions": dims,
                "Timestamp": at,
                "Value": m.cost_rate,
                "Unit": "None",
            }
        )
    if m.slo_attainment is not None:
        out.append(
            {
                "MetricName": "SLOAttainment",
                "Dimensions": dims,
                "Timestamp": at,
                "Value": 100.0 * m.slo_attainment,
                "Unit": "Percent",
            }
        )
    return out


class CloudWatchMetrics(OwnedClient):
    service = "cloudwatch"

    def __init__(
        self,
        models: Sequence[str],
        *,
        cluster: str,
        region: str,
        endpoint_url: str | None = None,
        namespace: str = NAMESPACE,
        client: Any = None,
    ) -> None:
        self.models = list(models)
        self.cluster = cluster
        self.region = region
        self.endpoint_url = endpoint_url
        self.namespace = namespace
        self._client: Any = client
        self._client_cm: Any = None
        self._periods: dict[str, _Period] = {m: _Period() for m in self.models}
        self._cost: dict[str, float] | None = {}

    def observe(self, windows: Sequence[ArrivalWindow], rollups: Sequence[LatencyRollup]) -> None:
        """Add what telemetry drained (closed arrival windows, latency roll-ups)."""
        for w in windows:
            p = self._periods.setdefault(w.model, _Period())
            p.requests += w.count
            p.seconds += w.window_s
        for r in rollups:
            p = self._periods.setdefault(r.model, _Period())
            p.hits += r.slo_hits
            p.finished += r.slo_hits + r.slo_misses

    def set_cost_rate(self, per_model: Mapping[str, float] | None) -> None:
        """Dollars per hour of each model's live fleet now; None: publish no cost (another
        frontend leads and publishes it)."""
        self._cost = dict(per_model) if per_model is not None else None

    def take(self) -> list[ModelMetrics]:
        """This period's figures per model; the next period starts empty."""
        out = []
        for model, p in sorted(self._periods.items()):
            out.append(
                ModelMetrics(
                    model,
                    p.requests / p.seconds if p.seconds > 0 else 0.0,
                    p.hits / p.finished if p.finished else None,
                    self._cost.get(model, 0.0) if self._cost is not None else None,
                )
            )
        self._periods = {m: _Period() for m in self._periods}
        return out

    async def publish(self, at: float) -> list[ModelMetrics]:
        """Send this period's datapoints (stamped ``at``); returns what was sent."""
        if self._client is None:
            raise CloudError("CloudWatchMetrics is not open: use `async with` or `open()`")
        figures = self.take()
        stamp = datetime.fromtimestamp(at, UTC)
        data = [d for m in figures for d in metric_data(m, self.cluster, stamp)]
        for start in range(0, len(data), _PER_CALL):
            try:
                await self._client.put_metric_data(
                    Namespace=self.namespace, MetricData=data[start : start + _PER_CALL]
                )
            except ClientError as err:
                raise map_client_error(err, "put_metric_data") from err
            except BotoCoreError as err:
                raise CloudError(f"put_metric_data: {err}") from err
        return figures
