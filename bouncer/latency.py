"""Batch latency T_b as a function of batch size, from a few measured points."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise


@dataclass(frozen=True)
class BatchLatency:
    """Piecewise-linear T_b through measured (b, seconds) points.

    Between points it interpolates; beyond the largest it extends the last
    segment's slope (batches cost at least as much per extra item as measured),
    and below the smallest it keeps the smallest point's time.
    """

    points: tuple[tuple[int, float], ...]

    @classmethod
    def from_mapping(cls, table: Mapping[int, float]) -> BatchLatency:
        pts = tuple(sorted((int(b), float(t)) for b, t in table.items()))
        if not pts or any(b < 1 or t <= 0 for b, t in pts):
            raise ValueError(f"a batch latency table needs b >= 1 and T_b > 0, got {dict(table)}")
        return cls(pts)

    def __call__(self, batch: int) -> float:
        pts = self.points
        if batch <= pts[0][0]:
            return pts[0][1]
        for (b0, t0), (b1, t1) in pairwise(pts):
            if batch <= b1:
                return t0 + (t1 - t0) * (batch - b0) / (b1 - b0)
        if len(pts) == 1:
            return pts[0][1] * batch / pts[0][0]
        (b0, t0), (b1, t1) = pts[-2], pts[-1]
        slope = max((t1 - t0) / (b1 - b0), 0.0)
        return t1 + slope * (batch - b1)

    @classmethod
    def parse(cls, text: str) -> BatchLatency:
        """``"1:0.004,8:0.015"`` (batch size: seconds), as ``str()`` writes it."""
        try:
            pairs = [item.split(":") for item in text.split(",") if item.strip()]
            return cls.from_mapping({int(b): float(t) for b, t in pairs})
        except ValueError as exc:
            raise ValueError(f"a batch latency is b:seconds,... ({exc})") from None

    def __str__(self) -> str:
        return ",".join(f"{b}:{t!r}" for b, t in self.points)

    def scaled(self, factor: float) -> BatchLatency:
        """The same curve on a machine ``factor`` times slower (factor > 1) or faster."""
        return BatchLatency(tuple((b, t * factor) for b, t in self.points))
