"""`nopebench compare` and report's comparison table: synthetic runs with known cells, and the
committed H200 runs checked against an independent computation from their CSVs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from nopebench.bench import run_compare as rc
from nopebench.commands import compare as compare_command
from nopebench.commands.options import CompareOptions
from nopebench.config import REPO_ROOT
from nopebench.errors import EXIT_CHECK_FAILED, EXIT_OK, UsageError
from nopebench.records import write_json
from nopebench.report import build_report

FULL = REPO_ROOT / "results/reference/h200-bench-decode-full"
DECODE_A = FULL / "20261201T025356.163552Z-03b370"  # 07b4e7b
DECODE_B = FULL / "20261201T030621.424505Z-7e6a68"  # 82d0eaf, the same kernels
CACHE_A = next((REPO_ROOT / "results/reference/h200-run").glob("*/bench-cache/*"))
CACHE_B = next((REPO_ROOT / "results/reference/cache-kernels").glob("*/runs/bench-cache/*"))


def _row(case, impl, ms=None, spread=None, error=None, skipped=None):
    return {
        "case": case,
        "impl": impl,
        "median_ms": ms,
        "spread": spread,
        "error": error,
        "skipped": skipped,
    }


def make_run(root: Path, name: str, rows: list[dict], kind="bench-decode", **header) -> Path:
    path = root / name
    path.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(path / "results.csv", index=False)
    write_json(
        path / "run.json",
        {"run_id": name, "kind": kind, "status": "passed", "git_sha": name, **header},
    )
    return path


A_ROWS = [
    _row("c1", "native", 1.00, 0.02),
    _row("c1", "fa3", 1.00, 0.05),
    _row("c1", "fp8", 1.00, 0.05),
    _row("c2", "native", 1.00, 0.01),
    _row("c2", "fa3", 2.00, 0.01),
    _row("c3", "native", 3.00, 0.01),
    _row("c3", "fa3", skipped="needs SM120"),
]
B_ROWS = [
    _row("c1", "native", 1.10, 0.03),  # 10% slower, spreads 2% and 3%: regression
    _row("c1", "fa3", 1.04, 0.02),  # 4% slower: beyond B's 2% but within A's 5%: no mark
    _row("c1", "fp8", 1.06, 0.02),  # 6% slower: beyond both: regression
    _row("c2", "native", 0.90, 0.01),  # A 11% slower than B: faster
    _row("c2", "fa3", error="correctness check failed: x"),
    _row("c3", "fa3", skipped="needs SM120"),  # skipped in both: not a cell; c3 native gone
]


@pytest.fixture
def two_runs(tmp_path):
    return make_run(tmp_path, "a", A_ROWS), make_run(tmp_path, "b", B_ROWS)


def _cells(comparison) -> dict[tuple, dict]:
    return {(r["case"], r["impl"]): r for r in comparison.cells.to_dict("records")}


def test_same_kind_side_by_side_with_ratio_spreads_and_marks(two_runs):
    a, b = two_runs
    comparison = rc.compare_runs(rc.load_run(a, "RUN_A"), rc.load_run(b, "RUN_B"))
    cells = _cells(comparison)
    assert set(cells) == {
        ("c1", "native"),
        ("c1", "fa3"),
        ("c1", "fp8"),
        ("c2", "native"),
        ("c2", "fa3"),
        ("c3", "native"),
    }
    c = cells[("c1", "native")]
    assert (c["a_ms"], c["a_spread"], c["b_ms"], c["b_spread"]) == (1.0, 0.02, 1.1, 0.03)
    assert c["ratio"] == pytest.approx(1.1) and c["regression"] and not c["faster"]
    assert not cells[("c1", "fa3")]["regression"] and not cells[("c1", "fa3")]["faster"]
    assert cells[("c1", "fp8")]["regression"]
    assert cells[("c2", "native")]["faster"] and not cells[("c2", "native")]["regression"]
    assert cells[("c2", "fa3")]["note"] == "B: error" and pd.isna(cells[("c2", "fa3")]["ratio"])
    assert cells[("c3", "native")]["note"] == "not in B" and cells[("c3", "native")]["a_ms"] == 3.0
    s = comparison.summary()
    assert (s["compared"], s["regressions"], s["faster"], s["within_spread"]) == (4, 2, 1, 1)
    assert s["only_one_run"] == 2
    assert s["geomean_ratio"] == pytest.approx((1.1 * 1.04 * 1.06 * 0.9) ** 0.25)
    assert s["largest_ratio_cell"] == ["c1", "native"]


def test_swapping_the_runs_swaps_regression_and_faster(two_runs):
    a, b = two_runs
    forward = _cells(rc.compare_runs(rc.load_run(a, "A"), rc.load_run(b, "B")))
    back = _cells(rc.compare_runs(rc.load_run(b, "A"), rc.load_run(a, "B")))
    both = [k for k, v in forward.items() if not pd.isna(v["ratio"])]
    assert both
    for key in both:
        assert forward[key]["regression"] == back[key]["faster"], key
        assert forward[key]["faster"] == back[key]["regression"], key
        assert back[key]["ratio"] == pytest.approx(1 / forward[key]["ratio"])
    assert back[("c3", "native")]["note"] == "not in A"


def test_committed_h200_runs_match_an_independent_computation():
    comparison = rc.compare_runs(rc.load_run(DECODE_A, "A"), rc.load_run(DECODE_B, "B"))
    a, b = (pd.read_csv(p / "results.csv") for p in (DECODE_A, DECODE_B))
    timed = [df[df.median_ms.notna() & df.error.isna()] for df in (a, b)]
    both = timed[0].merge(timed[1], on=["case", "impl"], suffixes=("_a", "_b"))
    both["ratio"] = both.median_ms_b / both.median_ms_a
    tol = both[["spread_a", "spread_b"]].max(axis=1)
    expect_reg = set(map(tuple, both[both.ratio - 1 > tol][["case", "impl"]].values))
    expect_fast = set(map(tuple, both[1 / both.ratio - 1 > tol][["case", "impl"]].values))
    cells = comparison.cells
    assert len(cells) == len(both) and cells.ratio.notna().all()
    got = cells.set_index(["case", "impl"])
    merged = both.set_index(["case", "impl"])
    assert (got.ratio.reindex(merged.index) - merged.ratio).abs().max() < 1e-12
    assert set(got.index[got.regression]) == expect_reg
    assert set(got.index[got.faster]) == expect_fast
    assert comparison.differences() == []  # same GPU, driver, versions and config


def test_bench_cache_cells_are_op_variant_tokens_impl():
    comparison = rc.compare_runs(rc.load_run(CACHE_A, "A"), rc.load_run(CACHE_B, "B"))
    keys = ["op", "variant", "tokens", "impl"]
    a, b = (pd.read_csv(p / "results.csv") for p in (CACHE_A, CACHE_B))
    shared = a.merge(b, on=keys)
    s = comparison.summary()
    assert comparison.keys == tuple(keys) and s["compared"] == len(shared) > 0
    assert s["only_one_run"] == len(a) + len(b) - 2 * len(shared) > 0
    notes = set(comparison.cells.note)
    assert notes <= {"", "not in A", "not in B"} and notes != {""}


def test_two_kinds_are_refused(two_runs, tmp_path):
    a, _ = two_runs
    cache = make_run(tmp_path, "cache", [], kind="bench-cache")
    pd.DataFrame(
        [{"op": "write", "variant": "v", "tokens": 1, "impl": "cuda", "median_ms": 1.0}]
    ).assign(spread=0.01, error=None).to_csv(cache / "results.csv", index=False)
    with pytest.raises(UsageError, match="two runs of one kind") as err:
        rc.compare_runs(rc.load_run(a, "RUN_A"), rc.load_run(cache, "RUN_B"))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "setup, needle",
    [
        (lambda root: root / "nowhere", "not a nopebench run directory"),
        (lambda root: make_run(root, "v", A_ROWS, kind="verify-layout"), "a verify-layout run"),
        (lambda root: make_run(root, "j", A_ROWS, kind="run"), "step's directory"),
        (lambda root: make_run(root, "r", A_ROWS, status="running"), "has not finished"),
        (lambda root: _without(make_run(root, "n", A_ROWS), "results.csv"), "not a file"),
        (lambda root: _rewrite(make_run(root, "m", A_ROWS), ["case", "median_ms"]), "missing"),
    ],
)
def test_unusable_run_is_one_line(tmp_path, setup, needle):
    path = setup(tmp_path)
    with pytest.raises(UsageError, match=needle) as err:
        rc.load_run(path, "RUN_B")
    assert str(err.value).startswith(f"RUN_B {path}") and "\n" not in str(err.value)


def _without(run: Path, name: str) -> Path:
    (run / name).unlink()
    return run


def _rewrite(run: Path, columns: list[str]) -> Path:
    pd.read_csv(run / "results.csv")[columns].to_csv(run / "results.csv", index=False)
    return run


def test_differing_run_facts_are_named(tmp_path):
    a = make_run(tmp_path, "a", A_ROWS, gpu="NVIDIA H200", versions={"triton": "3.6.0"})
    b = make_run(tmp_path, "b", B_ROWS, gpu="NVIDIA H100", versions={"triton": "3.6.0"})
    comparison = rc.compare_runs(rc.load_run(a, "A"), rc.load_run(b, "B"))
    assert comparison.differences() == ["gpu: NVIDIA H200 -> NVIDIA H100"]


# ---------------------------------------------------------------- the command


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nopebench", "compare", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_json_on_stdout_only_and_exit_1_on_a_regression(two_runs):
    a, b = two_runs
    proc = _cli(str(a), str(b), "--json")
    assert proc.returncode == EXIT_CHECK_FAILED, proc.stderr
    data = json.loads(proc.stdout)  # nothing but the data
    assert data["summary"]["regressions"] == 2 and data["a"]["run_id"] == "a"
    marks = {(c["case"], c["impl"]): c["mark"] for c in data["cells"]}
    assert marks[("c1", "native")] == "REGRESSION" and marks[("c2", "native")] == "faster"
    assert "c1" in proc.stderr  # the tables went to stderr


def test_no_regression_exits_0(tmp_path):
    a = make_run(tmp_path, "a", A_ROWS[:2])
    b = make_run(tmp_path, "b", A_ROWS[:2])
    assert compare_command.execute(CompareOptions(a, b)) == EXIT_OK


@pytest.mark.parametrize(
    "args, needle",
    [
        (lambda a, b, root: [str(root / "nowhere"), str(b)], "not a nopebench run directory"),
        (lambda a, b, root: [str(a), str(_cache_run(root))], "two runs of one kind"),
    ],
)
def test_bad_runs_exit_2_with_one_line(two_runs, tmp_path, args, needle):
    a, b = two_runs
    proc = _cli(*args(a, b, tmp_path))
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr


def _cache_run(root: Path) -> Path:
    run = make_run(root, "cache", [], kind="bench-cache")
    pd.DataFrame(
        [{"op": "w", "variant": "v", "tokens": 1, "impl": "cuda", "median_ms": 1.0}]
    ).assign(spread=0.01, error=None).to_csv(run / "results.csv", index=False)
    return run


def test_output_is_written_new_and_never_replaced(two_runs, tmp_path):
    a, b = two_runs
    out = tmp_path / "cells.csv"
    assert compare_command.execute(CompareOptions(a, b, output=out)) == EXIT_CHECK_FAILED
    cells = pd.read_csv(out)
    assert len(cells) == 6 and int(cells.regression.sum()) == 2
    before = out.read_bytes()
    with pytest.raises(UsageError, match="already exists"):
        compare_command.execute(CompareOptions(a, b, output=out))
    assert out.read_bytes() == before
    full = tmp_path / "all.json"
    compare_command.execute(CompareOptions(a, b, output=full))
    assert json.loads(full.read_text())["summary"]["compared"] == 4
    with pytest.raises(UsageError, match=r"\.csv"):
        compare_command.execute(CompareOptions(a, b, output=tmp_path / "cells.txt"))
    assert not (tmp_path / "cells.txt").exists()


# ---------------------------------------------------------------- report


def test_report_of_two_bench_decode_runs_has_the_comparison(tmp_path):
    path = build_report([DECODE_A, DECODE_B], tmp_path / "two")
    text = path.read_text()
    assert "## Comparison of the two bench-decode runs" in text
    comparison = rc.compare_runs(rc.load_run(DECODE_A, "A"), rc.load_run(DECODE_B, "B"))
    assert rc.summary_line(comparison) in text
    section = text.split("## Comparison of the two bench-decode runs", 1)[1]
    regressed = comparison.cells[comparison.cells.regression]
    assert len(regressed)
    for r in regressed.itertuples():
        line = next(x for x in section.splitlines() if x.startswith(f"| {r.case} | {r.impl} |"))
        assert line.rstrip().endswith("| REGRESSION |")
    single = build_report([DECODE_B], tmp_path / "one").read_text()
    assert "Comparison of the two" not in single
