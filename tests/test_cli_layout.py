"""`nopebench verify-layout` end to end: table, fresh run directory, records, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from nopebench import geometry as g
from nopebench import rowformat
from nopebench.checks import layout
from nopebench.cli import app
from nopebench.config import REPO_ROOT
from nopebench.records import read_run

NO_GPU = pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the message shown without a GPU"
)


def invoke(*args: str):
    return CliRunner().invoke(app, ["verify-layout", *args])


def run_dirs(root):
    base = root / "verify-layout"
    return sorted(base.iterdir()) if base.is_dir() else []


def test_default_run_through_a_real_process(tmp_path):
    """The command exactly as `make run` uses it, at its default size (4096 tokens)."""
    proc = subprocess.run(
        [sys.executable, "-m", "nopebench", "verify-layout", "--results-dir", str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "verify-layout: glm53-flash" in proc.stdout and "FAIL" not in proc.stdout
    assert "NoPE tail zero" in proc.stdout and proc.stderr == ""  # no stray progress output
    (run,) = run_dirs(tmp_path)
    assert f"results: {run}" in proc.stdout.replace("\n", "")
    header = read_run(run)
    assert header["status"] == "passed" and "git_sha" in header and header["git_sha"]
    assert header["summary"] == {"model": "glm53-flash", "passed": True, "cases": 1, "skipped": {}}
    checks = pd.read_csv(run / "checks.csv")
    assert checks["passed"].all() and set(checks["impl"]) == {"reference"}
    assert (checks["tokens"] == 4096).all() and (checks["row_bytes"] == 656).all()
    assert "NoPE tail zero" in set(checks["check"])
    data = json.loads((run / "checks.json").read_text())
    assert data["summary"]["passed"] is True and len(data["checks"]) == len(checks)


def test_two_runs_give_two_directories(tmp_path):
    for _ in range(2):
        result = invoke("--tokens", "64", "--results-dir", str(tmp_path))
        assert result.exit_code == 0, result.stderr
    runs = run_dirs(tmp_path)
    assert len(runs) == 2 and runs[0] != runs[1]
    assert all(read_run(r)["status"] == "passed" for r in runs)
    assert {p.name for p in runs[0].iterdir()} == {"run.json", "checks.csv", "checks.json"}


@pytest.mark.parametrize("model", ["glm5", "dsv32"])
def test_other_models(tmp_path, model):
    result = invoke(
        "--model", model, "--tokens", "64", "--seed", "3", "--results-dir", str(tmp_path)
    )
    assert result.exit_code == 0, result.stderr
    assert f"verify-layout: {model}" in result.stdout and "RoPE tail bit-exact" in result.stdout
    checks = pd.read_csv(run_dirs(tmp_path)[0] / "checks.csv")
    assert (checks["rope_dim"] == 64).all() and (checks["base_seed"] == 3).all()


def test_json_records_on_stdout(tmp_path):
    result = invoke("--tokens", "16", "--json", "--results-dir", str(tmp_path))
    assert result.exit_code == 0
    rows = json.loads(result.stdout)  # stdout is the JSON document alone
    assert "verify-layout: glm53-flash" in result.stderr and "results: " in result.stderr
    assert {r["check"] for r in rows} >= {"input finite", "scales exact", "NoPE tail zero"}
    assert all(r["passed"] for r in rows) and all(r["case"] == rows[0]["case"] for r in rows)


def test_sweep_flag_runs_the_grid(tmp_path, monkeypatch):
    small = layout.sweep_cases

    def fast_grid(model, seed=0):  # the grid's shape, at sizes a unit test can afford
        return small(model, seed, tokens=(1, 65))

    monkeypatch.setattr("nopebench.commands.verify_layout.sweep_cases", fast_grid)
    result = invoke("--sweep", "--results-dir", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    header = read_run(run_dirs(tmp_path)[0])
    assert header["summary"]["cases"] == 2 * 2 * 2 * 2


@NO_GPU
def test_impl_cuda_without_gpu_is_one_line_exit_3(tmp_path):
    result = invoke("--impl", "cuda", "--tokens", "16", "--results-dir", str(tmp_path))
    assert result.exit_code == 3  # this machine cannot run that
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("nopebench: error: --impl cuda") and "GPU" in line
    assert run_dirs(tmp_path) == []


@NO_GPU
def test_impl_all_without_gpu_runs_the_reference_and_says_what_was_skipped(tmp_path):
    result = invoke("--impl", "all", "--tokens", "16", "--results-dir", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    assert "(not run)" in result.stdout and "skipped" in result.stdout
    summary = read_run(run_dirs(tmp_path)[0])["summary"]
    assert summary["passed"] is True and "cuda" in summary["skipped"]


@pytest.mark.parametrize("impl", ["bogus", "Reference", ""])
def test_unknown_impl_is_one_line_exit_2(tmp_path, impl):
    result = invoke("--impl", impl, "--tokens", "16", "--results-dir", str(tmp_path))
    assert result.exit_code == 2
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert "--impl" in line and "reference" in line and "cuda" in line and "all" in line
    assert run_dirs(tmp_path) == []


@pytest.mark.parametrize("tokens", ["0", "-5", "many"])
def test_bad_tokens_exit_2_without_a_run(tmp_path, tokens):
    result = invoke("--tokens", tokens, "--results-dir", str(tmp_path))
    assert result.exit_code == 2
    assert run_dirs(tmp_path) == []


def test_a_failing_check_exits_1_and_records_failed(tmp_path, monkeypatch):
    def stale_tail_writer(cache, kv_c, k_pe, slot_mapping, scale_format):
        tail = cache[..., g.ROPE_OFFSET :].clone()
        rowformat.write_cache(cache, kv_c, k_pe, slot_mapping, scale_format)
        cache[..., g.ROPE_OFFSET :] = tail

    broken = layout.LayoutImpl(
        "reference", needs_gpu=False, load=lambda: (stale_tail_writer, rowformat.gather_upconvert)
    )
    monkeypatch.setitem(layout.IMPLEMENTATIONS, "reference", broken)
    result = invoke("--tokens", "64", "--results-dir", str(tmp_path))
    assert result.exit_code == 1
    assert "FAIL" in result.stdout and "NoPE tail zero" in result.stdout
    run = run_dirs(tmp_path)[0]
    header = read_run(run)
    assert header["status"] == "failed" and header["summary"]["passed"] is False
    checks = pd.read_csv(run / "checks.csv")
    assert checks.loc[~checks["passed"], "check"].tolist() == ["NoPE tail zero"]
