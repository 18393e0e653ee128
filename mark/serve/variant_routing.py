"""Which variant a batch runs on, for the dispatcher (a part of ``Dispatcher``): the rule
``bouncer.variants.choose_variant`` on the instance's variants as its agent profiled them,
and the fallback its Bouncer may take (``fallback_for``)."""

from __future__ import annotations

from bouncer.latency import BatchLatency
from bouncer.variants import AccuracyLedger, Variant, choose_variant, fallback_for
from mark.serve.flight import Backend, Queued


class VariantRouting:
    """The dispatcher's variant choice (a part of ``Dispatcher``)."""

    variants: tuple[tuple[str, float], ...]
    primary: str | None
    accuracy_floor: float
    ledger: AccuracyLedger

    def _variant_for(
        self, batch: list[Queued], backend: Backend, now: float
    ) -> tuple[str | None, BatchLatency, str | None]:
        """The variant a batch runs on (``bouncer.variants.choose_variant``), its T_b on
        the instance, and the fallback the agent may run it on instead (``fallback_for``);
        (None, the model's T_b, None) for a model without variants."""
        if not self.variants:
            return None, backend.latency, None
        loaded = [
            Variant(name, acc, backend.latency if name == self.primary else backend.variants[name])
            for name, acc in self.variants
            if name == self.primary or name in backend.variants
        ]
        group = batch[0].group
        if group.pin is not None:  # obeyed even where not loaded: the agent then refuses it
            pinned = next((v.latency for v in loaded if v.name == group.pin), backend.latency)
            return group.pin, pinned, None
        deadlines = [r.deadline - backend.allowance_s for r in batch]
        chosen = choose_variant(
            now,
            backend.busy_until,
            deadlines,
            loaded,
            self.ledger,
            self.accuracy_floor,
            request_floor=group.floor,
        )
        fallback = fallback_for(
            now,
            chosen,
            loaded,
            self.ledger,
            self.accuracy_floor,
            len(batch),
            request_floor=group.floor,
        )
        return chosen.name, chosen.latency, None if fallback is None else fallback.name
