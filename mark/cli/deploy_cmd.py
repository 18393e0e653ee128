"""`mark deploy`: build the artifacts the CloudFormation stack boots from, print the template."""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path

import typer
from rich.table import Table

from mark.cli.context import console
from mark.deploy import package as pkg
from mark.deploy import template as tpl

app = typer.Typer(
    help="Deploy to AWS: build the Lambda zip and agent bundle, print the CloudFormation template.",
    no_args_is_help=True,
)


class Format(StrEnum):
    YAML = "yaml"
    JSON = "json"


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    kib = n / 1024
    return f"{kib:.1f} KiB" if kib < 1024 else f"{kib / 1024:.1f} MiB"


@app.command("package")
def package(
    out: Path = typer.Option(
        Path("dist/deploy"), "--out", "-o", file_okay=False, help="directory to write into"
    ),
) -> None:
    """Build the Lambda spill zip and the agent bundle, print their paths, sizes and uploads."""
    with console.status("building the Lambda zip and the agent bundle..."):
        lam = pkg.build_lambda_zip(out)
        bundle = pkg.build_agent_bundle(out)
    table = Table("artifact", "path", "size", "template parameter")
    keys = tpl.parameters(tpl.load(tpl.template_text()))
    rows = [
        ("Lambda spill zip", lam.path, "LambdaCodeKey"),
        ("agent bundle", bundle, "AgentBundleKey"),
    ]
    for what, path, key in rows:
        table.add_row(what, str(path), _size(path.stat().st_size), key)
    console.print(table)
    console.print(f"the zip holds {', '.join(lam.modules)}", highlight=False)
    if lam.external:
        console.print(
            f"the spill function imports {', '.join(lam.external)} from outside the zip: "
            "give it a layer (SpillLayerArns); see infra/README.md",
            highlight=False,
        )
    console.print("upload with:", highlight=False)
    for _what, path, key in rows:
        console.print(
            f"  aws s3 cp {path} s3://$BUCKET/{keys[key].default}", highlight=False, soft_wrap=True
        )


@app.command("template")
def template(
    params: list[str] = typer.Option(
        [],
        "--param",
        "-p",
        metavar="KEY=VALUE",
        help="set a parameter's default, e.g. --param ArtifactBucket=my-bucket (repeatable)",
    ),
    fmt: Format = typer.Option(Format.YAML, "--format", help="yaml (short tags kept) or json"),
) -> None:
    """Print the CloudFormation template (infra/mark.yaml) with the given parameter defaults."""
    text = tpl.render(tpl.template_text(), tpl.parse_params(params), fmt.value)
    sys.stdout.write(text)
