"""Which profile the planner rates each instance type from.

A type's T_b comes from, in order: a profile **measured** on that type (an
agent timed the model on its own device after loading it), a profile
**shipped** with the model spec (the file ``mark profile`` writes, or the
paper's published profiles), the local world's **emulated** rule. A type with
none of these is not rated, so it is not planned: mark never buys an offering
on a guessed speed. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

PRECEDENCE = ("measured", "shipped", "emulated")

T = TypeVar("T")


def choose_profiles(
    types: Sequence[str], available: Mapping[tuple[str, str], T]
) -> dict[str, tuple[T, str]]:
    """For each type, the best profile ``available[(type, source)]`` and its source;
    types with none are left out."""
    out: dict[str, tuple[T, str]] = {}
    for t in types:
        for source in PRECEDENCE:
            if (t, source) in available:
                out[t] = (available[(t, source)], source)
                break
    return out


def unrated(types: Sequence[str], chosen: Mapping[str, object]) -> list[str]:
    """The types no profile rates (not planned)."""
    return [t for t in types if t not in chosen]
