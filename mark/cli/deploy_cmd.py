"""`mark deploy`: build the artifacts the CloudFormation stack boots from, print the template."""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path

import typer
from rich.table import Table

from mark.cli.context import console
from mark.deploy import image as img
from mark.deploy import package as pkg
from mark.deploy import template as tpl

app = typer.Typer(
    help="Deploy to AWS: build the spill image context and the agent bundle, print the "
    "CloudFormation template.",
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
    """Write the spill function's image context and the agent bundle; print how to ship them."""
    with console.status("building mark's wheel, the spill image context and the agent bundle..."):
        image = img.build_spill_image(out)
        bundle = pkg.build_agent_bundle(out)
    keys = tpl.parameters(tpl.load(tpl.template_text()))
    table = Table("artifact", "path", "size", "template parameter")
    context_size = sum(p.stat().st_size for p in image.context.iterdir() if p.is_file())
    table.add_row("spill image context", str(image.context), _size(context_size), "SpillImageUri")
    table.add_row("agent bundle", str(bundle), _size(bundle.stat().st_size), "AgentBundleKey")
    console.print(table)
    console.print(
        f"the image installs {', '.join(image.requirements)} and mark's wheel "
        f"({image.wheel.name}, no dependencies); CMD {img.HANDLER}",
        highlight=False,
    )
    console.print("upload the bundle:", highlight=False)
    console.print(
        f"  aws s3 cp {bundle} s3://$BUCKET/{keys['AgentBundleKey'].default}",
        highlight=False,
        soft_wrap=True,
    )
    console.print(
        "build and push the spill image (REGION=the stack's region; needs Docker):",
        highlight=False,
    )
    for line in img.push_commands(image):
        console.print(f"  {line}", highlight=False, soft_wrap=True)
    console.print("then deploy with SpillImageUri=$SPILL_IMAGE", highlight=False)


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
