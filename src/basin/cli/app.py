"""Entry point of the ``basin`` command: wires the sub-command modules.

Each sub-command's module is imported only when that command runs (or when
help lists them all): a ``basin run`` inside a sweep should not pay for the
gateway's, the model's and the plots' imports.
"""

from __future__ import annotations

import os

# The simulator and the CLI's numerics are single-threaded; a BLAS thread pool
# only spins up (about 0.1 CPU s a process) and oversubscribes parallel sweeps.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import importlib  # noqa: E402
import inspect  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402
from typing import Any, TextIO  # noqa: E402

import typer  # noqa: E402

from basin.errors import BasinInputError  # noqa: E402

#: name -> (module under basin.cli, the command's function or sub-app there), in help order.
COMMANDS: dict[str, tuple[str, str]] = {
    "workload": ("workload", "app"),
    "scenario": ("scenario", "app"),
    "cache": ("cache", "app"),
    "predict": ("predict", "app"),
    "model": ("model", "app"),
    "run": ("run", "run"),
    "compare": ("compare", "compare"),
    "ablate": ("ablate", "ablate"),
    "profile": ("profile", "profile"),
    "critical-rate": ("critical_rate", "critical_rate"),
    "gateway": ("gateway", "gateway"),
    "replay": ("replay", "replay"),
    "vulnerable": ("vulnerable", "vulnerable"),
    "deployment": ("deployment", "app"),
    "emulate": ("emulate", "emulate"),
    "calibrate": ("calibrate", "calibrate"),
    "sweep": ("sweep", "sweep"),
    "report": ("report", "report"),
    "tune": ("tune", "tune"),
}


def _print_version(value: bool) -> None:
    if value:
        import basin

        typer.echo(f"basin-serve {basin.__version__}")
        raise typer.Exit()


def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the package version and exit."),
) -> None:
    """basin-serve: simulate, model and protect PD-disaggregated agent serving."""


#: -h as well as --help, on every command (click hands it down to sub-commands).
CONTEXT = {"help_option_names": ["-h", "--help"]}


def reflow(doc: str | None) -> str | None:
    """A docstring as help text: each paragraph one line, so the terminal
    wraps it evenly (the help renderer keeps the source's line breaks).
    Paragraphs with an indented line (examples) are kept as written."""
    if not doc:
        return doc
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(p if any(line.startswith(" ") for line in p.splitlines()) else " ".join(p.split())
                       for p in paragraphs)


def _reflow_group(group: typer.Typer) -> None:
    for info in group.registered_commands:
        info.help = reflow(info.help or (info.callback.__doc__ if info.callback else None))
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            _reflow_group(sub.typer_instance)


def build_app(only: str | None = None) -> typer.Typer:
    """The ``basin`` command with every sub-command, or with ``only`` that one."""
    cli = typer.Typer(
        name="basin",
        help="basin-serve: simulate, model and protect PD-disaggregated agent serving.",
        no_args_is_help=True,
        add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish, PowerShell
        pretty_exceptions_enable=False,
        context_settings=CONTEXT,
    )
    cli.callback()(_root)
    for name, (module, attribute) in COMMANDS.items():
        if only is not None and name != only:
            continue
        target = getattr(importlib.import_module(f"basin.cli.{module}"), attribute)
        if isinstance(target, typer.Typer):  # a group of sub-commands
            _reflow_group(target)
            cli.add_typer(target, name=name)
        else:
            cli.command(name, help=reflow(target.__doc__))(target)
    return cli


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      file: TextIO | None = None, line: str | None = None) -> None:
    """A warning as the CLI's other notes look: one line, no source location."""
    stream = file if file is not None else sys.stderr
    try:
        stream.write(f"warning: {' '.join(str(message).split())}\n")
    except (OSError, ValueError):
        pass  # stderr closed: nowhere to say it


def _command_named(argv: list[str]) -> str | None:
    """The sub-command ``argv`` runs, when it names one before any option."""
    first = argv[0] if argv else None
    return first if first in COMMANDS else None


def __getattr__(name: str) -> Any:
    # ``basin.cli.app.app``: the whole command, for tests and tools that walk it.
    if name == "app":
        return build_app()
    raise AttributeError(name)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; bad input prints a one-paragraph error and exits with 2
    (usage errors are reported by typer itself, also with 2)."""
    args = list(sys.argv[1:] if argv is None else argv)
    warnings.showwarning = _one_line_warning
    try:
        build_app(_command_named(args))(args=args, prog_name="basin")
    except BasinInputError as exc:
        from rich.console import Console

        Console(stderr=True).print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
