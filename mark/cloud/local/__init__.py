"""The local world: AWS emulated on one machine (here: Lambda run by real awslambdaric runtimes)."""

from mark.cloud.local.lambda_ import LambdaUsage, LocalLambda

__all__ = ["LambdaUsage", "LocalLambda"]
