"""What the dispatcher holds: the backends (agents) it batches to, each row it has taken
(``Queued``) and the ``submit`` call it belongs to (``Group``), the batches in flight
(``Flight``) and every row's ``Outcome``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bouncer.latency import BatchLatency
from bouncer.miss_budget import DECLINED_ERROR
from bouncer.routing import finish_if_sent

DECLINED = DECLINED_ERROR
"""The error of a request declined instead of spilled (``bouncer.miss_budget``)."""


@dataclass
class Backend:
    """An instance's agent as the frontend sees it."""

    instance_id: str
    instance_type: str
    url: str
    latency: BatchLatency
    n_batch: int = 1
    w_batch_s: float = 0.0
    busy_until: float = 0.0
    penalised_until: float = 0.0
    """Until then the instance gets no batches: it just hung or failed one."""
    allowance_s: float = 0.0
    """Taken off each deadline the agent is given: how late its results come back
    (``bouncer.routing.allowance_after``)."""
    variants: dict[str, BatchLatency] = field(default_factory=dict)
    """T_b of each variant the agent loaded beside the model's own (``latency``)."""

    def finish_if_sent(self, now: float, size: int = 1) -> float:
        return finish_if_sent(now, self.busy_until, self.latency(size))


@dataclass(frozen=True, slots=True)
class Outcome:
    output: Any | None
    error: str | None
    served_by: str  # instance id, "lambda", or "none"
    latency_s: float
    variant: str | None = None
    """The variant that served it, where the model has variants."""

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def spilled(self) -> bool:
        return self.served_by == "lambda"

    @property
    def declined(self) -> bool:
        """Declined by the miss budget instead of spilled (a miss, not a failure to serve)."""
        return self.error == DECLINED


class Group:
    """The requests of one ``submit`` call: their outcomes, and a future set when all ended."""

    __slots__ = ("done", "floor", "outcomes", "pending", "pin")

    def __init__(
        self, n: int, done: asyncio.Future[None], pin: str | None = None, floor: float = 0.0
    ) -> None:
        self.outcomes: list[Outcome | None] = [None] * n
        self.pending = n
        self.done = done
        self.pin = pin
        """The variant the client pinned (``VARIANT_HEADER``), if any."""
        self.floor = floor
        """The least accuracy a variant must have to serve it (``FLOOR_HEADER``)."""


Row = np.ndarray[Any, Any] | dict[str, np.ndarray[Any, Any]]
"""One request's instance: the one input's, or each named input's."""


def row_shape(row: Row) -> tuple[Any, ...]:
    """What a batch's rows must share: each input's instance shape."""
    if isinstance(row, dict):
        return tuple(a.shape for a in row.values())
    return tuple(row.shape)


def row_plain(row: Row) -> Any:
    return {n: a.tolist() for n, a in row.items()} if isinstance(row, dict) else row.tolist()


class Queued:
    """One row of a ``submit``, from its arrival until it has its outcome."""

    __slots__ = ("arrival", "deadline", "group", "index", "row", "spilled")

    def __init__(self, row: Row, arrival: float, deadline: float, group: Group, index: int) -> None:
        self.row = row
        self.arrival = arrival
        self.deadline = deadline
        self.group = group
        self.index = index
        self.spilled = False  # handed to Lambda (or failed for want of it): never again

    @property
    def finished(self) -> bool:
        return self.group.outcomes[self.index] is not None

    @property
    def owed(self) -> bool:
        """Neither answered nor handed to Lambda: whoever holds it still owes an answer."""
        return not self.spilled and not self.finished


@dataclass(eq=False)
class Flight:
    """A batch sent to an instance and not settled: the exchange's task, and the timer
    that declares the batch hung."""

    backend: Backend
    batch: list[Queued]
    variant: str | None = None
    """The variant it runs on (None: the model has none); the agent's verdict may change
    it to ``fallback``."""
    fallback: str | None = None
    task: asyncio.Task[None] | None = None
    timer: asyncio.TimerHandle | None = None

    @property
    def instance_id(self) -> str:
        return self.backend.instance_id
