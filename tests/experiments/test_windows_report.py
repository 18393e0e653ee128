"""``experiments/windows/report.py``: window-by-window pairing and the ablation's verdict."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments" / "windows"))
from report import (  # type: ignore[import-not-found]
    BEGIN,
    END,
    ablation,
    candidates,
    declines,
    headline,
    into_readme,
    paired,
    span,
    summary,
    write_report,
)


def _write(root: Path, run_set: str, key: str, results: list[dict[str, object]]) -> None:
    path = root / run_set / "m" / f"{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"results": results, "code": "abc"}))


def _mark(cost: float, within: float = 0.99, declined: int = 0) -> dict[str, object]:
    return {
        "policy": "mark",
        "cost_total": cost,
        "cost_over_bound": cost / 10,
        "within_slo": within,
        "requests": 1000,
        "declined": declined,
    }


def test_a_rule_that_saves_more_than_its_spread_is_kept(tmp_path: Path) -> None:
    for k, (on, off) in enumerate([(10, 12), (10, 11.5), (10, 12.5), (10, 11.8)]):
        _write(tmp_path, "mark", f"w{k}", [_mark(on)])
        _write(tmp_path, "no-rule", f"w{k}", [_mark(off)])
    rows = ablation(tmp_path, ["m"], [("no-rule", "the rule")])
    assert rows[-1].startswith("| the rule | where it acts | 4 |")
    assert rows[-1].endswith("| **keep** |") and rows[-2].endswith("| keep |")


def test_a_rule_that_loses_on_a_third_of_the_windows_goes(tmp_path: Path) -> None:
    # Off is cheaper on 2 of 5 windows (and meets SL_min there): it loses on 2/5.
    pairs = [(10, 14), (10, 14), (10, 14), (10, 9.5), (10, 9.0)]
    for k, (on, off) in enumerate(pairs):
        _write(tmp_path, "mark", f"w{k}", [_mark(on)])
        _write(tmp_path, "no-rule", f"w{k}", [_mark(off)])
    rows = ablation(tmp_path, ["m"], [("no-rule", "the rule")])
    assert "| 2/5 |" in rows[-1] and rows[-1].endswith("| **goes** |")


def test_a_cheaper_run_that_misses_sl_min_is_not_a_loss_for_the_rule(tmp_path: Path) -> None:
    for k in range(3):
        _write(tmp_path, "mark", f"w{k}", [_mark(10)])
        _write(tmp_path, "no-rule", f"w{k}", [_mark(9, within=0.95)])
    rows = ablation(tmp_path, ["m"], [("no-rule", "the rule")])
    assert "| 0/3 |" in rows[-1]
    # Cheaper without it, but below SL_min where it kept it: a saving no user may take.
    assert rows[-1].endswith("| **keep: SL_min broken without it on 3** |")


def test_one_window_below_sl_min_without_the_rule_keeps_it_whatever_the_rest_save(
    tmp_path: Path,
) -> None:
    for k, within in enumerate([0.99, 0.99, 0.99, 0.97]):
        _write(tmp_path, "mark", f"w{k}", [_mark(10)])
        _write(tmp_path, "no-rule", f"w{k}", [_mark(6, within=within)])
    rows = ablation(tmp_path, ["m"], [("no-rule", "the rule")])
    assert "| 3/4 |" in rows[-1]  # it loses on three: cheaper without it and in SLO
    assert rows[-1].endswith("| **keep: SL_min broken without it on 1** |")
    # Where mark itself missed SL_min, the run without it breaks nothing.
    _write(tmp_path, "mark", "w3", [_mark(10, within=0.975)])
    assert ablation(tmp_path, ["m"], [("no-rule", "the rule")])[-1].endswith("| **goes** |")


def test_a_candidate_is_adopted_by_the_ablations_rule_the_other_way_round(
    tmp_path: Path,
) -> None:
    for k, (on, cand) in enumerate([(10, 8), (10, 8.5), (10, 7.5), (10, 8.2)]):
        _write(tmp_path, "mark", f"w{k}", [_mark(on)])
        _write(tmp_path, "try", f"w{k}", [_mark(cand)])
    row = candidates(tmp_path, ["m"], [("try", "the candidate")])[-1]
    assert row.startswith("| the candidate | m | mark | 4 | -19.5 ± ")
    assert row.endswith("| 0/4 | 99.00 ± 0.00 (99.00) | 0 | adopt |")
    _write(tmp_path, "try", "w0", [_mark(8, within=0.97)])  # cheaper, but breaks SL_min
    assert candidates(tmp_path, ["m"], [("try", "the candidate")])[-1].endswith("| 1 | no |")


def test_a_rule_inert_on_one_model_is_judged_where_it_acts(tmp_path: Path) -> None:
    for k in range(3):
        for model, off in (("m", 12.0), ("n", 10.0)):
            path = tmp_path / "mark" / model / f"w{k}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"results": [_mark(10.0 + 0.1 * k)]}))
            path = tmp_path / "no-rule" / model / f"w{k}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(
                json.dumps({"results": [_mark(off + 0.1 * k if model == "m" else 10.0 + 0.1 * k)]})
            )
    rows = ablation(tmp_path, ["m", "n"], [("no-rule", "the rule")], expected=8)
    assert rows[-2].endswith("| inert |")  # model n: nothing changed on any window
    assert rows[-1].startswith("| the rule | where it acts | 3 |")
    assert rows[-1].endswith("| **so far keep (6 of 8)** |")


def test_the_declines_row_says_what_they_save_and_refuse(tmp_path: Path) -> None:
    _write(tmp_path, "mark", "w0", [_mark(12)])
    # It ran beside the code with the persisting floor: paired with that code's mark.
    _write(tmp_path, "mark-with-floor", "w0", [_mark(10)])
    _write(tmp_path, "declines-on", "w0", [_mark(9, declined=16)])
    row = declines(tmp_path, ["m"])[-1]
    assert "| +10.0 ± 0.0 (+10.0) |" in row and "| 1.60 ± 0.00 (1.60) |" in row
    assert headline(tmp_path, ["m"])[-1].startswith("| m | mark | 1 (1 × 1) | ")  # as it is


def test_the_readme_gets_the_tables_between_its_markers_and_keeps_the_rest() -> None:
    readme = f"# R\n\nsetup\n\n{BEGIN}\nold table\n{END}\n\n## After\n"
    out = into_readme(readme, "# Results\n\nnew table\n")
    assert out == f"# R\n\nsetup\n\n{BEGIN}\nnew table\n{END}\n\n## After\n"
    assert into_readme(out, "# Results\n\nnewer\n").count("newer") == 1
    assert into_readme("no markers", "x") == "no markers"


def test_an_ablation_is_judged_on_the_policy_asked_for(tmp_path: Path) -> None:
    for k, (spot_on, spot_off) in enumerate([(5.0, 6.0), (5.0, 6.5), (5.0, 5.8)]):
        spot = {**_mark(spot_on), "policy": "mark-spot"}
        spot_without = {**_mark(spot_off), "policy": "mark-spot"}
        _write(tmp_path, "mark", f"w{k}", [_mark(10.0), spot])
        _write(tmp_path, "no-rule", f"w{k}", [_mark(9.0), spot_without])
    on_demand = ablation(tmp_path, ["m"], [("no-rule", "r")])
    on_spot = ablation(tmp_path, ["m"], [("no-rule", "r")], policy="mark-spot")
    assert "| 3/3 |" in on_demand[-1] and on_demand[-1].endswith("| **goes** |")
    assert "| 0/3 |" in on_spot[-1] and on_spot[-1].endswith("| **keep** |")


def test_the_readme_shows_the_headline_ratios_and_variants_and_points_to_the_rest() -> None:
    full = "# Results\n\nheader\n" + "".join(
        f"\n### {title}\n\n| {title} |\n"
        for title in ("mark and its baselines", "Cost ratios", "Ablation: x", "Model variants")
    )
    short = summary(full)
    assert "| mark and its baselines |" in short and "| Model variants |" in short
    assert "| Cost ratios |" in short
    assert "| Ablation: x |" not in short and short.rstrip().endswith("[`results.md`](results.md).")


def test_a_headline_row_says_how_many_windows_and_seeds_it_rests_on(tmp_path: Path) -> None:
    for key in ("d10h00s0", "d10h08s0", "d10h00s1", "d10h08s1", "d11h00s2"):
        _write(tmp_path, "mark", key, [_mark(10)])
    assert span(["d10h00s0", "d10h08s0", "d10h00s1"]) == "3 (2 × 2)"
    (row,) = [line for line in headline(tmp_path, ["m"]) if line.startswith("| m |")]
    assert row.startswith("| m | mark | 5 (3 × 3) | 1.00 ± 0.00 (1.00) |")


def test_a_cost_over_bound_of_bounds_from_two_codes_is_marked(tmp_path: Path) -> None:
    for key, code in (("d10h00s0", "old"), ("d10h00s1", "new")):
        path = tmp_path / "mark" / "m" / f"{key}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"results": [_mark(10)], "bound_code": code}))
    (row,) = [line for line in headline(tmp_path, ["m"]) if line.startswith("| m |")]
    assert "| 1.00 ± 0.00 (1.00) ‡ |" in row
    _write(tmp_path, "mark", "d10h00s0", [_mark(10)])  # now both before bound_code
    path = tmp_path / "mark" / "m" / "d10h00s1.json"
    path.write_text(json.dumps({"results": [_mark(10)]}))
    (row,) = [line for line in headline(tmp_path, ["m"]) if line.startswith("| m |")]
    assert "‡" not in row


def test_runs_that_solved_no_bound_are_judged_on_cost_and_leave_the_header_alone(
    tmp_path: Path,
) -> None:
    root = tmp_path / "results"
    for k, (on, off) in enumerate([(10, 12), (10, 11.5), (10, 12.5)]):
        key = f"d10h{8 * k:02d}s0"
        path = root / "mark" / "m" / f"{key}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"results": [_mark(on)], "bound_code": "b1"}))
        unbounded = {**_mark(off), "cost_over_bound": None}
        path = root / "warmup-1h" / "m" / f"{key}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"results": [unbounded], "bound_code": None}))
    text = write_report(tmp_path, ["m"])
    assert "Bound code: b1." in text and "mixed" not in text
    warmup = text[text.index("### The warm-up") :]
    assert "| 3 h warm-up (against 1 h) | m | 3 |" in warmup


def test_a_set_that_ran_beside_older_code_is_paired_with_that_codes_runs(
    tmp_path: Path,
) -> None:
    """``no-persisting-floor`` ran while the floor was in the code: its pairs are the runs
    of that code (``mark-with-floor``), not ``mark`` as it is now, else the change
    measured is every rule that came since."""
    from run import SETS, WITH_FLOOR  # type: ignore[import-not-found]

    (no_floor,) = [rs for rs in SETS["ablation"] if rs.name == "no-persisting-floor"]
    assert no_floor.base == WITH_FLOOR and no_floor.gone and no_floor.bound is True
    for k in range(3):
        _write(tmp_path, "mark", f"w{k}", [_mark(10.0)])
        _write(tmp_path, WITH_FLOOR, f"w{k}", [_mark(20.0 + k)])
        _write(tmp_path, no_floor.name, f"w{k}", [_mark(20.0 + k)])
    pairs = paired(tmp_path, "m", no_floor.name, "mark")
    assert [(on["cost_total"], off["cost_total"]) for on, off in pairs] == [
        (20.0, 20.0),
        (21.0, 21.0),
        (22.0, 22.0),
    ]
    rows = ablation(tmp_path, ["m"], [(no_floor.name, no_floor.rule)])
    assert rows[2].endswith("| inert |")
