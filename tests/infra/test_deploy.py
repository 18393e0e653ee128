"""`mark deploy package` and `mark deploy template`: real archives, a real import, the real CLI."""

from __future__ import annotations

import difflib
import json
import os
import re
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

from mark.deploy import image as img
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


# -- the spill function's image context ----------------------------------------------------


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> img.SpillImage:
    return img.build_spill_image(tmp_path_factory.mktemp("deploy"))


def _instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments out."""
    joined = re.sub(r"\\\n", " ", dockerfile)
    lines = [x.strip() for x in joined.splitlines() if x.strip() and not x.strip().startswith("#")]
    return [(x.split(None, 1)[0], x.split(None, 1)[1]) for x in lines]


def test_dockerfile_is_the_lambda_python_base_with_the_handler_as_cmd(
    image: img.SpillImage,
) -> None:
    steps = _instructions((image.context / "Dockerfile").read_text())
    assert steps[0] == ("FROM", "public.ecr.aws/lambda/python:3.11")
    assert steps[-1] == ("CMD", '["lambda_handlers.spill.handler"]')
    (copy,) = [args for op, args in steps if op == "COPY"]
    *sources, dest = copy.split()
    for name in sources:  # every file the build copies is in the context
        assert (image.context / name).is_file(), name
    assert sorted(sources) == sorted(
        p.name for p in image.context.iterdir() if p.name != "Dockerfile"
    )
    (run_,) = [args for op, args in steps if op == "RUN"]
    first, second = run_.split(" && ")[:2]
    assert f"-c {dest}constraints.txt" in first and f"-r {dest}requirements.txt" in first
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in first
    assert f'--no-deps --target "${{LAMBDA_TASK_ROOT}}" {dest}{image.wheel.name}' in second


def test_requirements_pin_exactly_what_the_handler_and_demo_import(
    image: img.SpillImage,
) -> None:
    """Every third-party import of the handler (and of the default model's module) is
    installed, at the very line constraints.txt pins, and torch is the CPU build of the
    version pyproject names."""
    pins = img.read_pins((ROOT / "constraints.txt").read_text())
    lines = (image.context / "requirements.txt").read_text().split()
    assert tuple(lines) == image.requirements
    assert all(pins[img.canonical(line.split("==")[0])] == line for line in lines)
    _, handler_imports = pkg.import_closure(["lambda_handlers"])
    _, demo_imports = pkg.import_closure(["mark.demo.model"])
    assert handler_imports == {"torch", "onnxruntime", "numpy", "boto3", "botocore"}
    assert demo_imports == {"torch", "numpy", "sklearn"}
    named = {img.canonical(line.split("==")[0]) for line in lines}
    assert named == {"boto3", "botocore", "torch", "onnxruntime", "numpy", "scikit-learn"}
    assert "torch==2.13.0+cpu" in lines
    assert '"torch==2.13.0"' in (ROOT / "pyproject.toml").read_text()
    assert (image.context / "constraints.txt").read_text() == (ROOT / "constraints.txt").read_text()


def test_the_cmd_handler_imports_from_the_wheel_alone(
    image: img.SpillImage, tmp_path: Path
) -> None:
    """Import the CMD's module with the wheel first on the path, as LAMBDA_TASK_ROOT is,
    from a directory outside the checkout: it must come from the wheel and be callable."""
    module, _, attr = img.HANDLER.rpartition(".")
    script = textwrap.dedent(
        f"""
        import importlib, sys
        sys.path.insert(0, {str(image.wheel)!r})
        mod = importlib.import_module({module!r})
        assert mod.__file__.startswith({str(image.wheel)!r}), mod.__file__
        assert callable(getattr(mod, {attr!r}))
        demo = importlib.import_module("mark.demo")
        assert demo.__file__.startswith({str(image.wheel)!r}) and callable(demo.digits_model)
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_image_context_and_its_tag_are_reproducible(tmp_path: Path) -> None:
    # From one snapshot of the tree: others may be editing the checkout meanwhile.
    src = pkg.copy_source_tree(tmp_path / "src")
    a = img.build_spill_image(tmp_path / "a", root=src)
    b = img.build_spill_image(tmp_path / "b", root=src)
    assert a.tag == b.tag
    for path in a.context.iterdir():
        assert (b.context / path.name).read_bytes() == path.read_bytes(), path.name
    (src / "lambda_handlers" / "spill.py").write_text("# changed\n", encoding="utf-8")
    assert img.build_spill_image(tmp_path / "c", root=src).tag != a.tag


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


def test_a_list_parameter_is_checked_item_by_item() -> None:
    out = tpl.fill_yaml(
        tpl.template_text(),
        {"SubnetIds": "subnet-0abc1234,subnet-0def5678", "AllowedCidr": "203.0.113.0/24"},
    )
    params = tpl.parameters(tpl.load(out))
    assert params["SubnetIds"].default == "subnet-0abc1234,subnet-0def5678"
    assert params["AllowedCidr"].default == "203.0.113.0/24"  # required: inserted


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
        ({"AllowedCidr": "0.0.0.0"}, "AllowedCidr='0.0.0.0': must match"),
        ({"SubnetIds": "subnet-0abc1234,$(reboot)"}, "SubnetIds='subnet-0abc1234,$(reboot)'"),
        ({"DatabaseSecretArn": "x'; curl"}, 'DatabaseSecretArn="x\'; curl": must match'),
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


def test_cli_package_writes_both_artifacts_and_prints_the_push_commands(tmp_path: Path) -> None:
    out = run("deploy", "package", "--out", str(tmp_path / "dist"))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "dist" / pkg.AGENT_BUNDLE).stat().st_size > 0
    assert (tmp_path / "dist" / img.IMAGE_DIR / "Dockerfile").is_file()
    assert "s3://$BUCKET/mark/agent-bundle.tar.gz" in out.stdout
    tag = img.build_spill_image(tmp_path / "again").tag  # the tag is the content's
    context = tmp_path / "dist" / img.IMAGE_DIR
    lines = [line.strip() for line in out.stdout.splitlines()]
    build = f"docker build --platform linux/amd64 --provenance=false -t $REPO:{tag} {context}"
    assert build in lines
    assert f"docker push $REPO:{tag}" in lines
    assert "REPO=$ACCOUNT.dkr.ecr.$REGION.amazonaws.com/mark-spill" in lines
    assert "then deploy with SpillImageUri=$SPILL_IMAGE" in lines
    assert "torch==2.13.0+cpu" in out.stdout
