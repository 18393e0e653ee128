"""A handler module whose import never finishes in time: stands in for a stuck init."""

from __future__ import annotations

import time
from typing import Any

time.sleep(30)


def handler(event: Any, context: Any) -> dict[str, Any]:
    return {"outputs": []}
