"""The main job and the report on a CPU machine: steps, skips with reasons, exit status, a
report whose numbers come from the named runs, and bad input as one line with exit 2."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from nopebench.bench.decode_cases import load_bench_config
from nopebench.cli import app
from nopebench.errors import UsageError
from nopebench.records import RunDir, read_run, write_csv, write_json
from nopebench.report import build_report, collect_runs

runner = CliRunner()


@pytest.fixture(scope="module")
def main_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    result = runner.invoke(app, ["run", "--results-dir", str(root)])
    return root, result


def test_main_job_runs_cpu_checks_and_skips_gpu_steps_with_reasons(main_run):
    root, result = main_run
    assert result.exit_code == 0, result.output
    (run_dir,) = (root / "run").iterdir()
    header = read_run(run_dir)
    assert header["status"] == "passed"
    steps = {s["step"]: s for s in header["summary"]["steps"]}
    assert (
        steps["verify-layout"]["status"] == "passed"
        and steps["check-pagetable"]["status"] == "passed"
    )
    for name in ("build", "bench-decode --quick", "bench-cache --quick"):
        assert steps[name]["status"] == "skipped" and "GPU" in steps[name]["detail"]
    assert "report:" in result.output and (run_dir / "report" / "report.md").is_file()


def test_report_numbers_come_from_the_runs_it_names(main_run):
    root, _ = main_run
    (run_dir,) = (root / "run").iterdir()
    text = (run_dir / "report" / "report.md").read_text()
    layout_dir = next((run_dir / "verify-layout").iterdir())
    checks = pd.read_csv(layout_dir / "checks.csv")
    assert str(layout_dir) in text
    assert (
        "| reference | scales exact | 1 | "
        f"{int(checks[checks.check == 'scales exact'].rows.sum())} | pass |" in text
    )
    assert (
        "![page-table widths](pagetable_widths.png)" in text
        and (run_dir / "report" / "pagetable_widths.png").is_file()
    )


def test_report_command_default_picks_latest_main_job_and_never_overwrites(main_run, tmp_path):
    root, _ = main_run
    result = runner.invoke(app, ["report", "--results-dir", str(root)])
    assert result.exit_code == 0, result.output
    out = tmp_path / "rep"
    assert (
        runner.invoke(app, ["report", "--results-dir", str(root), "--output", str(out)]).exit_code
        == 0
    )
    again = runner.invoke(app, ["report", "--results-dir", str(root), "--output", str(out)])
    assert again.exit_code == 2 and "never overwrite" in again.output


def test_report_bad_input_is_one_line(tmp_path):
    empty = runner.invoke(app, ["report", "--results-dir", str(tmp_path)])
    assert empty.exit_code == 2 and "no finished runs" in empty.output
    notrun = runner.invoke(app, ["report", str(tmp_path)])
    assert notrun.exit_code == 2 and "not a nopebench run directory" in notrun.output


def test_run_with_a_bad_model_config_writes_nothing(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nname: x\n")
    result = runner.invoke(
        app, ["run", "--model", str(bad), "--results-dir", str(tmp_path / "res")]
    )
    assert result.exit_code == 2 and "missing required key" in result.output
    assert not (tmp_path / "res").exists()


def _fake_decode_run(root):
    run = RunDir.create("bench-decode", root)
    rows = []
    backends = {"flashmla": "vLLM FLASHMLA_SPARSE"}
    kernels = {"native": "register kernel: 16 heads", "flashmla": "sparse fp8 decode at 64 heads"}
    for impl, mode, ms in [
        ("native", "nope", 0.5),
        ("flashinfer-fa3-bf16", "nope", 0.3),
        ("flashmla", "nope", 0.46),
        ("native", "shim", 0.6),
        ("flashmla", "shim", 0.45),
    ]:
        rows.append(
            {
                "case": f"h16-t512-w2176a2051-{mode}",
                "impl": impl,
                "serving_backend": backends.get(impl),
                "kernel": kernels.get(impl),
                "deployable": "yes" if impl in backends else "no",
                "accuracy_class": "strict",
                "library": "torch",
                "library_version": "2.11.0",
                "mode": mode,
                "heads": 16,
                "query_tokens": 512,
                "width": 2176,
                "active": 2051,
                "median_ms": ms,
                "spread": 0.01,
                "pct_roofline": 30.0,
                "error": None,
                "skipped": None,
                "passed": True,
            }
        )
    write_csv(run.file("results.csv"), rows)
    run.finish(
        "passed",
        {
            "ceilings": {"copy_gbps": 4000.0, "matmul_tflops": 700.0},
            "config": load_bench_config("h200-nope").model_dump(),
        },
    )
    return run.path


def test_report_renders_decode_tables_criteria_and_plots(tmp_path):
    path = _fake_decode_run(tmp_path)
    report = build_report(collect_runs([path], tmp_path), tmp_path / "rep")
    text = report.read_text()
    assert "| case | native | flashinfer-fa3-bf16 |" in text
    assert "| h16-t512-w2176a2051-nope | 0.5000 (30%) | 0.3000 (30%) |" in text
    # NoPE against the best shim of any implementation (flashmla's, 0.45), the best deployable
    # path (the same), and its own shim (0.6 / 0.5)
    assert (
        "| native | nope | 16 | 512 | 2176 | 0.5 | 0.45 (flashmla) | 0.90x | 0.45 (flashmla shim)"
        " | 0.90x | 1.20x |" in text
    )
    assert (
        "| flashinfer-fa3-bf16 | nope | 16 | 512 | 2176 | 0.3 | 0.45 (flashmla) | 1.50x |" in text
    )
    assert "| flashmla | vLLM FLASHMLA_SPARSE | yes |" in text
    assert (
        "H=16: native NoPE at least as fast as fa3 bf16 NoPE (fa3 / native) | H=16 T=512 W=2176"
        " (2051 active) | 0.6 | ±2.0% | >= 1.00 | **FAIL** |" in text
    )
    assert (
        "| H=16: native NoPE vs fa3 fp8 (fa3 fp8 / native) | H=16 T=512 W=2176 (2051 active)"
        " | - | - | >= 5.00 | not measured |" in text
    )
    # a criterion over a selection names it and its worst cell, and lists the cells it fails at
    assert (
        "| native NoPE at 60% of the roofline at 512 tokens, every head count | every cell at "
        "T=512 (worst: H=16 T=512 W=2176 (2051 active)) | 30 | ±1.0% | >= 60% of roofline | "
        "**FAIL** (1 of 1 cells fail) |" in text
    )
    assert (
        "- native NoPE at 60% of the roofline at 512 tokens, every head count: fails at H=16 "
        "T=512 W=2176 (2051 active) (30)" in text
    )
    # the kernel each implementation that names one ran, with its cells; fa3 names none
    assert "- `native`, register kernel: 16 heads: 16x512 nope w2176, 16x512 shim w2176" in text
    assert "- `flashmla`, sparse fp8 decode at 64 heads: 16x512 nope w2176, 16x512 shim" in text
    assert "- `flashinfer-fa3-bf16`" not in text
    assert (tmp_path / "rep" / "decode_latency.png").is_file()


def test_report_rejects_a_directory_that_is_not_a_run(tmp_path):
    with pytest.raises(UsageError):
        collect_runs([tmp_path], tmp_path)
    write_json(tmp_path / "x.json", {})
    assert json.loads((tmp_path / "x.json").read_text()) == {}
