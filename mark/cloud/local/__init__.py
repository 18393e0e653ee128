"""The local world: AWS emulated on one machine (here: Lambda run by real awslambdaric runtimes)."""

from mark.cloud.local.lambda_runtime import (
    FunctionError,
    LambdaUsage,
    LocalLambda,
    PayloadTooLarge,
    RuntimeExited,
    SpillError,
    SpillRejected,
    SpillThrottled,
    SpillTimeout,
)

__all__ = [
    "FunctionError",
    "LambdaUsage",
    "LocalLambda",
    "PayloadTooLarge",
    "RuntimeExited",
    "SpillError",
    "SpillRejected",
    "SpillThrottled",
    "SpillTimeout",
]
