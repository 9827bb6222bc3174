"""Long steps reach a log: off a terminal, progress is a plain line on stderr at a steady pace
(every 30 s by default), never a bar and never silence."""

from __future__ import annotations

import threading
import time

from typer.testing import CliRunner

from nopebench import console
from nopebench.checks import layout
from nopebench.cli import app


def test_line_progress_prints_at_every_interval_until_done():
    printed: list[float] = []
    ticked = threading.Event()

    class Counted(console.LineProgress):
        def emit(self) -> None:
            printed.append(time.monotonic())
            ticked.set()

    with Counted(interval=0.05) as progress:
        task = progress.add_task("work", total=3)
        progress.update(task, advance=1)
        deadline = time.monotonic() + 10
        while len(printed) < 4 and time.monotonic() < deadline:
            ticked.wait(0.1)
            ticked.clear()
    count = len(printed)
    assert count >= 4
    gaps = [b - a for a, b in zip(printed, printed[1:], strict=False)]
    assert max(gaps) < 2  # steady: no long silence between lines (0.05 s interval)
    ticked.clear()
    assert not ticked.wait(0.3) and len(printed) == count  # and it stops with the step


def test_a_line_says_what_runs_how_far_and_for_how_long(capsys):
    progress = console.LineProgress(interval=60)
    with progress:
        task = progress.add_task("verify-layout", total=4)
        progress.update(task, advance=1, description="verify-layout: reference T65536")
        progress.emit()
    err = capsys.readouterr().err
    assert err.startswith("verify-layout: reference T65536: 1/4 (")
    assert err.endswith(" s)\n")


def test_off_a_terminal_the_progress_display_is_lines():
    assert not console.err_console.is_terminal  # pytest captures stderr
    assert isinstance(console.new_progress(), console.LineProgress)


def test_interval_from_the_environment(monkeypatch):
    monkeypatch.setenv(console.PROGRESS_ENV, "0.25")
    assert console.progress_interval() == 0.25
    for bad in ("x", "0", "-1"):
        monkeypatch.setenv(console.PROGRESS_ENV, bad)
        assert console.progress_interval() == console.PROGRESS_INTERVAL_S == 30


def test_a_long_sweep_prints_progress_while_a_case_runs(tmp_path, monkeypatch):
    """verify-layout --sweep in a log: while one (slow) case runs, lines keep coming. The case
    here waits until three lines were printed, so the test cannot pass on a silent run."""
    monkeypatch.setenv(console.PROGRESS_ENV, "0.05")
    lines = []
    real_emit = console.LineProgress.emit

    def counting_emit(self):
        lines.append(time.monotonic())
        real_emit(self)

    monkeypatch.setattr(console.LineProgress, "emit", counting_emit)
    real_run_case = layout.run_case

    def slow_case(case, writer, gatherer, device="cpu"):
        deadline = time.monotonic() + 20
        while len(lines) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        return real_run_case(case, writer, gatherer, device)

    monkeypatch.setattr(layout, "run_case", slow_case)
    monkeypatch.setattr(
        "nopebench.commands.verify_layout.sweep_cases",
        lambda model, seed=0: layout.sweep_cases(model, seed, tokens=(1,))[:1],
    )
    result = CliRunner().invoke(app, ["verify-layout", "--sweep", "--results-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    progress = [x for x in result.stderr.splitlines() if x.startswith("verify-layout: reference")]
    assert len(progress) >= 3, result.stderr
    assert progress[0].endswith(" s)") and ": 1/1 (" in progress[0]


def test_status_off_a_terminal_repeats_its_latest_text(monkeypatch, capsys):
    monkeypatch.setenv(console.PROGRESS_ENV, "0.05")
    with console.status("waiting for the server") as line:
        line.update("waiting for the server (healthy, loading model list)")
        deadline = time.monotonic() + 10
        while "loading model list" not in capsys.readouterr().err and time.monotonic() < deadline:
            time.sleep(0.02)
        assert time.monotonic() < deadline
