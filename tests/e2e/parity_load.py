"""The parity test's client, in a process of its own so it does not share the daemon's loop.

``python -m tests.e2e.parity_load URL PROFILE SEED OUT`` sends the seeded
Poisson arrivals of ``PROFILE`` to the ``digits`` model and writes every
outcome (due and sent offsets, latency, status, where it was served) to OUT
as JSON.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys

from mark.demo.loadgen import run_load
from mark.demo.rate_profile import RateProfile


async def main(url: str, profile: str, seed: int) -> list[dict[str, object]]:
    result = await run_load(url, "digits", RateProfile.parse(profile), seed=seed, timeout_s=60)
    return [dataclasses.asdict(o) for o in result.outcomes]


if __name__ == "__main__":
    outcomes = asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
    with open(sys.argv[4], "w") as f:
        json.dump(outcomes, f)
