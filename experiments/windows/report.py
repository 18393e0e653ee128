"""The tables of `results.md`, from the runs `run.py` left in `results/`.

Every figure is over the windows that have a result: mean ± standard deviation
(worst), and each row says how many windows it rests on. An ablation compares, window
by window, mark with one rule switched against mark as shipped (the headline's mark
run on the same arrivals). The rule *loses* on a window where the run without it
costs less and still keeps SL_min; it is kept only if its mean saving is larger than
the spread (standard deviation) of the per-window change and it loses on fewer than
a third of the windows (issue #48's rule).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

Doc = dict[str, Any]
SL_MIN = 0.98  # every paper model's SL_min (§5.1)
HEAD_POLICIES = (
    "mark",
    "mark-spot",
    "sagemaker",
    "sagemaker-equal-slo",
    "ec2-target-tracking",
    "ec2-target-tracking-equal-slo",
)


def head(root: Path, model: str, base: str = "mark") -> dict[str, Doc]:
    """The ``base`` (``mark``) and `baselines` sets' runs of a model, joined window by
    window."""
    out = load(root / base / model)
    for key, doc in load(root / "baselines" / model).items():
        if key in out:
            out[key]["by"].update(doc["by"])
        else:
            out[key] = doc
    return out


def paired(root: Path, model: str, run_set: str, policy: str) -> list[tuple[Doc, Doc]]:
    """(the shipped run, the run set's) of ``policy``, window by window, where both ran: the
    shipped run of the code the set ran beside (``RunSet.base``)."""
    from run import SETS

    bases = {rs.name: rs.base for sets in SETS.values() for rs in sets}
    base = head(root, model, bases.get(run_set, "mark"))
    runs = load(root / run_set / model)
    return [
        (base[k]["by"][policy], runs[k]["by"][policy])
        for k in runs
        if k in base and policy in base[k]["by"] and policy in runs[k]["by"]
    ]


def load(folder: Path) -> dict[str, Doc]:
    """Window key → that run's results by policy (with the window and code)."""
    out: dict[str, Doc] = {}
    for path in sorted(folder.glob("*.json")):
        doc = json.loads(path.read_text())
        out[path.stem] = {
            "by": {r["policy"]: r for r in doc["results"]},
            "code": doc.get("code", "?"),
            "bound_code": doc.get("bound_code", "before bound_code"),
        }
    return out


def stats(values: Iterable[float], worst: str = "max", fmt: str = "{:.2f}") -> str:
    xs = list(values)
    if not xs:
        return "–"
    mean = statistics.fmean(xs)
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    w = max(xs) if worst == "max" else min(xs)
    return f"{fmt.format(mean)} ± {fmt.replace('+', '').format(sd)} ({fmt.format(w)})"


MIXED = " ‡"
"""Marks a cost / bound over bounds of more than one bound code (``rebound.py`` unifies)."""


def span(keys: Iterable[str]) -> str:
    """How many runs, over how many windows and seeds (keys ``d<day>h<hour>s<seed>``)."""
    ks = list(keys)
    parts = [k.rpartition("s") for k in ks]
    windows = {w if s else seed for w, s, seed in parts}
    seeds = {seed if s else "" for _, s, seed in parts}
    return f"{len(ks)} ({len(windows)} × {len(seeds)})"


def headline(root: Path, models: list[str]) -> list[str]:
    lines = [
        "| model | policy | runs (windows × seeds) | cost / bound | within RT_max (%) | "
        "$ per window | over-provisioning | spot interruptions |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in models:
        runs = head(root, m)
        for p in HEAD_POLICIES:
            keys = [k for k, d in runs.items() if p in d["by"]]
            rs = [runs[k]["by"][p] for k in keys]
            if not rs:
                continue
            over = [r.get("over_provision") for r in rs]
            over_s = stats([x for x in over if x is not None], "min") if any(over) else ""
            unmet = sum(1 for r in rs if not r.get("equal_slo_met", True))
            if unmet:
                over_s += f"; none met SL_min on {unmet}"
            intr = (
                stats((r.get("interruptions", 0) for r in rs), fmt="{:.1f}")
                if p == "mark-spot"
                else ""
            )
            lines.append(
                f"| {m} | {p} | {span(keys)} | {stats(r['cost_over_bound'] for r in rs)}"
                f"{MIXED if len({runs[k]['bound_code'] for k in keys}) > 1 else ''} | "
                f"{stats((100 * r['within_slo'] for r in rs), 'min')} | "
                f"{stats(r['cost_total'] for r in rs)} | {over_s} | {intr} |"
            )
    return lines


def ratios(root: Path, models: list[str]) -> list[str]:
    pairs = [
        ("sagemaker", "mark"),
        ("sagemaker-equal-slo", "mark"),
        ("ec2-target-tracking-equal-slo", "mark"),
        ("sagemaker-equal-slo", "mark-spot"),
    ]
    lines = [
        "| model | runs (windows × seeds) | " + " | ".join(f"{a} / {b}" for a, b in pairs) + " |",
        "|---|---|" + "---|" * len(pairs),
    ]
    for m in models:
        both = {k: d["by"] for k, d in head(root, m).items()}
        keys = [k for k, r in both.items() if all(p in r for p in HEAD_POLICIES)]
        runs = [both[k] for k in keys]
        if not runs:
            continue
        cells = [
            stats((r[a]["cost_total"] / r[b]["cost_total"] for r in runs), "min") for a, b in pairs
        ]
        lines.append(f"| {m} | {span(keys)} | " + " | ".join(cells) + " |")
    return lines


def stressed(root: Path, models: list[str]) -> list[str]:
    lines = [
        "| model | windows | interruptions | cost / bound (Advisor) | cost / bound (stressed) | "
        "within RT_max, stressed (%) |",
        "|---|---|---|---|---|---|",
    ]
    for m in models:
        pairs = paired(root, m, "spot-stressed", "mark-spot")
        if not pairs:
            continue
        a = [x for x, _ in pairs]
        s = [y for _, y in pairs]
        lines.append(
            f"| {m} | {len(pairs)} | {stats((r['interruptions'] for r in s), fmt='{:.1f}')}"
            f" | {stats(r['cost_over_bound'] for r in a)} | "
            f"{stats(r['cost_over_bound'] for r in s)} | "
            f"{stats((100 * r['within_slo'] for r in s), 'min')} |"
        )
    return lines


OPT_IN = ("declines-on", "no-spill-batching")
"""Sets whose rule a user turns on, not a default of the planner's: declines
(``slo.decline_share``) and batched spill (the spill function's profile entry). Their rows
say what the rule does; no verdict removes them."""


def verdict(changes: list[float], loses: int, breaks: int = 0) -> str:
    """Issue #48's rule on the windows where the rule acts: kept if its mean saving
    exceeds the spread (standard deviation) of the per-window change and it loses on
    fewer than a third of them; *inert* where it changed nothing on any window. A rule
    without which SL_min breaks on a window where it kept it (``breaks``) stays whatever
    it costs: a saving that breaks the SLO is not one a user may take."""
    if all(abs(c) < 1e-9 for c in changes):
        return "inert"
    if breaks:
        return f"keep: SL_min broken without it on {breaks}"
    mean = statistics.fmean(changes)
    sd = statistics.stdev(changes) if len(changes) > 1 else 0.0
    return "keep" if mean > sd and loses < len(changes) / 3 else "goes"


def breaks_slo(on: Doc, off: Doc) -> bool:
    """Whether the run without the rule misses SL_min where the run with it kept it."""
    return bool(off["within_slo"] < SL_MIN <= on["within_slo"])


def ablation(
    root: Path,
    models: list[str],
    sets: list[tuple[str, str]],
    expected: int = 0,
    policy: str = "mark",
) -> list[str]:
    """One row per rule and model, and one over the windows of every model where the rule
    acts (a rule inert on a model, e.g. one that needs spill to answer in time, is judged
    where it can act); ``expected``: the pairs a complete sweep gives, below which the
    overall verdict is marked provisional (not acted on)."""
    lines = [
        "| rule | model | windows | cost change without it (%) | loses on | "
        "within RT_max without it (%) | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, rule in sets:
        acting: list[tuple[float, bool, bool]] = []
        total = 0
        for m in models:
            pairs: list[tuple[float, bool, bool]] = []
            lows = []
            for on, off in paired(root, m, name, policy):
                change = 100 * (off["cost_total"] / on["cost_total"] - 1)
                lost = change < 0 and off["within_slo"] >= SL_MIN
                pairs.append((change, lost, breaks_slo(on, off)))
                lows.append(100 * off["within_slo"])
            if not pairs:
                continue
            total += len(pairs)
            changes = [c for c, _, _ in pairs]
            loses = sum(1 for _, lost, _ in pairs if lost)
            broken = sum(1 for *_, b in pairs if b)
            v = "(opt-in)" if name in OPT_IN else verdict(changes, loses, broken)
            if v != "inert":
                acting += pairs
            lines.append(
                f"| {rule} | {m} | {len(pairs)} | {stats(changes, 'min', '{:+.1f}')} | "
                f"{loses}/{len(pairs)} | {stats(lows, 'min')} | {v} |"
            )
        if not total or name in OPT_IN:
            continue
        changes = [c for c, _, _ in acting]
        loses = sum(1 for _, lost, _ in acting if lost)
        broken = sum(1 for *_, b in acting if b)
        v = verdict(changes, loses, broken) if acting else "inert: goes"
        if total < expected:
            v = f"so far {v} ({total} of {expected})"
        cells = (
            f"{len(acting)} | {stats(changes, 'min', '{:+.1f}')} | {loses}/{len(acting)}"
            if acting
            else "0 | – | –"
        )
        lines.append(f"| {rule} | where it acts | {cells} |  | **{v}** |")
    return lines


def candidates(root: Path, models: list[str], sets: list[tuple[str, str]]) -> list[str]:
    """A rule not yet in mark's defaults against mark as shipped, window by window on the
    same arrivals, on each policy the set ran: adopted only where it saves more than the
    spread of its change, costs more on fewer than a third of the windows, and breaks
    SL_min on none where mark kept it (the ablation's rule, the other way round)."""
    lines = [
        "| candidate | model | policy | windows | cost change with it (%) | costs more on | "
        "within RT_max with it (%) | below SL_min | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, label in sets:
        for m in models:
            for policy in ("mark", "mark-spot"):
                pairs = paired(root, m, name, policy)
                if not pairs:
                    continue
                changes = [100 * (b["cost_total"] / a["cost_total"] - 1) for a, b in pairs]
                more = sum(1 for c in changes if c > 0)
                broken = sum(1 for a, b in pairs if breaks_slo(a, b))
                # Its verdict is the ablation's on the change without it: kept there is
                # adopted here.
                v = verdict([-c for c in changes], more, broken)
                v = {"keep": "adopt", "goes": "no"}.get(v, "no" if broken else v)
                lows = (100 * b["within_slo"] for _, b in pairs)
                lines.append(
                    f"| {label} | {m} | {policy} | {len(pairs)} | "
                    f"{stats(changes, 'max', '{:+.1f}')} | {more}/{len(pairs)} | "
                    f"{stats(lows, 'min')} | {broken} | {v} |"
                )
    return lines


def declines(root: Path, models: list[str]) -> list[str]:
    lines = [
        "| model | windows | cost saved by declines (%) | requests declined (%) | "
        "within RT_max with declines (%) |",
        "|---|---|---|---|---|",
    ]
    for m in models:
        both = paired(root, m, "declines-on", "mark")
        if not both:
            continue
        off = [x for x, _ in both]
        on = [y for _, y in both]
        saved = [
            100 * (1 - a["cost_total"] / b["cost_total"]) for a, b in zip(on, off, strict=True)
        ]
        share = [100 * a["declined"] / a["requests"] for a in on]
        lines.append(
            f"| {m} | {len(both)} | {stats(saved, 'min', '{:+.1f}')} | "
            f"{stats(share, fmt='{:.2f}')} | {stats((100 * a['within_slo'] for a in on), 'min')} |"
        )
    return lines


def variants(root: Path, models: list[str], sets: list[tuple[str, str]]) -> list[str]:
    """mark with variants under each floor against mark with the model alone, window by
    window on the same arrivals: the cost saved and the accuracy delivered."""
    lines = [
        "| model | floor | windows | cost saved (%) | accuracy delivered (top-1) | "
        "within RT_max (%) | cost / single-variant bound |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in models:
        for name, label in sets:
            pairs = paired(root, m, name, "mark")
            if not pairs:
                continue
            saved = [100 * (1 - b["cost_total"] / a["cost_total"]) for a, b in pairs]
            acc = [b["accuracy_delivered"] for _, b in pairs if b.get("accuracy_delivered")]
            ratio = [b["cost_over_bound"] for _, b in pairs if b.get("cost_over_bound")]
            lines.append(
                f"| {m} | {label} | {len(pairs)} | {stats(saved, 'min', '{:+.1f}')} | "
                f"{stats(acc, 'min', '{:.4f}')} | "
                f"{stats((100 * b['within_slo'] for _, b in pairs), 'min')} | {stats(ratio)} |"
            )
    return lines


def write_report(here: Path, models: list[str]) -> str:
    from run import DAYS, ONE, SETS, START_HOURS

    per_model = len(DAYS) * len(START_HOURS) * len(ONE)  # the pairs of one model's sweep

    root = here / "results"
    docs = [d for f in root.glob("*/*") if f.is_dir() for d in load(f).values()]
    codes = sorted({d["code"] for d in docs})
    bound_codes = sorted({d["bound_code"] for d in docs if d["bound_code"] is not None})
    abl = [(rs.name, rs.rule) for rs in SETS["ablation"] if rs.name != "declines-on"]
    parts = [
        "# Results",
        "",
        "Mean ± standard deviation (worst) over the windows each row rests on. "
        f"Code: {', '.join(codes) or 'none yet'}. Bound code: {', '.join(bound_codes) or '–'}"
        + (
            " (**mixed: cost / bound compares bounds of different code; run rebound.py**)."
            if len(bound_codes) > 1
            else "."
        ),
        "",
        "### mark and its baselines (declines off)",
        "",
        *(top := headline(root, models)),
        *(
            ["", f"{MIXED.strip()} Its runs' bounds come from two bound codes (`rebound.py`)."]
            if any(MIXED in line for line in top)
            else []
        ),
        "",
        "### Cost ratios, window by window",
        "",
        *ratios(root, models),
        "",
        "### mark-spot when spot turns bad",
        "",
        *stressed(root, models),
        "",
        "### What declines save, and what they refuse",
        "",
        *declines(root, models),
        "",
        "### Ablation: each rule switched off alone",
        "",
        *ablation(root, models, abl, per_model * len(models)),
        "",
        "### The persisting floor and the calendar, both off, on mark and on mark-spot",
        "",
        "The first round judged each rule on mark alone. Both off together, window by "
        "window on the same arrivals (code e7767be, which had removed them), mark first, "
        "then mark-spot:",
        "",
        *ablation(root, models, [(rs.name, rs.rule) for rs in SETS["together"]]),
        "",
        *ablation(
            root,
            models,
            [(rs.name, rs.rule + " (mark-spot)") for rs in SETS["together"]],
            policy="mark-spot",
        ),
        "",
        "### Candidates: rules tried against mark as shipped",
        "",
        *candidates(root, models, [(rs.name, rs.rule) for rs in SETS["candidates"]]),
        "",
        "### Rules off alone on mark-spot",
        "",
        *ablation(
            root,
            models,
            [(rs.name, rs.rule) for rs in SETS["spot-ablation"]]
            + [
                ("no-spill-batching", "batched spill (mark-spot)"),
                ("no-rise-by-misses", "rise carried as the misses show (mark-spot)"),
            ],
            policy="mark-spot",
        ),
        "",
        "### Model variants under an accuracy floor (Inception-v3 with ResNet-50 and ResNet-18)",
        "",
        "mark alone serves Inception-v3 (top-1 0.7729); with variants it chooses per batch "
        "among Inception-v3, ResNet-50 (0.7613) and ResNet-18 (0.6976) under the floor. The "
        "bound is the single-variant one: it does not bound a run with variants.",
        "",
        *variants(
            root,
            models,
            [(rs.name, rs.rule.removeprefix("variants at floor ")) for rs in SETS["variants"]],
        ),
        "",
        "### The warm-up: mark after 1 h and 6 h against the default 3 h",
        "",
        "A *keep* here says the 3 h warm-up changes the measured cost by more than its "
        "spread; the figures, not the verdict, choose the default. A warm-up of another "
        "length draws other arrivals in the window, so these pairs differ in their "
        "arrivals too, and they solve no bound: they compare costs.",
        "",
        *ablation(
            root, models, [(rs.name, rs.rule) for rs in SETS["warmup"]], per_model * len(models)
        ),
        "",
    ]
    text = "\n".join(parts)
    (here / "results.md").write_text(text)
    readme = here / "README.md"
    if readme.exists():
        readme.write_text(into_readme(readme.read_text(), summary(text)))
    return text


README_SECTIONS = (
    "### mark and its baselines",
    "### Cost ratios",
    "### Model variants",
)
"""The sections the README shows; every table is in results.md."""


def summary(text: str) -> str:
    """The README's part of the report: its header and ``README_SECTIONS``, then where the
    rest is."""
    head, *sections = text.split("\n### ")
    kept = [s for s in sections if any(f"### {s}".startswith(k) for k in README_SECTIONS)]
    rest = (
        "The ablation of each rule (on `mark`, and the floor and the calendar on "
        "`mark-spot`), batched spill, declines, stressed spot and the warm-up are in "
        "[`results.md`](results.md)."
    )
    return "\n### ".join([head.rstrip(), *(k.rstrip() + "\n" for k in kept)]) + "\n" + rest


BEGIN, END = "<!-- results: written by report.py -->", "<!-- /results -->"


def into_readme(readme: str, results: str) -> str:
    """``readme`` with the text between its results markers replaced by ``results`` (its
    title dropped: the README has its own heading)."""
    if BEGIN not in readme or END not in readme:
        return readme
    body = results.split("\n", 2)[2] if results.startswith("# ") else results
    head, rest = readme.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{body.strip()}\n{END}{rest.split(END, 1)[1]}"
