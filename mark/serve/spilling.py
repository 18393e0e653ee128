"""Every row's last hop, for the dispatcher (``mark.serve.dispatcher``): its outcome,
once (the miss budget and telemetry told), and the spill to Lambda of what an instance
could not take, less what the miss budget declines, each row handed over at most once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from bouncer.latency import BatchLatency
from bouncer.miss_budget import MissBudget
from bouncer.routing import spill_chunks
from bouncer.variants import AccuracyLedger
from mark.ports import Serverless
from mark.serve.flight import DECLINED, Outcome, Queued, row_plain, row_shape
from mark.serve.telemetry import Telemetry

SHUTTING_DOWN = "mark is shutting down"
"""The error of every request the dispatcher still holds when it closes, or gets after."""

DECLINABLE_CAUSES = frozenset({"rejected", "no-backend"})
"""The spills the miss budget may decline: those for want of capacity, as the simulator's
engine has them (its requests are one row each, as only one-row requests are declined
here). A request whose instance failed or left is owed its spill."""


def pinned_unserved(variant: str | None) -> str:
    """The error of a request pinned to a variant no instance could serve in time."""
    return (
        f"variant {variant!r} could not serve this request within RT_max (no instance of it "
        "was free, and the spill function runs only the model's most accurate variant); "
        "retry, or leave the variant unpinned"
    )


class Spilling:
    """The dispatcher's outcomes and spills (a part of ``Dispatcher``)."""

    model: str
    dtype: str
    rt_max_s: float
    clock: Callable[[], float]
    serverless: Serverless | None
    telemetry: Telemetry | None
    budget: MissBudget | None
    spill_batches: BatchLatency | None
    primary: str | None
    accuracy: dict[str, float]
    ledger: AccuracyLedger
    spill_timeout_s: float
    give_up_after_s: float
    _may_spill: bool

    if TYPE_CHECKING:

        def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]: ...

    def _give_up(self, reqs: list[Queued]) -> None:
        for r in reqs:
            r.spilled = True  # too late for Lambda too
            self._finish(r, None, f"no result within {self.give_up_after_s:g} s", "none")

    def _finish(
        self,
        r: Queued,
        output: Any,
        error: str | None,
        served_by: str,
        variant: str | None = None,
    ) -> None:
        group = r.group
        if group.outcomes[r.index] is not None:
            return
        now = self.clock()
        outcome = Outcome(output, error, served_by, now - r.arrival, variant)
        if variant is not None and error is None and served_by == "lambda":
            self.ledger.served(now, self.accuracy[variant], 1)  # an instance's: as sent
        group.outcomes[r.index] = outcome
        group.pending -= 1
        if group.pending == 0 and not group.done.done():
            group.done.set_result(None)
        declined = outcome.declined
        if (
            self.budget is not None
            and not declined  # counted when declined
            and (not outcome.ok or outcome.latency_s > self.rt_max_s)
        ):
            self.budget.miss(now)
        if self.telemetry is not None:
            self.telemetry.outcome(
                now, outcome.latency_s, ok=outcome.ok, spilled=outcome.spilled, declined=declined
            )

    def _spill(self, reqs: Sequence[Queued], cause: str, instance_type: str | None = None) -> None:
        """Hand to Lambda each request still owed: its last hop, taken once. ``cause``
        (``telemetry.SPILL_CAUSES``) is what ``/metrics`` counts it under."""
        todo = [r for r in reqs if r.owed]
        for r in todo:
            r.spilled = True
        if self.primary is not None:
            # The spill function runs the model's own artifact: a row pinned to another
            # variant gets an explicit error rather than a variant it did not ask for.
            pinned = [r for r in todo if r.group.pin not in (None, self.primary)]
            for r in pinned:
                self._finish(r, None, pinned_unserved(r.group.pin), "none")
            todo = [r for r in todo if r.group.pin in (None, self.primary)]
        if not todo:
            return
        if self.budget is not None and cause in DECLINABLE_CAUSES and self._may_spill:
            # Only a request of one row: a declined row fails its whole request (a 503),
            # so declining one row of several would waste what its other rows cost.
            single = [r for r in todo if len(r.group.outcomes) == 1]
            n = self.budget.decline(self.clock(), len(single))
            if n:
                declined = set(map(id, single[:n]))
                for r in single[:n]:
                    self._finish(r, None, DECLINED, "none")
                todo = [r for r in todo if id(r) not in declined]
            if not todo:
                return
        if not self._may_spill:
            for r in todo:
                self._finish(r, None, SHUTTING_DOWN, "none")
            return
        if self.serverless is None:
            for r in todo:
                self._finish(r, None, "no serving capacity and no spill function", "none")
            return
        if self.telemetry is not None:
            self.telemetry.spilled(cause, len(todo), instance_type)
        # Invocations run side by side, as Lambda scales out per concurrent request; each
        # takes rows of one shape (a batch is one array), as many as the function's batch
        # curve finishes by their deadlines.
        shapes: dict[tuple[Any, ...], list[Queued]] = {}
        for r in todo:
            shapes.setdefault(row_shape(r.row), []).append(r)
        now = self.clock()
        for rows in shapes.values():
            for part in spill_chunks(now, [r.deadline for r in rows], self.spill_batches):
                self._spawn(self._invoke(self.serverless, [rows[i] for i in part]))

    async def _invoke(self, serverless: Serverless, chunk: list[Queued]) -> None:
        """One invocation; every request in it ends, with an output or an explicit error."""
        deadline = asyncio.timeout(self.spill_timeout_s)
        try:
            async with deadline:
                rows = [row_plain(r.row) for r in chunk]
                result = await serverless.invoke(self.model, rows, dtype=self.dtype)
            outputs = list(result.outputs)
            if len(outputs) != len(chunk):
                raise ValueError(f"{len(outputs)} outputs for {len(chunk)} requests")
            for r, out in zip(chunk, outputs, strict=True):
                self._finish(r, out, None, "lambda", self.primary)
        except asyncio.CancelledError:
            self._fail(chunk, "spill cancelled: mark is shutting down")
            raise
        except Exception as exc:  # CloudError, a payload read error, a bad reply: never silent
            if isinstance(exc, TimeoutError) and deadline.expired():
                why = f"no answer within {self.spill_timeout_s:g} s"
            else:
                why = str(exc) or type(exc).__name__
            self._fail(chunk, f"spill failed: {why}")

    def _fail(self, reqs: Sequence[Queued], error: str) -> None:
        for r in reqs:
            self._finish(r, None, error, "lambda")
