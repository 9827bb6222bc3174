"""run.json tells the truth about how a command ended: `passed` only once every file it names
exists, `interrupted` after Ctrl-C or SIGTERM, `error` after an error, and a run whose process
is gone while it says `running` is shown as `died` (its pid and host are recorded)."""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nopebench import records, report
from nopebench.cli import app
from nopebench.commands import check_pagetable, verify_layout
from nopebench.config import REPO_ROOT
from nopebench.records import RunDir, read_run, run_status, write_json

runner = CliRunner()


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


def main_runs(root: Path) -> list[Path]:
    base = root / "run"
    return sorted(base.iterdir()) if base.is_dir() else []


def job_started(root: Path) -> bool:
    """The job's run.json is on disk (its directory is made just before)."""
    return any((p / "run.json").is_file() for p in main_runs(root))


@pytest.fixture
def fast_steps(monkeypatch):
    """The main job with its CPU steps at their smallest: verify-layout at 16 tokens and a
    check-pagetable that records one passing row (the real ones are tested elsewhere)."""
    real_verify = verify_layout.execute

    def small_verify(opts):
        from dataclasses import replace

        return real_verify(replace(opts, tokens=16))

    def quick_pagetable(opts):
        run = RunDir.create("check-pagetable", opts.output.results_dir)
        write_json(run.file("checks.json"), {"checks": []})
        run.finish("passed", {"passed": True})
        return 0

    monkeypatch.setattr(verify_layout, "execute", small_verify)
    monkeypatch.setattr(check_pagetable, "execute", quick_pagetable)


def test_a_run_records_its_pid_and_host(tmp_path):
    run = RunDir.create("k", tmp_path)
    header = read_run(run.path)
    assert header["pid"] == os.getpid() and header["host"] == platform.node()
    assert header["pid_start"] == records.process_start(os.getpid()) is not None
    assert run_status(header) == "running"  # this process is alive
    run.finish("passed")


def test_ctrl_c_in_the_report_step_leaves_interrupted_and_names_no_report(
    tmp_path, fast_steps, monkeypatch
):
    def interrupted(runs, out_dir):
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "plot.png").write_bytes(b"half drawn")
        raise KeyboardInterrupt  # what SIGINT raises in the main thread mid-report

    monkeypatch.setattr(report, "build_report", interrupted)
    result = runner.invoke(app, ["run", "--results-dir", str(tmp_path)])
    assert result.exit_code == 130
    assert result.stderr.splitlines()[-1] == "nopebench: error: interrupted"
    (run_dir,) = main_runs(tmp_path)
    header = read_run(run_dir)
    assert header["status"] == "interrupted"
    assert header["summary"]["report"] is None and not (run_dir / "report").exists()
    assert [s["status"] for s in header["summary"]["steps"]].count("passed") == 2


def test_a_passed_run_names_a_report_that_exists(tmp_path, fast_steps):
    result = runner.invoke(app, ["run", "--results-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (run_dir,) = main_runs(tmp_path)
    header = read_run(run_dir)
    assert header["status"] == "passed" and Path(header["summary"]["report"]).is_file()
    # the report shows the run's own verdict, not `running`
    assert "| run | passed |" in Path(header["summary"]["report"]).read_text()


def test_ctrl_c_in_a_step_leaves_the_job_and_the_step_interrupted(tmp_path, monkeypatch):
    def interrupted_verify(opts):
        run = RunDir.create("verify-layout", opts.output.results_dir)
        run.note({"cases": 1})
        raise KeyboardInterrupt

    monkeypatch.setattr(verify_layout, "execute", interrupted_verify)
    result = runner.invoke(app, ["run", "--results-dir", str(tmp_path)])
    assert result.exit_code == 130
    (run_dir,) = main_runs(tmp_path)
    job = read_run(run_dir)
    assert job["status"] == "interrupted" and job["summary"]["stopped_in"] == "verify-layout"
    (step_dir,) = (run_dir / "verify-layout").iterdir()
    step = read_run(step_dir)
    assert step["status"] == "interrupted" and step["summary"] == {
        "cases": 1,
        "error": "interrupted",
    }


def test_an_error_in_a_step_is_recorded_in_that_step_and_the_job_goes_on(tmp_path, monkeypatch):
    from nopebench.errors import SystemFailedError

    def failing_pagetable(opts):
        RunDir.create("check-pagetable", opts.output.results_dir)
        raise SystemFailedError("the machine failed")

    monkeypatch.setattr(check_pagetable, "execute", failing_pagetable)
    monkeypatch.setattr(verify_layout, "execute", lambda opts: 0)
    result = runner.invoke(app, ["run", "--results-dir", str(tmp_path)])
    assert result.exit_code == 1
    (run_dir,) = main_runs(tmp_path)
    job = read_run(run_dir)
    assert job["status"] == "failed"
    steps = {s["step"]: s for s in job["summary"]["steps"]}
    assert steps["check-pagetable"]["detail"] == "exit code 4: the machine failed"
    (step_dir,) = (run_dir / "check-pagetable").iterdir()
    assert read_run(step_dir)["status"] == "error"
    assert read_run(step_dir)["summary"]["error"] == "the machine failed"


def _start_real_run(results: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "nopebench", "run", "--results-dir", str(results)],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_real_run_stopped_by_a_signal_says_interrupted(tmp_path, sig):
    child = _start_real_run(tmp_path)
    try:
        wait_for(lambda: job_started(tmp_path), 120, "the job's run.json")
        child.send_signal(sig)
        _, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
    assert child.returncode == 130, err
    assert err.splitlines()[-1] == "nopebench: error: interrupted"
    (run_dir,) = main_runs(tmp_path)
    assert read_run(run_dir)["status"] == "interrupted"
    for step_dir in run_dir.glob("*/*/"):  # any step that had started is closed too
        assert read_run(step_dir)["status"] != "running"


def test_a_killed_run_is_shown_as_died(tmp_path):
    child = _start_real_run(tmp_path / "results")
    try:
        wait_for(lambda: job_started(tmp_path / "results"), 120, "the job's run.json")
    finally:
        child.kill()  # SIGKILL: nothing in the process can write run.json
        child.wait(timeout=30)
    (run_dir,) = main_runs(tmp_path / "results")
    header = read_run(run_dir)
    assert header["status"] == "running" and run_status(header) == "died"
    result = runner.invoke(app, ["report", str(run_dir), "--output", str(tmp_path / "rep")])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "| run | died |" in text
    # a died run is never taken as the latest result
    assert records.latest_run("run", tmp_path / "results") is None


def test_running_on_another_host_or_a_reused_pid(tmp_path):
    run = RunDir.create("k", tmp_path)
    header = read_run(run.path)
    assert run_status({**header, "host": "elsewhere"}) == "running"  # cannot be checked here
    assert run_status({**header, "pid_start": header["pid_start"] + 1}) == "died"  # pid reused
    run.finish("passed")
