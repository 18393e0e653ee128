"""The request path: the REST endpoint clients call (``endpoint``, ``codec``,
``binary_tensors``, ``openapi``), the per-model dispatcher that batches to instances
and spills to Lambda (``dispatcher``), and the telemetry it feeds (``telemetry``)."""
