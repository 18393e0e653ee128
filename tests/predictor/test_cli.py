"""`mark predictor` through typer's runner: output formats and one-line user errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mark.cli.predictor_cmd import app
from predictor.mmpp import mmpp_history
from predictor.registry import load

runner = CliRunner()
MMPP = ["--trace", "mmpp", "--mmpp-days", "0.2", "--train-days", "0.1", "--horizon", "20"]


def test_evaluate_json_on_mmpp() -> None:
    res = runner.invoke(
        app, ["evaluate", *MMPP, "--models", "last,seasonal,paper", "--format", "json"]
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert [s["model"] for s in data["scores"]] == ["last", "seasonal", "paper"]
    assert data["train_minutes"] == 144 and data["horizon"] == 20
    assert all(0 <= s["under_rate"] <= 100 for s in data["scores"])


def test_evaluate_table_names_every_model() -> None:
    res = runner.invoke(app, ["evaluate", *MMPP, "--models", "last,paper"])
    assert res.exit_code == 0, res.output
    assert "MAPE" in res.stdout and "paper" in res.stdout and "last" in res.stdout


def test_train_writes_a_loadable_model(tmp_path: Path) -> None:
    out = tmp_path / "m.npz"
    res = runner.invoke(app, ["train", *MMPP[:4], "--model", "paper", "--out", str(out)])
    assert res.exit_code == 0, res.output
    model = load(out)
    assert model.name == "paper"
    assert model.forecast(mmpp_history(0.05, seed=1), 3).shape == (3,)


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "p.png"
    res = runner.invoke(app, ["evaluate", *MMPP, "--models", "last", "--plot", str(png)])
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["evaluate", "--trace", "no/such/file.csv"], "trace file not found"),
        (["evaluate", *MMPP, "--models", "last,bogus"], "unknown model 'bogus'"),
        (["evaluate", *MMPP, "--format", "xml"], "table' or 'json"),
        (["evaluate", "--trace", "mmpp", "--mmpp-days", "0.2", "--train-days", "5"], "only 0.20"),
        (["evaluate", *MMPP, "--models", "last", "--under-weight", "0"], "must be > 0"),
        (["train", "--trace", "mmpp", "--mmpp-days", "-1"], "must be > 0"),
    ],
)
def test_user_errors_end_in_a_message_and_exit_2(args: list[str], message: str) -> None:
    res = runner.invoke(app, args)
    assert res.exit_code == 2
    assert message in " ".join(res.output.split())
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)


def test_a_bad_trace_file_is_a_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "t.csv"
    bad.write_text("second,requests\n0,abc\n")
    res = runner.invoke(app, ["evaluate", "--trace", str(bad)])
    assert res.exit_code == 2
    assert len([line for line in res.output.splitlines() if line.strip()]) == 1
