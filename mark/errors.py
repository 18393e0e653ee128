"""Errors as types, so callers branch on the kind of failure, never on message text.

Adapters raise the cloud errors; the reconciler decides what each means (retry,
fall back to the next offering, forget the instance). `is_*` helpers read like
English at the call site, as Karpenter's do.
"""

from __future__ import annotations


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


def is_insufficient_capacity(err: BaseException) -> bool:
    return isinstance(err, InsufficientCapacity)


def is_throttled(err: BaseException) -> bool:
    return isinstance(err, Throttled)


def is_not_owned(err: BaseException) -> bool:
    return isinstance(err, NotOwned)


def is_spot_interrupted(err: BaseException) -> bool:
    return isinstance(err, SpotInterrupted)
