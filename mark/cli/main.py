"""The `mark` command: entry point, global options and the one place errors become messages."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer
from pydantic import ValidationError

from mark.cli import (
    catalog_cmd,
    config_cmd,
    db_cmd,
    demo_cmd,
    deploy_cmd,
    keys_cmd,
    models_cmd,
    predictor_cmd,
    profile_cmd,
    report_cmd,
    simulate_cmd,
    status_cmd,
    up_cmd,
)
from mark.cli.context import CliState, err_console
from mark.config import format_validation_error
from mark.errors import MarkError

app = typer.Typer(
    name="mark",
    help=(
        "mark serves ML models on AWS at the lowest cost that meets each model's latency SLO.\n\n"
        "Configuration comes from defaults, then --config FILE (YAML), then MARK_* environment "
        "variables (nested with __, e.g. MARK_TIMINGS__COOLDOWN_S=600), then --set KEY=VALUE."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _root(
    ctx: typer.Context,
    config: Path | None = typer.Option(
        None,
        "--config",
        "-c",
        envvar="MARK_CONFIG",
        help="YAML configuration file",
        dir_okay=False,
    ),
    overrides: list[str] = typer.Option(
        [],
        "--set",
        "-s",
        metavar="KEY=VALUE",
        help="override one setting, e.g. --set world=sim --set timings.cooldown_s=600",
    ),
    log_format: str | None = typer.Option(
        None,
        "--log-format",
        help="json|text|auto (= --set log_format=...); auto: JSON in the aws world or "
        "when stderr is not a terminal",
    ),
) -> None:
    extra = [f"log_format={log_format}"] if log_format is not None else []
    ctx.obj = CliState(config_file=config, overrides=[*overrides, *extra])


app.command("catalog")(catalog_cmd.catalog)
app.command("up")(up_cmd.up)
app.command("status")(status_cmd.status)
app.command("plan")(status_cmd.plan)
app.command("profile")(profile_cmd.profile)
app.command("report")(report_cmd.report)
app.command("simulate")(simulate_cmd.simulate)
app.add_typer(config_cmd.app, name="config")
app.add_typer(db_cmd.app, name="db")
app.add_typer(demo_cmd.app, name="demo")
app.add_typer(deploy_cmd.app, name="deploy")
app.add_typer(keys_cmd.app, name="keys")
app.add_typer(models_cmd.app, name="models")
app.add_typer(predictor_cmd.app, name="predictor")


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; a user's mistake ends in one line on stderr and exit code 2."""
    try:
        app(args=argv, prog_name="mark")  # usage errors end in click's own message, exit 2
    except MarkError as exc:
        _die(str(exc))
    except ValidationError as exc:
        _die(f"invalid configuration: {format_validation_error(exc)}")
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
    except Exception as exc:  # the safety net: never a traceback unless asked for
        if os.environ.get("MARK_DEBUG"):
            raise
        _die(f"{type(exc).__name__}: {exc} (set MARK_DEBUG=1 for the traceback)", code=1)


def _die(message: str, code: int = 2) -> None:
    first = message.strip().splitlines()[0] if message.strip() else "failed"
    err_console.print(f"[bold red]error:[/] {first}", highlight=False, soft_wrap=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
