"""The local world's Lambda: a Runtime API server of our own driving real awslambdaric runtimes.

Why not call the handler in-process? Because the spill path must behave as it
will on AWS: the handler runs in a separate process under the real Lambda
runtime interface client (``python -m awslambdaric lambda_handlers.spill.handler``),
which long-polls ``GET /2018-06-01/runtime/invocation/next`` and posts the
result or error back. So the event and reply go through JSON exactly as on AWS,
a cold start costs what it costs (a Python start and a torch import), and a
crashing or hanging handler is a dead or killed process, not an exception.

The pieces, by role:

- ``local_lambda``: ``LocalLambda``, the ``Serverless`` port, which wires the rest;
- ``pool``: the warm pool (most recently used first, cold starts up to
  ``max_concurrency``, then a FIFO queue that fails as ``SpillThrottled``);
- ``supervisor``: starts runtimes, watches them die, enforces ``init_timeout_s``
  and ``timeout_s``, and settles each invocation;
- ``process``: one runtime as an OS process (environment, process group, kill);
- ``runtime_api``: the Runtime API server, one socket per runtime;
- ``metering``: what AWS would charge (``mark.billing.lambda_charge``), ``LambdaUsage``;
- ``events``: the event and reply on the wire, and the 6 MB payload limit.

The errors are the spill family in ``mark.errors``, shared with the aws world's
adapter. Not emulated: the memory limit itself (CPU share is, roughly, through
the thread count), idle runtimes being reclaimed after some minutes, and the
10-second init limit (a torch import on a busy laptop can exceed it;
``init_timeout_s`` defaults to 60).
"""

from mark.cloud.local.lambda_.events import PAYLOAD_LIMIT
from mark.cloud.local.lambda_.local_lambda import LocalLambda
from mark.cloud.local.lambda_.metering import LambdaUsage

__all__ = ["PAYLOAD_LIMIT", "LambdaUsage", "LocalLambda"]
