"""Entry point of the ``basin`` command: wires the sub-command modules."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from basin.errors import BasinInputError

app = typer.Typer(
    name="basin",
    help="basin-serve: simulate, model and protect PD-disaggregated agent serving.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_err = Console(stderr=True)


def _print_version(value: bool) -> None:
    if value:
        import basin

        typer.echo(f"basin-serve {basin.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the package version and exit."),
) -> None:
    """basin-serve: simulate, model and protect PD-disaggregated agent serving."""


def _register() -> None:
    from basin.cli import cache, predict, run, scenario, workload

    app.add_typer(workload.app, name="workload")
    app.add_typer(scenario.app, name="scenario")
    app.add_typer(cache.app, name="cache")
    app.add_typer(predict.app, name="predict")
    from basin.cli import model

    app.add_typer(model.app, name="model")
    app.command("run")(run.run)
    from basin.cli import compare

    app.command("compare")(compare.compare)
    from basin.cli import ablate

    app.command("ablate")(ablate.ablate)
    from basin.cli import profile

    app.command("profile")(profile.profile)
    from basin.cli import critical_rate

    app.command("critical-rate")(critical_rate.critical_rate)
    from basin.cli import gateway

    app.command("gateway")(gateway.gateway)
    from basin.cli import replay

    app.command("replay")(replay.replay)
    from basin.cli import vulnerable

    app.command("vulnerable")(vulnerable.vulnerable)
    from basin.cli import deployment

    app.add_typer(deployment.app, name="deployment")
    from basin.cli import emulate

    app.command("emulate")(emulate.emulate)
    from basin.cli import report, sweep

    app.command("sweep")(sweep.sweep)
    app.command("report")(report.report)
    from basin.cli import tune

    app.command("tune")(tune.tune)


_register()


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; bad input prints a one-paragraph error and exits with 2
    (usage errors are reported by typer itself, also with 2)."""
    try:
        app(args=argv)
    except BasinInputError as exc:
        _err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
