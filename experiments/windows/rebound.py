"""Re-solve the bound of every windows result that other bound code solved.

A simulation does not depend on the bound, so when the bound's code changes
(``mark.sim.compare.BOUND_CODE``) the runs need not be made again: this re-solves each
result's bound on the very arrivals it ran on (its window, seed and warm-up), rewrites
``bound`` and ``cost_over_bound`` (and the bound at a run's own misses, where it missed
more than the SLO allows) and records the code that solved them as ``bound_code``.
``report.py`` says when the results it reads were bounded by more than one code.

The bound at a run's own misses (a run below SL_min) is one more solve per such run and no
table uses it, so it is re-solved only with ``--own-misses`` and otherwise dropped, never
left stale. A run written before results carried ``missed`` has that read back from
``within_slo`` (five digits: within a request or two on 200k).

    .venv/bin/python experiments/windows/rebound.py [--models M,...] [--sets S,...]
        [--own-misses]
    .venv/bin/python experiments/windows/rebound.py --prime [--models M,...]

``--prime`` solves nothing: it writes the bounds the results stored, where the current
code solved them, into the bound cache (``mark.sim.compare.cached_bound``), so a run made
again on a fresh machine (a rule removed, a set re-run) finds its window's bounds there.
A NASNet window's two bounds take minutes to solve; priming takes a second.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from mark.catalog import load_catalog
from mark.config.settings import load_settings
from mark.sim.bound import Bound
from mark.sim.compare import (
    BoundKey,
    bound_cache_path,
    bound_code,
    bound_key,
    bound_of_summary,
    bound_parts,
    solve_bound,
    store_bound,
)
from mark.sim.models import SimModel, paper_model
from mark.sim.policies import POLICIES
from mark.sim.run import SimConfig
from mark.sim.workloads import Workload, trace_workload
from mark.sim.world import DEFAULT_WARMUP_S

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import HOURS, MODELS, RESULTS, SETS


def warmup_of(set_name: str) -> float:
    """The warm-up a run set ran with (``--warmup-s`` among its arguments)."""
    for rs in (rs for sets in SETS.values() for rs in sets):
        if rs.name == set_name and "--warmup-s" in rs.args:
            return float(rs.args[rs.args.index("--warmup-s") + 1])
    return DEFAULT_WARMUP_S


def missed_of(row: dict[str, Any]) -> int:
    if "missed" in row:
        return int(row["missed"])
    return round((1.0 - float(row["within_slo"])) * int(row["requests"]))


def window_of(path: Path, doc: dict[str, Any]) -> tuple[Workload, SimModel, SimConfig, Any]:
    """The workload, model, configuration and arrivals a result ran on."""
    set_name, model_name = path.parent.parent.name, path.parent.name
    w = doc["window"]
    workload = trace_workload(
        "twitter",
        hours=float(w.get("hours", HOURS)),
        start_day=w["day"] + w["hour"] / 24,
        rate_scale=MODELS[model_name],
    )
    cfg = SimConfig(seed=int(w["seed"]), warmup_s=warmup_of(set_name))
    arrivals = workload.arrivals(int(workload.start - cfg.warmup_s), workload.end, cfg.seed)
    return workload, paper_model(model_name), cfg, arrivals


def prime(path: Path, code: str, cache_dir: Path) -> int:
    """Write the bounds ``path`` stored into the cache where ``code`` solved them and the
    cache lacks them; how many it wrote."""
    doc = json.loads(path.read_text())
    if doc.get("bound_code") != code:
        return 0
    workload, model, cfg, arrivals = window_of(path, doc)
    wrote = 0
    for stored in doc["bounds"]:
        key = bound_key(POLICIES[stored["policies"][0]], cfg)
        target = bound_cache_path(cache_dir, *bound_parts(key, workload, model, cfg, arrivals))
        if not target.exists():
            store_bound(target, bound_of_summary(stored))
            wrote += 1
    return wrote


def rebound(path: Path, code: str, cache_dir: Path, own_misses: bool = False) -> bool:
    """Re-solve one result's bounds unless ``code`` solved them, or it solved none by
    choice (``--no-bound``: ``bound_code`` None); whether it did anything."""
    doc = json.loads(path.read_text())
    if doc.get("bound_code", "") in (code, None):
        return False
    workload, model, cfg, arrivals = window_of(path, doc)
    catalog = load_catalog()
    solved: dict[tuple[BoundKey, int | None], Bound] = {}

    def bound(key: BoundKey, misses: int | None = None) -> Bound:
        if (key, misses) not in solved:
            solved[key, misses] = solve_bound(
                key,
                workload=workload,
                model=model,
                cfg=cfg,
                arrivals=arrivals,
                catalog=catalog,
                misses=misses,
                cache_dir=cache_dir,
            )
        return solved[key, misses]

    names: dict[BoundKey, list[str]] = {}
    for row in doc["results"]:
        key = bound_key(POLICIES[row["policy"]], cfg)
        names.setdefault(key, []).append(row["policy"])
        b = bound(key)
        row["bound"] = round(b.value, 4)
        row["cost_over_bound"] = round(row["cost_total"] / b.value, 3) if b.value > 0 else None
        row.pop("bound_own_misses", None)
        row.pop("cost_over_bound_own_misses", None)
        missed = missed_of(row)
        if own_misses and missed > b.miss_budget:
            own = bound(key, missed)
            row["bound_own_misses"] = round(own.value, 4)
            row["cost_over_bound_own_misses"] = round(row["cost_total"] / own.value, 3)
    doc["bounds"] = [{"policies": n, **bound(key).summary()} for key, n in names.items()]
    doc["bound_code"] = code
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)  # a killed pass leaves no half-written result
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--sets", default="", help="run-set directories (default: all)")
    ap.add_argument("--own-misses", action="store_true", help="also the bound at own misses")
    ap.add_argument("--prime", action="store_true", help="fill the bound cache; solve nothing")
    args = ap.parse_args()
    models = set(args.models.split(","))
    sets = set(filter(None, args.sets.split(",")))
    code = bound_code()
    cache_dir = load_settings(None, {}).data_dir / "sim-cache"
    paths = sorted(
        p
        for p in RESULTS.glob("*/*/*.json")
        if p.parent.name in models and (not sets or p.parent.parent.name in sets)
    )
    if args.prime:
        wrote = sum(prime(p, code, cache_dir) for p in paths)
        print(f"{wrote} bounds of {len(paths)} results written to {cache_dir / 'bounds'}")
        return
    started = time.perf_counter()
    for k, p in enumerate(paths, 1):
        t = time.perf_counter()
        did = rebound(p, code, cache_dir, args.own_misses)
        spent = time.perf_counter() - started
        print(
            f"[{k}/{len(paths)}] {p.relative_to(RESULTS)} "
            f"{f'{time.perf_counter() - t:.0f} s' if did else 'current'} "
            f"(elapsed {spent / 60:.0f} min)",
            flush=True,
        )


if __name__ == "__main__":
    main()
