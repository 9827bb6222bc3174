"""bench-decode from the command line, with the GPU work faked at the runner: case filters, the
provenance every row carries, and that each row's `repro` command selects exactly its cell."""

from __future__ import annotations

import json
import shlex

import pandas as pd
import pytest
from typer.testing import CliRunner

from nopebench import environment
from nopebench.bench import acceptance
from nopebench.bench.decode_runner import describe
from nopebench.bench.timing import Ceilings
from nopebench.cli import app
from nopebench.commands import bench_decode
from nopebench.commands.options import DEFAULT_NOISE_FLOOR
from nopebench.errors import EXIT_CHECK_FAILED, EXIT_UNSUPPORTED, EXIT_USAGE
from nopebench.impls import registry

runner = CliRunner()
H200 = {"gpu": "NVIDIA H200", "sm": 90, "l2_bytes": 60 << 20}


@pytest.fixture
def fake_gpu_run(monkeypatch):
    """A GPU that is 'there', and a runner that records what it was asked to run and returns a
    timed row per (case, implementation) without touching a device."""
    calls: list[tuple[list[str], list[str]]] = []

    def run_grid(cfg, model, cases, impls, ceil, budget_s, progress=None, device="cuda"):
        calls.append(([c.case_id for c in cases], list(impls)))
        specs = registry.implementations()
        return [
            {
                "case": c.case_id,
                "heads": c.heads,
                "query_tokens": c.query_tokens,
                "width": c.width,
                "active": c.active,
                "mode": c.mode,
                **describe(specs[name]),
                "skipped": None,
                "error": None,
                "passed": True,
                "median_ms": 0.1 + 0.01 * i,
                "spread": 0.01,
                "pct_roofline": 50.0,
            }
            for i, (c, name) in enumerate((c, n) for c in cases for n in impls)
        ]

    monkeypatch.setattr(environment, "gpu_info", lambda: H200)
    monkeypatch.setattr(bench_decode, "run_grid", run_grid)
    monkeypatch.setattr(bench_decode, "measure_ceilings", lambda: Ceilings(4000.0, 700.0))
    monkeypatch.setattr(bench_decode, "decode_plots", lambda df, path: [])
    return calls


def _only_run(root):
    (run,) = (root / "bench-decode").iterdir()
    return run


@pytest.mark.parametrize("quick", [False, True])
def test_every_rows_repro_command_selects_exactly_its_own_cell(fake_gpu_run, tmp_path, quick):
    args = ["bench-decode", "--impl", "native", "--impl", "flashmla", "--heads", "16"]
    args += ["--heads", "64", "--tokens", "512", "--mode", "nope", "--mode", "shim"]
    args += ["--quick"] if quick else ["--tokens", "8", "--width", "2176"]
    result = runner.invoke(app, [*args, "--results-dir", str(tmp_path / "first")])
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(_only_run(tmp_path / "first") / "results.csv")
    tokens = 1 if quick else 2
    assert len(rows) == 2 * tokens * 2 * 2  # heads x tokens x modes x impls, one width
    for i, row in enumerate(rows.itertuples()):
        argv = shlex.split(row.repro)
        assert argv[:2] == ["nopebench", "bench-decode"] and ("--quick" in argv) == quick
        again = runner.invoke(app, [*argv[1:], "--results-dir", str(tmp_path / f"again{i}")])
        assert again.exit_code == 0, again.output
        cases, impls = fake_gpu_run[-1]
        assert cases == [row.case] and impls == [row.impl], row.repro


def test_rows_carry_where_they_ran_and_the_library_behind_them(fake_gpu_run, tmp_path, monkeypatch):
    monkeypatch.setenv("NOPEBENCH_GIT_SHA", "0123abcd" * 5)
    args = ["bench-decode", "--impl", "native", "--impl", "reference", "--heads", "16"]
    args += ["--tokens", "1", "--width", "2176", "--mode", "nope"]
    result = runner.invoke(app, [*args, "--results-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    run = _only_run(tmp_path)
    rows = pd.read_csv(run / "results.csv").set_index("impl")
    assert set(rows.run_id) == {run.name}
    assert set(rows.gpu) == {"NVIDIA H200"} and set(rows.sm) == {90}
    assert set(rows.git_sha) == {"0123abcd" * 5} and set(rows.git_dirty) == {False}
    assert rows.loc["native", "library"] == "triton" and rows.loc["reference", "library"] == "torch"
    assert rows.loc["native", "accuracy_class"] == "strict"
    assert rows.loc["native", "library_version"] == environment.package_version("triton")
    assert (run / "nope_vs_shim.csv").is_file() and (run / "criteria.csv").is_file()
    assert "implementations" in result.output and "none" in result.output


def test_the_answer_and_the_criteria_are_written(fake_gpu_run, tmp_path):
    result = runner.invoke(app, ["bench-decode", "--quick", "--results-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    run = _only_run(tmp_path)
    answer = pd.read_csv(run / "nope_vs_shim.csv")
    assert {"vs_best_shim", "vs_best_deployable", "vs_own_shim"} <= set(answer.columns)
    assert set(answer.impl) >= {"native", "flashmla", "flashinfer-fa3-fp8"}
    criteria = pd.read_csv(run / "criteria.csv")
    assert len(criteria) == 13 and criteria.criterion.iloc[-1].startswith("every case that ran")
    # every cell each criterion was measured at, the grid-wide ones' several
    cells = pd.read_csv(run / "criteria_cells.csv")
    assert list(cells.columns) == acceptance.CELL_ROW_COLUMNS
    measured = criteria[criteria.measured.notna() & criteria.cells.notna()]
    counts = cells.groupby("criterion", sort=False).size()
    assert all(counts[r.criterion] == r.cells for r in measured.itertuples())
    assert "NoPE against the shim" in result.output
    assert "acceptance criteria (the bench config's)" in result.output


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--heads", "24"], "--heads 24 matches no case of h200-nope (its heads: 16, 32, 64, 128)"),
        (["--quick", "--tokens", "8"], "--tokens 8 matches no case of h200-nope's quick grid"),
        (["--mode", "rope"], "--mode rope matches no case of h200-nope (its mode: nope, shim)"),
    ],
)
def test_a_filter_matching_nothing_is_one_line_and_exit_2_even_without_a_gpu(
    tmp_path, args, needle
):
    result = runner.invoke(app, ["bench-decode", *args, "--results-dir", str(tmp_path)])
    assert result.exit_code == EXIT_USAGE
    assert needle in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "bench-decode").exists()


def test_without_a_gpu_valid_filters_end_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(environment, "gpu_info", lambda: {"gpu": None, "sm": None})
    result = runner.invoke(app, ["bench-decode", "--heads", "16", "--results-dir", str(tmp_path)])
    assert result.exit_code == EXIT_UNSUPPORTED and "needs a CUDA GPU" in result.output
    assert not (tmp_path / "bench-decode").exists()


def test_baseline_marks_beyond_the_noise_floor_and_records_it(fake_gpu_run, tmp_path):
    """--baseline: a cell 1.5x slower than its baseline is a regression at the default floor;
    one 3% slower (beyond both 1% spreads) only with --noise-floor 0. Rows and run.json say
    which floor was used, and a bad floor is one line before anything runs."""
    args = ["bench-decode", "--impl", "native", "--heads", "16", "--tokens", "1", "--quick"]
    first = runner.invoke(app, [*args, "--results-dir", str(tmp_path / "first")])
    assert first.exit_code == 0, first.output
    base = pd.read_csv(_only_run(tmp_path / "first") / "results.csv")
    assert len(base) >= 2 and set(base.spread) == {0.01}
    base.loc[0, "median_ms"] /= 1.5
    base.loc[1, "median_ms"] /= 1.03
    base.to_csv(tmp_path / "baseline.csv", index=False)
    for floor, expect in ((None, {0}), ("0", {0, 1})):
        extra = [] if floor is None else ["--noise-floor", floor]
        root = tmp_path / f"floor-{floor}"
        result = runner.invoke(
            app,
            [
                *args,
                "--baseline",
                str(tmp_path / "baseline.csv"),
                *extra,
                "--results-dir",
                str(root),
            ],
        )
        assert result.exit_code == EXIT_CHECK_FAILED, result.output
        run = _only_run(root)
        rows = pd.read_csv(run / "results.csv")
        used = DEFAULT_NOISE_FLOOR if floor is None else 0.0
        assert set(rows.index[rows.regression]) == expect and set(rows.noise_floor) == {used}
        summary = json.loads((run / "run.json").read_text())["summary"]
        assert summary["noise_floor"] == used and summary["regressions"] == len(expect)
        assert f"the {100 * used:.3g}% noise floor" in result.output
    bad = runner.invoke(app, [*args, "--noise-floor", "1", "--results-dir", str(tmp_path / "bad")])
    assert bad.exit_code == EXIT_USAGE
    (line,) = bad.output.strip().splitlines()
    assert "--noise-floor 1.0: expected a fraction in [0, 1)" in line
    assert not (tmp_path / "bad").exists()
