"""A strict reader of the Prometheus text format, for the tests of ``/metrics``."""

from __future__ import annotations

import re

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = rf'{_NAME[:-1]}*="(?:[^"\\\n]|\\.)*"'
_SAMPLE = re.compile(
    rf"^(?P<name>{_NAME})(?:\{{(?P<labels>{_LABEL}(?:,{_LABEL})*)?\}})?"
    r" (?P<value>[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|NaN|[-+]?Inf))$"
)
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

Series = tuple[str, frozenset[tuple[str, str]]]


def parse_exposition(text: str) -> dict[Series, float]:
    """The Prometheus text format, strictly enough to catch what a scrape would reject:
    each line a comment or ``name{labels} value``; no series twice; no label twice."""
    out: dict[Series, float] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m is not None, f"line {n} does not parse: {line!r}"
        pairs = _PAIR.findall(m["labels"] or "")
        names = [k for k, _ in pairs]
        assert len(names) == len(set(names)), f"line {n} repeats a label: {line!r}"
        key = (m["name"], frozenset(pairs))
        assert key not in out, f"line {n} repeats a series: {line!r}"
        out[key] = float(m["value"])
    assert text.endswith("\n") or not text
    return out


def value(series: dict[Series, float], name: str, **labels: str) -> float:
    """The sum over the series of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in series.items() if n == name and want <= ls)
