"""`nopebench run` (and `make run`): every check this machine can run, in order, then a report.

Each step is an ordinary command writing its own run directory under this run's directory
(results/run/<id>/<kind>/<id>/), so the report can name every record it used. A step the
machine cannot run (no GPU, no nvcc, no GSM8K config) is recorded as skipped with the reason;
the exit status is 0 only when every step that ran passed.

Before the first step every config a step will use is loaded and validated and the results
directory is checked writable, so bad input stops the job in one line with nothing run.
run.json names the report only once report.md exists; Ctrl-C leaves it `interrupted`.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from nopebench import console as out
from nopebench.commands.options import (
    BenchCacheOptions,
    BenchDecodeOptions,
    BuildOptions,
    CheckPagetableOptions,
    Gsm8kOptions,
    Output,
    RunOptions,
    VerifyLayoutOptions,
)
from nopebench.errors import EXIT_CHECK_FAILED, EXIT_OK, NopebenchError, UnsupportedError
from nopebench.records import RunDir, check_results_root, close_open_runs, write_json


@dataclass(frozen=True)
class Step:
    """One command of the main job. `unavailable()` is None when this machine can run it, else
    the reason it is skipped; `run()` returns the command's exit code; `options` is what it runs
    with (recorded in steps.json)."""

    name: str
    unavailable: Callable[[], str | None]
    options: object
    run: Callable[[], int]


def _no_gpu() -> str | None:
    import torch

    return None if torch.cuda.is_available() else "no CUDA GPU is visible"


def _no_gpu_or_nvcc() -> str | None:
    if _no_gpu():
        return _no_gpu()
    from nopebench.cuda_build import find_nvcc

    return None if find_nvcc() else "no nvcc found (set CUDA_HOME or put nvcc on PATH)"


def steps(opts: RunOptions, root: Path) -> list[Step]:
    """The main job's steps, in order, each with the options it runs with: `opts.model` reaches
    every step that takes a model. Imports stay inside the lambdas: a step that is skipped never
    loads its dependencies."""
    output = Output(results_dir=root)
    build = BuildOptions()
    verify = VerifyLayoutOptions(model=opts.model, impl="all", output=output)
    pagetable = CheckPagetableOptions(model=opts.model, output=output)
    decode = BenchDecodeOptions(model=opts.model, quick=True, output=output)
    cache = BenchCacheOptions(quick=True, output=output)
    gsm8k = Gsm8kOptions(config=opts.gsm8k, results_dir=root) if opts.gsm8k else None

    def no_gsm8k() -> str | None:
        return None if gsm8k else "no --gsm8k config given (it needs a served model)"

    def run_build() -> int:
        from nopebench.commands import build as command

        return command.execute(build)

    def run_verify() -> int:
        from nopebench.commands import verify_layout as command

        return command.execute(verify)

    def run_pagetable() -> int:
        from nopebench.commands import check_pagetable as command

        return command.execute(pagetable)

    def run_decode() -> int:
        from nopebench.commands import bench_decode as command

        return command.execute(decode)

    def run_cache() -> int:
        from nopebench.commands import bench_cache as command

        return command.execute(cache)

    def run_gsm8k() -> int:
        from nopebench.commands import gsm8k as command

        return command.execute(gsm8k)

    return [
        Step("build", _no_gpu_or_nvcc, build, run_build),
        Step("verify-layout", lambda: None, verify, run_verify),
        Step("check-pagetable", lambda: None, pagetable, run_pagetable),
        Step("bench-decode --quick", _no_gpu, decode, run_decode),
        Step("bench-cache --quick", _no_gpu, cache, run_cache),
        Step("gsm8k", no_gsm8k, gsm8k, run_gsm8k),
    ]


def preflight(opts: RunOptions) -> None:
    """Load and validate every config the steps will use, and check the results directory
    can be written, before any step runs: bad input is one line here, not a failure after
    the other steps ran."""
    from nopebench.bench.decode_cases import load_bench_config, model_for
    from nopebench.config import load_model_config

    load_model_config(opts.model)
    decode = BenchDecodeOptions(model=opts.model)
    bench = load_bench_config(decode.config)
    model_for(bench.model_copy(update={"model": decode.model}))
    if opts.gsm8k:
        from nopebench.gsm8k.config import load_gsm8k_config

        load_gsm8k_config(opts.gsm8k)
    check_results_root(opts.results_dir)


def execute(opts: RunOptions) -> int:
    preflight(opts)  # a bad config stops here, before any directory is made
    run = RunDir.create("run", opts.results_dir)
    plan = steps(opts, run.path)
    records = []
    for i, step in enumerate(plan, 1):
        out.console.rule(f"[bold]step {i}/{len(plan)}: {step.name}")
        run.note({"steps": records, "stopped_in": step.name, "report": None})
        reason = step.unavailable()
        started = time.perf_counter()
        if reason:
            status, detail = "skipped", reason
            out.console.print(f"[yellow]skipped:[/] {reason}")
        else:
            try:
                code = step.run()
                status, detail = (
                    ("passed", "") if code == EXIT_OK else ("failed", f"exit code {code}")
                )
            except UnsupportedError as exc:
                close_open_runs("error", str(exc), inside=run.path)
                status, detail = "skipped", str(exc)
                out.console.print(f"[yellow]skipped:[/] {exc}")
            except NopebenchError as exc:
                close_open_runs("error", str(exc), inside=run.path)  # the step's own record
                status, detail = "failed", f"exit code {exc.exit_code}: {exc}"
                out.error_line(str(exc))
        records.append(
            {
                "step": step.name,
                "status": status,
                "detail": detail,
                "seconds": round(time.perf_counter() - started, 2),
                "options": asdict(step.options) if step.options is not None else None,
            }
        )
        write_json(run.file("steps.json"), records)  # after each step: a crash leaves what ran
    passed = all(r["status"] != "failed" for r in records)
    status = "passed" if passed else "failed"
    # The verdict is recorded before the report is drawn (the report shows it), naming no
    # report yet; the report is named once report.md exists.
    run.checkpoint(status, {"steps": records, "report": None})
    report_path = _report(run.path)
    run.finish(status, {"steps": records, "report": str(report_path) if report_path else None})
    out.console.rule("[bold]summary")
    out.console.print(
        out.table(
            "nopebench run",
            ["step", "result", "seconds", "detail"],
            [
                [
                    r["step"],
                    out.verdict(None if r["status"] == "skipped" else r["status"] == "passed"),
                    r["seconds"],
                    r["detail"],
                ]
                for r in records
            ],
        )
    )
    out.console.print(f"run directory: {run.path}")
    if report_path:
        out.console.print(f"report: {report_path}")
    return EXIT_OK if passed else EXIT_CHECK_FAILED


def _report(run_path: Path) -> Path | None:
    """The report of this run's steps, inside the run directory."""
    from nopebench.report import build_report, runs_under

    runs = [run_path, *runs_under(run_path)]
    target = run_path / "report"
    try:
        return build_report(runs, target)
    except Exception as exc:  # noqa: BLE001 - a report failure must not hide the steps' results
        shutil.rmtree(target, ignore_errors=True)
        out.error_line(f"report not written: {type(exc).__name__}: {exc}")
        return None
    except BaseException:  # Ctrl-C: no half-drawn report is left behind
        shutil.rmtree(target, ignore_errors=True)
        raise
