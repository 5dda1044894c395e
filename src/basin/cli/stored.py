"""What `basin sweep` and `basin tune` share on the terminal: the notes a
file resolved with, and computing the runs a result store lacks under a
progress bar that an interrupt leaves resumable."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from basin.experiments.store import RunStore

T = TypeVar("T")


def print_notes(console: Console, notes: Sequence[str], warnings: Sequence[str]) -> None:
    for line in notes:
        console.print(f"[yellow]note:[/] {escape(line)}", highlight=False, soft_wrap=True)
    for line in warnings:
        console.print(f"[yellow]warning:[/] {escape(line)}", highlight=False, soft_wrap=True)


def compute_missing(console: Console, label: str, keys: Sequence[str], pending: int, store: RunStore,
                    executor: str, as_json: bool, run: Callable[[Callable[[int, int], None]], T]) -> T:
    """Run ``run(tick)`` for the ``pending`` of ``keys`` the store lacks; on
    Ctrl-C say how many are stored and exit 130 (the same command resumes)."""
    from basin.experiments.pool import JobProgress

    console.print(f"{label}: {len(keys)} runs, {len(keys) - pending} in the store at {store.root}, {pending} to "
                  f"compute ({executor})", highlight=False, soft_wrap=True)
    try:
        with JobProgress(label, pending, stream=sys.stderr, terminal=console.is_terminal and not as_json) as tick:
            return run(tick)
    except KeyboardInterrupt:
        done = sum(1 for key in keys if store.has(key))
        console.print(f"interrupted: {done} of {len(keys)} runs are in the store; run the same command again "
                      "to compute the rest", highlight=False, soft_wrap=True)
        raise typer.Exit(130) from None
