"""Rich output shared by every command: result tables, one-line errors, progress."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

console = Console()
err_console = Console(stderr=True)


def error_line(message: str) -> None:
    """The one line a failed command prints (to stderr, no traceback).

    The message is escaped: paths, keys and values in it are data, and text such as '[/x]' in a
    file name would otherwise be parsed as rich markup (and raise MarkupError).
    """
    err_console.print(
        f"[bold red]nopebench: error:[/] {escape(message)}", highlight=False, soft_wrap=True
    )


def fmt(value: object, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        return f"{value:.{digits}g}"
    return str(value)


def verdict(passed: bool | None) -> str:
    if passed is None:
        return "[yellow]skipped[/]"
    return "[green]pass[/]" if passed else "[bold red]FAIL[/]"


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> Table:
    t = Table(title=title, title_justify="left", header_style="bold")
    for col in columns:
        t.add_column(col, overflow="fold")
    for row in rows:
        t.add_row(*(cell if isinstance(cell, str) else fmt(cell) for cell in row))
    return t


def print_json(data: object) -> None:
    """Machine-readable records on stdout (plain print: rich would wrap long lines)."""
    from nopebench.records import _jsonable

    print(json.dumps(_jsonable(data), indent=2))


def new_progress(transient: bool = True) -> Progress:
    """The project's progress display on stderr (spinner, label, bar, n/total, elapsed).

    Shown only on a terminal: piped or captured, rich would still end the bar with a stray
    blank line, so an error after it would no longer be the one line on stderr.
    """
    columns = [
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    ]
    return Progress(
        *columns, console=err_console, transient=transient, disable=not err_console.is_terminal
    )


@contextmanager
def progress_bar(description: str, total: int | None, transient: bool = True):
    """A progress bar (new_progress) with one task; yields advance(label) to step it."""
    with new_progress(transient) as bar:
        task = bar.add_task(description, total=total)

        def advance(label: str | None = None) -> None:
            bar.update(
                task, advance=1, description=f"{description}: {label}" if label else description
            )

        yield advance
