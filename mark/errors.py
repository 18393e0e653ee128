"""Errors as types, so callers branch on the kind of failure, never on message text.

Adapters raise the cloud errors; the reconciler decides what each means (retry,
fall back to the next offering, forget the instance). `is_*` helpers read like
English at the call site, as Karpenter's do.
"""

from __future__ import annotations

from collections.abc import Sequence


class MarkError(Exception):
    """Base of every error mark raises on purpose; the CLI prints these in one line."""


class ConfigError(MarkError):
    """The configuration is invalid; the message names the field, the value and what is allowed."""


class UnknownOffering(MarkError):
    """An instance type or market that the catalog does not know."""


class StoreError(MarkError):
    """The state store cannot be reached or is not migrated."""


class CloudError(MarkError):
    """Base of errors raised by a cloud adapter (simulated, local or aws)."""


class InsufficientCapacity(CloudError):
    """The cloud has no capacity for this offering now; try another offering."""


class SpotInterrupted(CloudError):
    """A spot instance was (or is about to be) reclaimed."""


class Throttled(CloudError):
    """The API asked us to slow down; retry with back-off."""


class NotOwned(CloudError):
    """The instance exists but does not carry mark's ownership tags; never touch it."""


# ---- the spill function (Lambda): one family for the local runtime and AWS ----------------


class SpillError(CloudError):
    """The spill function did not return outputs; the message says why."""


class SpillRejected(SpillError):
    """The handler answered ``{"error": ...}``: the batch or model is wrong, not the system."""


class SpillFunctionError(SpillError):
    """The handler raised: Lambda's function error, with its type and (locally) its stack.

    ``kind`` is Lambda's ``X-Amz-Function-Error`` (e.g. ``"Unhandled"``) when the
    adapter read one off the wire; it then leads the message, as AWS reports it.
    On AWS this also covers a timeout or a dead runtime (``Sandbox.Timedout``,
    ``Runtime.ExitError``); the local runtime tells those apart as ``SpillTimeout``
    and ``RuntimeExited``.
    """

    def __init__(
        self,
        error_type: str,
        message: str,
        stack: Sequence[str] = (),
        *,
        kind: str | None = None,
    ) -> None:
        super().__init__(f"{kind}: {error_type}: {message}" if kind else f"{error_type}: {message}")
        self.kind = kind
        self.error_type = error_type
        self.stack = list(stack)


class RuntimeExited(SpillError):
    """The runtime process died (or failed its init) while holding the invocation."""


class SpillTimeout(SpillError):
    """The invocation ran past the function timeout; its runtime was killed, as on AWS."""


class SpillThrottled(SpillError, Throttled):
    """Lambda's concurrency limit: every runtime busy for longer than the queue allows
    (locally), or ``TooManyRequestsException`` after the adapter's retries (AWS)."""


class PayloadTooLarge(SpillError):
    """An event or reply over Lambda's 6 MB synchronous payload limit."""


def is_insufficient_capacity(err: BaseException) -> bool:
    return isinstance(err, InsufficientCapacity)


def is_throttled(err: BaseException) -> bool:
    return isinstance(err, Throttled)


def is_not_owned(err: BaseException) -> bool:
    return isinstance(err, NotOwned)


def is_spot_interrupted(err: BaseException) -> bool:
    return isinstance(err, SpotInterrupted)
