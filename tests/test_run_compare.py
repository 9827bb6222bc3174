"""`nopebench compare` and report's comparison table: synthetic runs with known cells, the
committed H200 runs checked against an independent computation from their CSVs, and the noise
floor measured between two of them."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from nopebench.bench import acceptance
from nopebench.bench import run_compare as rc
from nopebench.commands import compare as compare_command
from nopebench.commands.options import DEFAULT_NOISE_FLOOR, CompareOptions
from nopebench.config import REPO_ROOT
from nopebench.errors import EXIT_CHECK_FAILED, EXIT_OK, EXIT_USAGE, UsageError
from nopebench.records import write_json
from nopebench.report import build_report

FULL = REPO_ROOT / "results/reference/h200-bench-decode-full"
DECODE_A = FULL / "20261201T025356.163552Z-03b370"  # 07b4e7b
DECODE_B = FULL / "20261201T030621.424505Z-7e6a68"  # 82d0eaf, the same kernels
# The two grids the default noise floor was measured on: no kernel or timing change between them
SAME_A = FULL / "20261201T094054.640900Z-fe99ec"
SAME_B = FULL / "20261201T102442.983433Z-a34e82"
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
    _row("c2", "fp8", 1.00, 0.01),
    _row("c3", "native", 3.00, 0.01),
    _row("c3", "fa3", skipped="needs SM120"),
]
# The marks with the spreads alone (--noise-floor 0), and at the default floor (6%)
B_ROWS = [
    _row("c1", "native", 1.10, 0.03),  # 10% slower, spreads 2% and 3%: regression at both
    _row("c1", "fa3", 1.04, 0.02),  # 4% slower: beyond B's 2% but within A's 5%: no mark
    _row("c1", "fp8", 1.08, 0.02),  # 8% slower: beyond both spreads and the floor: regression
    _row("c2", "native", 0.90, 0.01),  # A 11% slower than B: faster at both
    _row("c2", "fa3", error="correctness check failed: x"),
    _row("c2", "fp8", 1.03, 0.01),  # 3% slower: beyond both spreads, within the floor
    _row("c3", "fa3", skipped="needs SM120"),  # skipped in both: not a cell; c3 native gone
]


@pytest.fixture
def two_runs(tmp_path):
    return make_run(tmp_path, "a", A_ROWS), make_run(tmp_path, "b", B_ROWS)


def _cells(comparison) -> dict[tuple, dict]:
    return {(r["case"], r["impl"]): r for r in comparison.cells.to_dict("records")}


def test_same_kind_side_by_side_with_ratio_spreads_and_marks(two_runs):
    a, b = two_runs
    comparison = rc.compare_runs(rc.load_run(a, "RUN_A"), rc.load_run(b, "RUN_B"), 0.0)
    cells = _cells(comparison)
    assert set(cells) == {
        ("c1", "native"),
        ("c1", "fa3"),
        ("c1", "fp8"),
        ("c2", "native"),
        ("c2", "fa3"),
        ("c2", "fp8"),
        ("c3", "native"),
    }
    c = cells[("c1", "native")]
    assert (c["a_ms"], c["a_spread"], c["b_ms"], c["b_spread"]) == (1.0, 0.02, 1.1, 0.03)
    assert c["ratio"] == pytest.approx(1.1) and c["regression"] and not c["faster"]
    assert not cells[("c1", "fa3")]["regression"] and not cells[("c1", "fa3")]["faster"]
    assert cells[("c1", "fp8")]["regression"] and cells[("c2", "fp8")]["regression"]
    assert cells[("c2", "native")]["faster"] and not cells[("c2", "native")]["regression"]
    assert cells[("c2", "fa3")]["note"] == "B: error" and pd.isna(cells[("c2", "fa3")]["ratio"])
    assert cells[("c3", "native")]["note"] == "not in B" and cells[("c3", "native")]["a_ms"] == 3.0
    assert {c["noise_floor"] for c in cells.values()} == {0.0}
    s = comparison.summary()
    assert (s["compared"], s["regressions"], s["faster"], s["within_tolerance"]) == (5, 3, 1, 1)
    assert s["only_one_run"] == 2 and s["noise_floor"] == 0.0
    assert s["geomean_ratio"] == pytest.approx((1.1 * 1.04 * 1.08 * 0.9 * 1.03) ** 0.2)
    assert s["largest_ratio_cell"] == ["c1", "native"]


def test_a_cell_whose_kernel_changed_says_so(tmp_path):
    """Where both runs name the kernel a cell ran and the names differ, the mark says so beside
    the timing verdict, the cell carries both names, and the summary counts such cells; a run
    whose records have no kernel column changes nothing."""
    a_rows = [
        {**_row("c1", "native", 1.0, 0.01), "kernel": "register: 16 heads"},
        {**_row("c2", "native", 1.0, 0.01), "kernel": "64-head: 64 heads"},
        {**_row("c3", "native", 1.0, 0.01), "kernel": None},
    ]
    b_rows = [
        {**_row("c1", "native", 1.5, 0.01), "kernel": "warp-specialised: 16 heads"},
        {**_row("c2", "native", 1.0, 0.01), "kernel": "64-head: 64 heads"},
        {**_row("c3", "native", 1.0, 0.01), "kernel": "portable: 16 heads"},
    ]
    a, b = make_run(tmp_path, "a", a_rows), make_run(tmp_path, "b", b_rows)
    comparison = rc.compare_runs(rc.load_run(a, "RUN_A"), rc.load_run(b, "RUN_B"))
    cells = _cells(comparison)
    changed = cells[("c1", "native")]
    assert changed["kernel_changed"] and changed["b_kernel"] == "warp-specialised: 16 heads"
    assert [row[-1] for row in rc.table_rows(comparison)] == [
        "REGRESSION (kernel changed)",
        "",
        "",
    ]
    assert not cells[("c3", "native")]["kernel_changed"]  # A names none: nothing to compare
    assert comparison.summary()["kernel_changed"] == 1
    assert rc.summary_line(comparison).endswith("; 1 ran another kernel in B")
    same = rc.compare_runs(rc.load_run(a, "RUN_A"), rc.load_run(a, "RUN_A"))
    assert same.summary()["kernel_changed"] == 0 and "kernel" not in rc.summary_line(same)
    plain = make_run(tmp_path, "plain", [_row("c1", "native", 1.0, 0.01)])
    old = rc.compare_runs(rc.load_run(plain, "RUN_A"), rc.load_run(b, "RUN_B"))
    assert not _cells(old)[("c1", "native")]["kernel_changed"]


def test_the_default_noise_floor_unmarks_what_only_the_spreads_would_mark(two_runs):
    a, b = two_runs
    assert 0.03 < DEFAULT_NOISE_FLOOR < 0.08  # the premise of B_ROWS' comments
    comparison = rc.compare_runs(rc.load_run(a, "RUN_A"), rc.load_run(b, "RUN_B"))
    cells = _cells(comparison)
    assert cells[("c1", "native")]["regression"] and cells[("c1", "fp8")]["regression"]
    assert not cells[("c2", "fp8")]["regression"] and not cells[("c2", "fp8")]["faster"]
    assert cells[("c2", "native")]["faster"]
    assert {c["noise_floor"] for c in cells.values()} == {DEFAULT_NOISE_FLOOR}
    s = comparison.summary()
    assert (s["compared"], s["regressions"], s["faster"], s["within_tolerance"]) == (5, 2, 1, 2)
    assert s["noise_floor"] == DEFAULT_NOISE_FLOOR
    assert f"the {acceptance.noise_floor_pct(DEFAULT_NOISE_FLOOR)} noise floor" in rc.summary_line(
        comparison
    )


@pytest.mark.parametrize("floor", [0.0, DEFAULT_NOISE_FLOOR])
def test_swapping_the_runs_swaps_regression_and_faster(two_runs, floor):
    a, b = two_runs
    forward = _cells(rc.compare_runs(rc.load_run(a, "A"), rc.load_run(b, "B"), floor))
    back = _cells(rc.compare_runs(rc.load_run(b, "A"), rc.load_run(a, "B"), floor))
    both = [k for k, v in forward.items() if not pd.isna(v["ratio"])]
    assert both
    for key in both:
        assert forward[key]["regression"] == back[key]["faster"], key
        assert forward[key]["faster"] == back[key]["regression"], key
        assert back[key]["ratio"] == pytest.approx(1 / forward[key]["ratio"])
    assert back[("c3", "native")]["note"] == "not in A"


@pytest.mark.parametrize("floor", [0.0, 0.02, DEFAULT_NOISE_FLOOR])
def test_committed_h200_runs_match_an_independent_computation(floor):
    comparison = rc.compare_runs(rc.load_run(DECODE_A, "A"), rc.load_run(DECODE_B, "B"), floor)
    a, b = (pd.read_csv(p / "results.csv") for p in (DECODE_A, DECODE_B))
    timed = [df[df.median_ms.notna() & df.error.isna()] for df in (a, b)]
    both = timed[0].merge(timed[1], on=["case", "impl"], suffixes=("_a", "_b"))
    both["ratio"] = both.median_ms_b / both.median_ms_a
    tol = both[["spread_a", "spread_b"]].max(axis=1).map(lambda x: max(x, floor))
    expect_reg = set(map(tuple, both[both.ratio - 1 > tol][["case", "impl"]].values))
    expect_fast = set(map(tuple, both[1 / both.ratio - 1 > tol][["case", "impl"]].values))
    cells = comparison.cells
    assert len(cells) == len(both) and cells.ratio.notna().all()
    got = cells.set_index(["case", "impl"])
    merged = both.set_index(["case", "impl"])
    assert (got.ratio.reindex(merged.index) - merged.ratio).abs().max() < 1e-12
    assert set(got.index[got.regression]) == expect_reg
    assert set(got.index[got.faster]) == expect_fast
    if floor == 0.0:  # the spreads alone mark these same-kernel grids (README's point)
        assert len(expect_reg) + len(expect_fast) > 0
    assert comparison.differences() == []  # same GPU, driver, versions and config


def _same_code_grids() -> rc.Comparison:
    return rc.compare_runs(rc.load_run(SAME_A, "A"), rc.load_run(SAME_B, "B"))


def test_the_default_noise_floor_is_the_measured_same_code_difference_rounded_up():
    """DEFAULT_NOISE_FLOOR's comment, recomputed: the largest |B / A - 1| over the cells both
    grids timed, rounded up to the next percent."""
    both = _same_code_grids().cells.dropna(subset=["ratio"])
    assert len(both) == 319
    largest = float((both.ratio - 1).abs().max())
    assert largest == pytest.approx(0.0575, abs=5e-5)
    assert DEFAULT_NOISE_FLOOR == math.ceil(100 * largest) / 100 == 0.06
    # the within-run spreads (~1%) are what understates it
    assert both[["a_spread", "b_spread"]].median().max() < 0.01


def test_two_same_code_grids_mark_nothing_at_the_default_floor_and_much_at_spreads_alone():
    s = _same_code_grids().summary()
    assert (s["compared"], s["regressions"], s["faster"], s["within_tolerance"]) == (319, 0, 0, 319)
    alone = rc.compare_runs(rc.load_run(SAME_A, "A"), rc.load_run(SAME_B, "B"), 0.0).summary()
    assert (alone["regressions"], alone["faster"]) == (17, 104)  # what the floor is for


def _slowed_copy(run: Path, root: Path, factor: float) -> tuple[Path, tuple[str, str]]:
    """A copy of `run` with one timed native cell `factor` times slower."""
    copy = root / run.name
    shutil.copytree(run, copy)
    rows = pd.read_csv(copy / "results.csv")
    i = rows[(rows.impl == "native") & rows.median_ms.notna() & rows.error.isna()].index[0]
    rows.loc[i, "median_ms"] *= factor
    rows.to_csv(copy / "results.csv", index=False, float_format="%.17g")
    return copy, (rows.case[i], rows.impl[i])


def test_a_cell_half_again_slower_is_still_a_regression_at_the_default_floor(tmp_path):
    slowed, cell = _slowed_copy(SAME_B, tmp_path, 1.5)
    comparison = rc.compare_runs(rc.load_run(SAME_A, "A"), rc.load_run(slowed, "B"))
    marked = comparison.cells[comparison.cells.regression]
    assert [tuple(k) for k in marked[["case", "impl"]].values] == [cell]
    assert not comparison.cells.faster.any()
    back = rc.compare_runs(rc.load_run(slowed, "A"), rc.load_run(SAME_A, "B")).cells
    assert [tuple(k) for k in back[back.faster][["case", "impl"]].values] == [cell]


def test_noise_floor_0_is_the_spread_only_rule(two_runs):
    """--noise-floor 0 marks exactly what the larger of the two spreads alone marks."""
    a, b = two_runs
    for run_a, run_b in ((a, b), (SAME_A, SAME_B), (DECODE_A, DECODE_B)):
        cells = rc.compare_runs(rc.load_run(run_a, "A"), rc.load_run(run_b, "B"), 0.0).cells
        both = cells.dropna(subset=["ratio"])
        tol = both[["a_spread", "b_spread"]].max(axis=1)
        assert (both.regression == (both.ratio - 1 > tol)).all()
        assert (both.faster == (1 / both.ratio - 1 > tol)).all()
    proc = _cli(str(a), str(b), "--noise-floor", "0", "--json")
    assert proc.returncode == EXIT_CHECK_FAILED, proc.stderr
    data = json.loads(proc.stdout)
    assert data["summary"]["noise_floor"] == 0.0 and data["summary"]["regressions"] == 3
    assert {c["noise_floor"] for c in data["cells"]} == {0.0}


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
    assert data["summary"]["noise_floor"] == DEFAULT_NOISE_FLOOR
    marks = {(c["case"], c["impl"]): c["mark"] for c in data["cells"]}
    assert marks[("c1", "native")] == "REGRESSION" and marks[("c2", "native")] == "faster"
    assert marks[("c2", "fp8")] == ""  # within the floor
    assert "c1" in proc.stderr and "6% noise floor" in proc.stderr  # tables on stderr


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


@pytest.mark.parametrize("value", ["1", "1.5", "-0.01", "nan", "inf", "six"])
def test_a_bad_noise_floor_is_one_line_and_exit_2(two_runs, value):
    a, b = two_runs
    proc = _cli(str(a), str(b), "--noise-floor", value, "--json")
    assert proc.returncode == EXIT_USAGE and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("nopebench: error: ") and "--noise-floor" in line
    if value != "six":  # a number outside [0, 1): ours; not a number at all: click's
        assert "expected a fraction in [0, 1)" in line
    with pytest.raises(UsageError, match=r"^--noise-floor 1\.0: expected a fraction"):
        CompareOptions(a, b, noise_floor=1.0)


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
    assert len(cells) == 7 and int(cells.regression.sum()) == 2
    assert set(cells.noise_floor) == {DEFAULT_NOISE_FLOOR}
    before = out.read_bytes()
    with pytest.raises(UsageError, match="already exists"):
        compare_command.execute(CompareOptions(a, b, output=out))
    assert out.read_bytes() == before
    full = tmp_path / "all.json"
    compare_command.execute(CompareOptions(a, b, output=full, noise_floor=0.02))
    summary = json.loads(full.read_text())["summary"]
    assert summary["compared"] == 5 and summary["noise_floor"] == 0.02
    with pytest.raises(UsageError, match=r"\.csv"):
        compare_command.execute(CompareOptions(a, b, output=tmp_path / "cells.txt"))
    assert not (tmp_path / "cells.txt").exists()


# ---------------------------------------------------------------- report


def test_report_of_two_bench_decode_runs_has_the_comparison(tmp_path):
    slowed, cell = _slowed_copy(DECODE_B, tmp_path, 1.5)  # one regression beyond the floor
    path = build_report([DECODE_A, slowed], tmp_path / "two")
    text = path.read_text()
    assert "## Comparison of the two bench-decode runs" in text
    comparison = rc.compare_runs(rc.load_run(DECODE_A, "A"), rc.load_run(slowed, "B"))
    assert rc.summary_line(comparison) in text
    assert "the run-to-run noise floor of 6%" in text
    section = text.split("## Comparison of the two bench-decode runs", 1)[1]
    regressed = comparison.cells[comparison.cells.regression]
    assert [tuple(k) for k in regressed[["case", "impl"]].values] == [cell]
    for r in regressed.itertuples():
        line = next(x for x in section.splitlines() if x.startswith(f"| {r.case} | {r.impl} |"))
        assert line.rstrip().endswith("| REGRESSION |")
    single = build_report([DECODE_B], tmp_path / "one").read_text()
    assert "Comparison of the two" not in single
