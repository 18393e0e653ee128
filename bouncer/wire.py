"""JSON as the frontend, the agents and clients exchange it: numpy arrays written as they are.

One encoder for every hop, so arrays never take a ``tolist`` detour on the
request path; what orjson cannot write natively (a non-contiguous or float16
array, a numpy scalar it does not know) falls back to ``tolist``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson


def _tolist(obj: Any) -> Any:
    if isinstance(obj, np.ndarray | np.generic):
        return obj.tolist()
    raise TypeError(f"cannot serialise {type(obj).__name__}")


def dump_json(body: Any) -> bytes:
    """``body`` as compact JSON bytes."""
    return orjson.dumps(body, default=_tolist, option=orjson.OPT_SERIALIZE_NUMPY)
