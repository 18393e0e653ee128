"""`mark deploy package` and `mark deploy template`: real archives, a real import, the real CLI."""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

from mark.deploy import package as pkg
from mark.deploy import template as tpl
from mark.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
MARK = [sys.executable, "-m", "mark.cli.main"]
PIP_WHEEL = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MARK, *args], capture_output=True, text=True, timeout=120, env=dict(os.environ)
    )


# -- the Lambda zip -------------------------------------------------------------------


def test_lambda_zip_holds_the_handler_package_and_names_torch_as_external(tmp_path: Path) -> None:
    built = pkg.build_lambda_zip(tmp_path)
    names = zipfile.ZipFile(built.path).namelist()
    assert names == sorted(names)
    assert {"lambda_handlers/__init__.py", "lambda_handlers/spill.py"} <= set(names)
    assert not [n for n in names if n.startswith(("mark/", "bouncer/")) or n.endswith(".pyc")]
    assert built.external == ("torch",)  # the handler's only third-party import


def test_lambda_zip_is_reproducible(tmp_path: Path) -> None:
    a = pkg.build_lambda_zip(tmp_path / "a").path.read_bytes()
    b = pkg.build_lambda_zip(tmp_path / "b").path.read_bytes()
    assert a == b


def test_the_unzipped_handler_imports_and_runs_a_batch_without_the_project(
    tmp_path: Path,
) -> None:
    """Unzip as Lambda does and import from there alone: mark, bouncer & co. are blocked, so
    an import the zip lacks fails here rather than in the first cold start on AWS."""
    built = pkg.build_lambda_zip(tmp_path / "out")
    task = tmp_path / "task"  # Lambda's /var/task
    zipfile.ZipFile(built.path).extractall(task)
    model = tmp_path / "linear.pt"
    with warnings.catch_warnings():  # torch 2.13 calls TorchScript deprecated; mark still uses it
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.script(torch.nn.Linear(2, 1, bias=False))  # type: ignore[no-untyped-call]
        torch.jit.save(scripted, str(model))  # type: ignore[no-untyped-call]
    script = textwrap.dedent(
        f"""
        import json, sys
        TASK = {str(task)!r}
        sys.path.insert(0, TASK)

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {{"mark", "bouncer", "provisioner", "predictor"}}:
                    raise ImportError("not in the Lambda zip: " + name)
                return None

        sys.meta_path.insert(0, Block())
        import lambda_handlers.spill as spill
        assert spill.__file__.startswith(TASK), spill.__file__
        event = {{"model": "m", "instances": [[1.0, 2.0], [3.0, 4.0]], "source": {str(model)!r}}}
        print(json.dumps(spill.handler(event, None)))
        """
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    reply = json.loads(out.stdout.strip().splitlines()[-1])
    assert reply["model"] == "m" and reply["cold_start"] is True
    assert len(reply["outputs"]) == 2 and all(len(row) == 1 for row in reply["outputs"])


# -- the agent bundle ---------------------------------------------------------------------


def test_agent_bundle_builds_a_wheel_that_ships_the_template(tmp_path: Path) -> None:
    """The bundle is what instances pip-install: it must build, and the built package must
    carry the template (package data) with the exact text of infra/mark.yaml."""
    bundle = pkg.build_agent_bundle(tmp_path / "out")
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
        assert all(n.startswith("mark-src/") for n in names)
        assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
        tar.extractall(tmp_path / "x", filter="data")
    src = tmp_path / "x" / "mark-src"
    assert (src / "constraints.txt").read_text() == (ROOT / "constraints.txt").read_text()
    assert not (src / "mark/deploy/data/mark.yaml").is_symlink()
    built = subprocess.run(
        [*PIP_WHEEL, "--disable-pip-version-check", "-w", str(tmp_path / "whl"), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "whl").glob("mark-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        shipped = zf.read("mark/deploy/data/mark.yaml").decode()
        assert "lambda_handlers/spill.py" in zf.namelist()
    assert shipped == (ROOT / "infra" / "mark.yaml").read_text()


def test_agent_bundle_is_reproducible(tmp_path: Path) -> None:
    a = pkg.build_agent_bundle(tmp_path / "a").read_bytes()
    b = pkg.build_agent_bundle(tmp_path / "b").read_bytes()
    assert a == b


# -- the template ---------------------------------------------------------------------------


def test_packaged_template_is_infra_mark_yaml() -> None:
    assert tpl.template_text() == (ROOT / "infra" / "mark.yaml").read_text()


def test_filling_keeps_comments_and_short_tags_and_inserts_missing_defaults() -> None:
    text = tpl.template_text()
    out = tpl.fill_yaml(text, {"ArtifactBucket": "my-art", "ApiPort": "9000", "SubnetIds": ""})
    params = tpl.parameters(tpl.load(out))
    assert params["ArtifactBucket"].default == "my-art"  # had no Default: inserted
    assert params["ApiPort"].default == "9000"
    assert params["SubnetIds"].default == ""
    assert "!GetAtt InterruptionQueue.Arn" in out and "# ---- the endpoint" in out
    diff = list(difflib.ndiff(text.splitlines(), out.splitlines()))
    added = [d[2:] for d in diff if d.startswith("+ ")]
    removed = [d[2:] for d in diff if d.startswith("- ")]
    assert added == ['    Default: "my-art"', '    Default: "9000"']
    assert removed == ["    Default: 8080"]


def test_values_that_look_like_other_yaml_types_stay_strings() -> None:
    out = tpl.fill_yaml(tpl.template_text(), {"ModelName": "010", "ClusterName": "no"})
    params = tpl.parameters(tpl.load(out))
    assert params["ModelName"].default == "010"  # not YAML 1.1's octal 8
    assert params["ClusterName"].default == "no"  # not false


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"Nope": "1"}, "unknown parameter Nope; valid: ArtifactBucket, AgentBundleKey"),
        ({"ApiPort": "80"}, "ApiPort=80: must be >= 1024"),
        ({"ApiPort": "eighty"}, "ApiPort='eighty': must be a number"),
        ({"ModelDtype": "float16"}, "allowed: float32, float64"),
        ({"ModelInputShape": "1,0"}, "ModelInputShape='1,0': must match"),
    ],
)
def test_bad_parameters_are_one_line_config_errors(params: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        tpl.render(tpl.template_text(), params)
    assert needle in str(err.value) and "\n" not in str(err.value)


# -- the CLI ---------------------------------------------------------------------------------


def test_cli_template_substitutes_params_in_yaml_and_json() -> None:
    out = run("deploy", "template", "--param", "ArtifactBucket=my-art", "-p", "RtMaxMs=250")
    assert out.returncode == 0, out.stderr
    params = tpl.parameters(tpl.load(out.stdout))
    assert (params["ArtifactBucket"].default, params["RtMaxMs"].default) == ("my-art", "250")
    assert params["ApiPort"].default == "8080"  # untouched
    js = run("deploy", "template", "-p", "ArtifactBucket=my-art", "--format", "json")
    assert js.returncode == 0, js.stderr
    data = json.loads(js.stdout)
    assert data["Parameters"]["ArtifactBucket"]["Default"] == "my-art"
    assert data["Outputs"]["EndpointUrl"]["Value"]["Fn::If"][0] == "HasCertificate"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("-p", "Colour=blue"), "error: unknown parameter Colour; valid: ArtifactBucket,"),
        (("-p", "ApiPort"), "error: --param 'ApiPort' is not KEY=VALUE"),
        (("-p", "SlMin=2"), "error: parameter SlMin=2: must be <= 1"),
    ],
)
def test_cli_template_rejects_bad_params_in_one_line_with_exit_2(
    args: tuple[str, ...], needle: str
) -> None:
    out = run("deploy", "template", *args)
    assert out.returncode == 2
    assert out.stdout == ""
    assert needle in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_cli_package_writes_both_artifacts_and_says_where(tmp_path: Path) -> None:
    out = run("deploy", "package", "--out", str(tmp_path / "dist"))
    assert out.returncode == 0, out.stderr
    for name in (pkg.LAMBDA_ZIP, pkg.AGENT_BUNDLE):
        assert (tmp_path / "dist" / name).stat().st_size > 0
        assert name in out.stdout
    assert "s3://$BUCKET/mark/spill-lambda.zip" in out.stdout
    assert "KiB" in out.stdout and "torch" in out.stdout
