"""Rich output shared by every command: result tables, one-line errors, progress.

On a terminal rich draws as usual. When a stream is not a terminal (a log file, a pipe, a CI
job) output is written for reading later:
- tables are laid out `LOG_WIDTH` columns wide (the `COLUMNS` variable overrides it), and text
  such as result paths is never wrapped;
- progress is a plain line on stderr every `progress_interval()` seconds (30 by default, the
  `NOPEBENCH_PROGRESS_S` variable overrides it) instead of a bar;
- under `--json` (`data_on_stdout`) stdout carries only the JSON document and everything else,
  tables included, goes to stderr.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rich.console import Console, ConsoleDimensions
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

LOG_WIDTH = 240
PROGRESS_INTERVAL_S = 30.0
PROGRESS_ENV = "NOPEBENCH_PROGRESS_S"


class _Console(Console):
    """A rich Console that, when its stream is not a terminal, lays tables out `LOG_WIDTH`
    wide and never wraps text (rich would use 80 columns or the terminal's width, and break
    long paths mid-name)."""

    @property
    def size(self) -> ConsoleDimensions:
        size = Console.size.fget(self)
        if self._width is None and not self.is_terminal and "COLUMNS" not in os.environ:
            return ConsoleDimensions(LOG_WIDTH, size.height)
        return size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)

    @property
    def soft_wrap(self) -> bool:
        return self._soft_wrap or not self.is_terminal

    @soft_wrap.setter
    def soft_wrap(self, value: bool) -> None:
        self._soft_wrap = value


console = _Console()
err_console = _Console(stderr=True)


@contextmanager
def data_on_stdout(enabled: bool = True) -> Iterator[None]:
    """While enabled, what `console` prints (tables, status lines) goes to stderr, so that
    stdout holds only what `print_json` writes and pipes into a JSON reader as it is."""
    if not enabled:
        yield
        return
    saved = console._file
    console.file = sys.stderr
    try:
        yield
    finally:
        console._file = saved


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

    print(json.dumps(_jsonable(data), indent=2), flush=True)


def progress_interval() -> float:
    """Seconds between progress lines when stderr is not a terminal."""
    try:
        value = float(os.environ.get(PROGRESS_ENV, PROGRESS_INTERVAL_S))
    except ValueError:
        return PROGRESS_INTERVAL_S
    return value if value > 0 else PROGRESS_INTERVAL_S


class _Heartbeat:
    """A background thread that calls `emit()` every `interval` seconds until stopped."""

    def __init__(self, emit, interval: float) -> None:
        self._emit = emit
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="nopebench-progress", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._emit()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class LineProgress:
    """What a progress display is when stderr is not a terminal: every `progress_interval()`
    seconds, one plain line per task (description, done/total, elapsed seconds).

    It takes the calls the project makes on a rich `Progress` (add_task, update), so callers
    need not care which one they hold. Nothing is printed by a step shorter than the interval.
    """

    def __init__(self, interval: float | None = None) -> None:
        self._tasks: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._start = time.monotonic()
        self._beat = _Heartbeat(self.emit, interval or progress_interval())

    def __enter__(self) -> LineProgress:
        self._start = time.monotonic()
        self._beat.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._beat.stop()

    def add_task(self, description: str, total: float | None = None, **_: Any) -> int:
        with self._lock:
            task = len(self._tasks)
            self._tasks[task] = {"description": description, "total": total, "completed": 0}
        return task

    def update(
        self,
        task: int,
        *,
        advance: float | None = None,
        completed: float | None = None,
        description: str | None = None,
        total: float | None = None,
        **_: Any,
    ) -> None:
        with self._lock:
            t = self._tasks[task]
            if completed is not None:
                t["completed"] = completed
            if advance is not None:
                t["completed"] += advance
            if description is not None:
                t["description"] = description
            if total is not None:
                t["total"] = total

    def emit(self) -> None:
        elapsed = time.monotonic() - self._start
        with self._lock:
            tasks = [dict(t) for t in self._tasks.values()]
        for t in tasks:
            done = f"{t['completed']:.0f}" + (f"/{t['total']:.0f}" if t["total"] else "")
            line = f"{t['description']}: {done} ({elapsed:.0f} s)"
            err_console.print(line, markup=False, highlight=False, soft_wrap=True)


def new_progress(transient: bool = True) -> Progress | LineProgress:
    """The project's progress display on stderr (spinner, label, bar, n/total, elapsed).

    A bar only on a terminal; elsewhere a `LineProgress`, whose lines come at a steady pace and
    never end in the stray blank line rich leaves after a bar.
    """
    if not err_console.is_terminal:
        return LineProgress()
    columns = [
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    ]
    return Progress(*columns, console=err_console, transient=transient)


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


class _LineStatus:
    """`status()` off a terminal: the latest text, printed every `progress_interval()` s."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._start = time.monotonic()
        self._beat = _Heartbeat(self._emit, progress_interval())

    def update(self, text: str) -> None:
        self._text = text

    def _emit(self) -> None:
        elapsed = time.monotonic() - self._start
        err_console.print(
            f"{self._text} ({elapsed:.0f} s)", markup=False, highlight=False, soft_wrap=True
        )


@contextmanager
def status(text: str) -> Iterator[Any]:
    """A spinner with `text` on a terminal; elsewhere a line every `progress_interval()` s.
    Yields an object whose `update(text)` changes the text."""
    if err_console.is_terminal:
        with err_console.status(text) as spinner:
            yield spinner
        return
    line = _LineStatus(text)
    line._beat.start()
    try:
        yield line
    finally:
        line._beat.stop()
