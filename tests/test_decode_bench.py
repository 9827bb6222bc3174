"""bench-decode without a GPU: config, grid, the check-then-time runner with fakes at the device
boundary, the acceptance criteria, regressions and plots."""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd
import pytest
import torch
import yaml

from nopebench.bench import acceptance, decode_cases
from nopebench.bench import decode_runner as runner
from nopebench.bench.decode_cases import (
    BenchConfig,
    DecodeCase,
    build_cache,
    grid,
    load_bench_config,
    make_problem,
)
from nopebench.bench.timing import Ceilings, Timing
from nopebench.config import load_model_config, resolve_config_path
from nopebench.errors import UsageError
from nopebench.impls.interface import DecodeOutput, ImplSpec
from nopebench.impls.reference import reference_spec
from nopebench.plots import decode_plots

CEIL = Ceilings(copy_gbps=4000.0, matmul_tflops=700.0)
SHIPPED = load_bench_config("h200-nope").criteria
ONE_CELL = [c for c in SHIPPED if c.cell is not None]  # the criteria held at one cell each


def small_config(**kw) -> BenchConfig:
    base = load_bench_config("h200-nope")
    return base.model_copy(update={"cache_rows": 8192, "check_tokens": 8, **kw})


def test_shipped_config_grid():
    cfg = load_bench_config("h200-nope")
    cases = grid(cfg, quick=False)
    assert len(cases) == 4 * 5 * 2 * 2
    assert len({c.case_id for c in cases}) == len(cases)
    quick = grid(cfg, quick=True)
    assert {(c.heads, c.query_tokens, c.width, c.active) for c in quick} == {
        (16, 1, 2176, 2051),
        (16, 512, 2176, 2051),
        (64, 1, 2176, 2051),
        (64, 512, 2176, 2051),
    }


@pytest.mark.parametrize(
    "key, value, needle",
    [
        ("widths", [{"width": 2048, "active": 4096}], "exceeds width"),
        ("heads", [0, 16], "heads"),
        ("modes", ["rope"], "modes"),
        ("cache_rows", 12, "cache_rows"),
        ("surprise", 1, "unknown key 'surprise'"),
        ("timing", {"budget_s": "fast"}, "timing.budget_s"),
    ],
)
def test_bad_bench_configs_are_one_line(tmp_path, key, value, needle):
    data = yaml.safe_load(resolve_config_path("h200-nope", "bench").read_text())
    data[key] = value
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(UsageError) as err:
        load_bench_config(str(bad))
    assert needle in str(err.value) and "\n" not in str(err.value) and str(bad) in str(err.value)


def test_case_cost_model_matches_context_formulas():
    case = DecodeCase(heads=16, query_tokens=512, width=2176, active=2051, mode="nope")
    assert case.flops() == 2 * 512 * 16 * 2051 * (512 + 512)
    assert case.bytes() == 512 * 2051 * 528 + 512 * 16 * 512 * 2 * 2
    shim = replace(case, mode="shim")
    assert shim.row_bytes_read == 656 and shim.qk_dim == 576


def _fake_timing(calls, budget_s, min_samples, max_samples):
    for fn in calls:
        fn()
    return Timing(samples_ms=(1.0, 1.1, 0.9), calls_per_sample=1, graph=True)


def _spec(name, fn) -> ImplSpec:
    def prepare(problem):
        out = torch.empty(problem.tokens, problem.heads, 512, dtype=torch.bfloat16)

        def run():
            out.copy_(fn(problem))
            return DecodeOutput(out, None)

        return run

    return ImplSpec(name, name, lambda p: None, prepare)


def _run(monkeypatch, specs, mode="nope"):
    monkeypatch.setattr(runner, "time_gpu", _fake_timing)
    cfg = small_config()
    model = load_model_config("glm53-flash")
    case = DecodeCase(heads=16, query_tokens=4, width=256, active=200, mode=mode)
    cache, usable = build_cache(case.mode, cfg.cache_rows, 64, "arbitrary_fp32", "cpu")
    registry = {s.name: s for s in specs}
    return runner.run_case(
        case, cfg, model, cache, usable, registry, list(registry), CEIL, 0.01, None
    )


def _ref(problem):
    from nopebench.impls.reference import sparse_decode_reference

    return sparse_decode_reference(
        problem.q, problem.cache, problem.indices, problem.softmax_scale, problem.rope_dim
    )[0]


def test_runner_checks_then_times_and_rejects_wrong_kernels(monkeypatch):
    def ignores_padding(problem):  # treats -1 as slot 0: the bug the -1 padding check exists for
        return _ref(replace(problem, indices=problem.indices.clamp_min(0)))

    def leaves_rows_unwritten(problem):
        out = _ref(problem)
        out[-1] = math.nan  # a real kernel would leave whatever the poison was
        return out

    refused = ImplSpec(
        "refused", "x", lambda p: "refused needs an SM120/SM121 GPU (this is CPU)", lambda p: None
    )
    rows = _run(
        monkeypatch,
        [
            reference_spec(),
            _spec("good", _ref),
            _spec("pad-bug", ignores_padding),
            _spec("unwritten", leaves_rows_unwritten),
            refused,
        ],
    )
    by = {r["impl"]: r for r in rows}
    assert by["reference"]["passed"] and by["reference"]["median_ms"] == 1.0
    assert by["good"]["passed_strict"] and by["good"]["accuracy_class"] == "strict"
    assert by["good"]["passed"] and by["good"]["error"] is None and by["good"]["pct_roofline"] > 0
    assert not by["pad-bug"]["passed"] and "correctness check failed" in by["pad-bug"]["error"]
    assert "median_ms" not in by["pad-bug"]  # a failed check is never timed
    assert not by["unwritten"]["passed"]
    assert by["refused"]["skipped"].startswith("refused needs")


def test_runner_records_the_kernel_an_implementation_names(monkeypatch):
    """A spec's kernel(problem) lands in its row (the problem's own shape); a spec without one,
    or a refused one, leaves the column empty; a kernel() that raises is the row's error."""
    named = replace(_spec("named", _ref), kernel=lambda p: f"{p.heads} heads, width {p.width}")

    def broken(problem):
        raise ValueError("no plan for this shape")

    refused = ImplSpec("refused", "x", lambda p: "no GPU", lambda p: None, kernel=broken)
    rows = _run(
        monkeypatch,
        [named, _spec("plain", _ref), refused, replace(_spec("broken", _ref), kernel=broken)],
    )
    by = {r["impl"]: r for r in rows}
    assert by["named"]["kernel"] == "16 heads, width 256" and by["named"]["passed"]
    assert by["plain"]["kernel"] is None and by["plain"]["passed"]
    assert by["refused"]["kernel"] is None and by["refused"]["skipped"] == "no GPU"
    assert by["broken"]["error"] == "ValueError: no plan for this shape"
    assert "median_ms" not in by["broken"]


def test_runner_shim_mode_uses_zero_rope_lanes(monkeypatch):
    rows = _run(monkeypatch, [reference_spec()], mode="shim")
    assert rows[0]["passed"] and rows[0]["row_bytes"] == 656


def test_make_problem_is_fresh_per_set_and_poison_is_never_indexed():
    cfg = small_config()
    model = load_model_config("glm53-flash")
    case = DecodeCase(heads=16, query_tokens=3, width=256, active=200, mode="nope")
    cache, usable = build_cache(case.mode, cfg.cache_rows, 64, "arbitrary_fp32", "cpu")
    a, b = make_problem(case, cache, usable, model, 0), make_problem(case, cache, usable, model, 1)
    assert not torch.equal(a.q, b.q) and not torch.equal(a.indices, b.indices)
    assert int(a.indices.max()) < usable and bool((a.indices[:, 200:] == -1).all())
    assert bool((cache.view(-1, 528)[usable:] == 0xFF).all())  # the poison rows really are poison


def _cell_row(impl, mode, heads, tokens, ms, roof=50.0):
    """One timed, passed bench-decode record at width 2176 with 2051 active."""
    return {
        "case": f"h{heads}-t{tokens}-{mode}",
        "impl": impl,
        "mode": mode,
        "heads": heads,
        "query_tokens": tokens,
        "width": 2176,
        "active": 2051,
        "median_ms": ms,
        "spread": 0.02,
        "error": None,
        "skipped": None,
        "passed": True,
        "pct_roofline": roof,
    }


def _rows(
    native16=0.28,
    bf16_16=0.30,
    fp8_16=1.6,
    shim16=0.33,
    native64=0.40,
    bf16_64=0.345,
    fp8_64=1.65,
    shim64=0.43,
    n1=0.012,
    b1=0.020,
    n1_64=0.02,
    b1_64=0.021,
):
    data = []
    for impl, mode, h, t, ms in [
        ("native", "nope", 16, 512, native16),
        ("flashinfer-fa3-bf16", "nope", 16, 512, bf16_16),
        ("flashinfer-fa3-fp8", "nope", 16, 512, fp8_16),
        ("native", "shim", 16, 512, shim16),
        ("native", "nope", 64, 512, native64),
        ("flashinfer-fa3-bf16", "nope", 64, 512, bf16_64),
        ("flashinfer-fa3-fp8", "nope", 64, 512, fp8_64),
        ("native", "shim", 64, 512, shim64),
        ("native", "nope", 16, 1, n1),
        ("flashinfer-fa3-bf16", "nope", 16, 1, b1),
        ("native", "nope", 64, 1, n1_64),
        ("flashinfer-fa3-bf16", "nope", 64, 1, b1_64),
    ]:
        data.append(_cell_row(impl, mode, h, t, ms))
    return pd.DataFrame(data)


def test_shipped_criteria_pass_and_fail_on_their_thresholds():
    assert all(c.passed for c in acceptance.criteria(_rows(), ONE_CELL))
    slow = {c.name: c for c in acceptance.criteria(_rows(native16=0.31), SHIPPED)}
    assert not slow["H=16: native NoPE at least as fast as fa3 bf16 NoPE (fa3 / native)"].passed
    within = {c.name: c for c in acceptance.criteria(_rows(native64=0.345 * 1.3), SHIPPED)}
    assert not within["H=64: native NoPE within 1.25x of fa3 bf16 NoPE (fa3 / native)"].passed
    shim = {c.name: c for c in acceptance.criteria(_rows(shim16=0.28 * 1.1), SHIPPED)}
    assert not shim["H=16: native NoPE vs native shim (shim / NoPE)"].passed


def test_criteria_flag_a_verdict_inside_the_measured_spread_without_changing_it():
    """Each cell's spread is 2%, so a ratio's band is 4%: 0.295 against 0.293 ms (0.993x) fails
    the H=16 criterion but is flagged as within the spread; 0.31 (0.945x) is not."""
    tie = {c.name: c for c in acceptance.criteria(_rows(native16=0.295, bf16_16=0.293), SHIPPED)}
    h16 = tie["H=16: native NoPE at least as fast as fa3 bf16 NoPE (fa3 / native)"]
    assert h16.passed is False and h16.within_spread and h16.spread == pytest.approx(0.04)
    assert h16.as_row()["within_spread"] is True and acceptance.spread_band(h16) == "±4.0%"
    clear = {c.name: c for c in acceptance.criteria(_rows(native16=0.31, bf16_16=0.293), SHIPPED)}
    assert not clear[
        "H=16: native NoPE at least as fast as fa3 bf16 NoPE (fa3 / native)"
    ].within_spread
    just_over = {
        c.name: c for c in acceptance.criteria(_rows(native16=0.291, bf16_16=0.293), SHIPPED)
    }
    assert just_over["H=16: native NoPE at least as fast as fa3 bf16 NoPE (fa3 / native)"].passed
    assert just_over[
        "H=16: native NoPE at least as fast as fa3 bf16 NoPE (fa3 / native)"
    ].within_spread
    failures = tie["every case that ran passed its correctness check (failures)"]
    assert (
        failures.spread is None
        and not failures.within_spread
        and acceptance.spread_band(failures) == "-"
    )


def test_criteria_missing_implementation_is_not_measurable_and_failures_count():
    rows = _rows()
    rows = rows[rows.impl != "flashinfer-fa3-fp8"].copy()
    rows.loc[0, "passed"] = False
    crit = {c.name: c for c in acceptance.criteria(rows, SHIPPED)}
    assert crit["H=16: native NoPE vs fa3 fp8 (fa3 fp8 / native)"].passed is None
    assert crit["every case that ran passed its correctness check (failures)"].measured == 1.0


def test_nope_speedup_and_regressions():
    rows = _rows()
    sp = acceptance.nope_answer(rows)
    row = sp[(sp.impl == "native") & (sp.heads == 16) & (sp.query_tokens == 512)].iloc[0]
    assert row.vs_own_shim == pytest.approx(0.33 / 0.28)
    slower = _rows(native16=0.28 * 1.10, native64=0.40 * 1.01, n1=0.012 * 1.04)

    def flagged(noise_floor: float) -> set[str]:
        marked = acceptance.mark_regressions(slower, rows, noise_floor)
        assert set(marked.noise_floor) == {noise_floor}
        return set(marked[marked.regression].case + "/" + marked[marked.regression].impl)

    # spreads alone: 10% and 4% beyond a 2% spread; 1% is inside it
    assert flagged(0.0) == {"h16-t512-nope/native", "h16-t1-nope/native"}
    # a 6% floor: 10% beyond it, 4% and 1% inside
    assert flagged(0.06) == {"h16-t512-nope/native"}
    # a run marked against a baseline can be marked again (its old marks replaced)
    again = acceptance.mark_regressions(acceptance.mark_regressions(slower, rows, 0.0), rows, 0.06)
    assert set(again[again.regression].case) == {"h16-t512-nope"}


def test_plots_render(tmp_path):
    paths = decode_plots(_rows(), tmp_path)
    assert [p.name for p in paths] == [
        "decode_latency.png",
        "decode_roofline.png",
        "decode_vs_fastest_other.png",
    ]
    assert all(p.stat().st_size > 1000 for p in paths)
    alone = _rows()[lambda d: d.impl == "native"]  # nothing to compare with: no heatmap
    assert [p.name for p in decode_plots(alone, tmp_path)][-1] == "decode_roofline.png"


def test_vs_fastest_other_takes_the_fastest_peer_per_mode_and_cell():
    rows = pd.concat(
        [
            _rows(),
            pd.DataFrame(
                [
                    _cell_row("flashmla", "nope", 16, 1, 0.010),  # faster than fa3's 0.020
                    _cell_row("reference", "nope", 64, 512, 0.001),  # the reference is no peer
                    _cell_row("flashmla", "shim", 16, 512, 0.45),
                ]
            ),
        ],
        ignore_index=True,
    )
    got = acceptance.vs_fastest_other(rows, "native").set_index(["mode", "heads", "query_tokens"])
    assert got.loc[("nope", 16, 512)].other == "flashinfer-fa3-bf16"
    assert got.loc[("nope", 16, 512)].ratio == pytest.approx(0.30 / 0.28)
    assert got.loc[("nope", 16, 1)].other == "flashmla"
    assert got.loc[("nope", 16, 1)].ratio == pytest.approx(0.010 / 0.012)
    assert got.loc[("nope", 64, 512)].other == "flashinfer-fa3-bf16"
    assert got.loc[("shim", 16, 512)].ratio == pytest.approx(0.45 / 0.33)
    assert ("shim", 64, 512) not in got.index  # no other implementation ran the shim there
    assert acceptance.vs_fastest_other(rows, "flashmal").empty


# --- criteria as data ---------------------------------------------------------------------------


def test_shipped_criteria_are_the_targets_the_harness_held_before_they_became_data():
    """(name, subject, baseline, heads, tokens, min_speedup), all at width 2176 with 2051 active."""
    fa3, fp8 = "flashinfer-fa3-bf16", "flashinfer-fa3-fp8"
    expected = [
        (
            "H=16: native NoPE at least as fast as fa3 bf16 NoPE (fa3 / native)",
            fa3,
            "nope",
            16,
            512,
            1.0,
        ),
        ("H=16: native NoPE vs fa3 fp8 (fa3 fp8 / native)", fp8, "nope", 16, 512, 5.0),
        ("H=16: native NoPE vs native shim (shim / NoPE)", "native", "shim", 16, 512, 1.15),
        (
            "H=64: native NoPE within 1.25x of fa3 bf16 NoPE (fa3 / native)",
            fa3,
            "nope",
            64,
            512,
            0.8,
        ),
        ("H=64: native NoPE vs fa3 fp8 (fa3 fp8 / native)", fp8, "nope", 64, 512, 4.0),
        ("H=64: native NoPE vs native shim (shim / NoPE)", "native", "shim", 64, 512, 1.05),
        ("H=16, 1 token: native no slower than fa3 bf16 (fa3 / native)", fa3, "nope", 16, 1, 1.0),
        ("H=64, 1 token: native no slower than fa3 bf16 (fa3 / native)", fa3, "nope", 64, 1, 1.0),
    ]
    got = [
        (c.name, c.baseline.impl, c.baseline.mode, c.cell.heads, c.cell.tokens, c.min_speedup)
        for c in ONE_CELL
    ]
    assert got == expected
    assert all(
        (c.subject.impl, c.subject.mode, c.cell.width, c.cell.active)
        == ("native", "nope", 2176, 2051)
        for c in ONE_CELL
    )


def test_shipped_grid_wide_criteria_are_the_native_kernels_targets():
    """(subject mode, baseline implementations and mode, selection, target) of each criterion
    over several cells: at least as fast as FlashMLA and 0.9x of the fastest peer for NoPE,
    0.9x of FlashMLA for the shim, 60% of the roofline at 512 tokens."""
    peers = ["flashmla", "flashinfer-fa3-bf16", "flashinfer-fa3-fp8"]
    got = [
        (
            c.subject.mode,
            c.baseline.impls() if c.baseline else None,
            c.baseline.mode if c.baseline else None,
            c.scope(),
            c.min_speedup or c.min_pct_roofline,
        )
        for c in SHIPPED
        if c.cells is not None
    ]
    assert got == [
        ("nope", ["flashmla"], "nope", "every cell", 1.0),
        ("nope", peers, "nope", "every cell", 0.9),
        ("shim", ["flashmla"], "shim", "every cell", 0.9),
        ("nope", None, None, "every cell at T=512", 60),
    ]
    assert all(c.subject.impl == "native" for c in SHIPPED)


def _config_with(tmp_path, **changes) -> str:
    data = yaml.safe_load(resolve_config_path("h200-nope", "bench").read_text())
    data.update(changes)
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


FLASHMLA_VS_NATIVE_SHIM = {
    "name": "H=16: FlashMLA's shim against the native shim",
    "subject": {"impl": "flashmla", "mode": "shim"},
    "baseline": {"impl": "native", "mode": "shim"},
    "cell": {"heads": 16, "tokens": 512, "width": 2176, "active": 2051},
    "min_speedup": 1,  # an integer in YAML is a number too
}


def test_a_criterion_written_in_yaml_is_evaluated(tmp_path):
    cfg = load_bench_config(_config_with(tmp_path, criteria=[FLASHMLA_VS_NATIVE_SHIM]))
    (spec,) = cfg.criteria
    rows = _rows()
    flashmla_shim = rows[(rows.impl == "native") & (rows["mode"] == "shim") & (rows.heads == 16)]
    rows = pd.concat([rows, flashmla_shim.assign(impl="flashmla", median_ms=0.30)])
    crit = acceptance.criteria(rows, cfg.criteria)
    assert [c.name for c in crit] == [
        spec.name,
        "every case that ran passed its correctness check (failures)",
    ]
    assert crit[0].measured == pytest.approx(0.33 / 0.30) and crit[0].passed
    assert crit[0].target == ">= 1.00" and crit[0].cell == "H=16 T=512 W=2176 (2051 active)"
    slower = acceptance.criteria(
        rows.assign(median_ms=rows.median_ms.where(rows.impl != "flashmla", 0.40)), cfg.criteria
    )
    assert slower[0].passed is False and slower[0].measured == pytest.approx(0.33 / 0.40)
    without = acceptance.criteria(rows[rows.impl != "flashmla"], cfg.criteria)
    assert without[0].passed is None and without[0].measured is None


def test_a_criterion_over_every_cell_holds_only_where_each_cell_does(tmp_path):
    """Against the fastest of two peers per cell: fa3 at 16 x 512 (1.07x) and 64 x 512 (0.86x),
    FlashMLA at 16 x 1 (0.83x), both at 64 x 1 (fa3's 1.05x): two of four cells fail, and the
    criterion reads its worst, 16 x 1."""
    spec = {
        "name": "native NoPE within 0.9x of the fastest peer, every cell",
        "subject": {"impl": "native", "mode": "nope"},
        "baseline": {"fastest_of": ["flashmla", "flashinfer-fa3-bf16"], "mode": "nope"},
        "cells": {},
        "min_speedup": 0.9,
    }
    times = {
        (16, 512): {"native": 0.28, "flashmla": 0.45, "flashinfer-fa3-bf16": 0.30},
        (64, 512): {"native": 0.40, "flashmla": 0.45, "flashinfer-fa3-bf16": 0.345},
        (16, 1): {"native": 0.012, "flashmla": 0.010, "flashinfer-fa3-bf16": 0.020},
        (64, 1): {"native": 0.02, "flashmla": 0.03, "flashinfer-fa3-bf16": 0.021},
    }
    rows = pd.DataFrame(
        [
            _cell_row(impl, "nope", h, t, ms)
            for (h, t), by_impl in times.items()
            for impl, ms in by_impl.items()
        ]
    )
    cfg = load_bench_config(_config_with(tmp_path, criteria=[spec]))
    crit = acceptance.criteria(rows, cfg.criteria)[0]
    assert crit.passed is False and crit.measured == pytest.approx(0.010 / 0.012)
    assert crit.cell == "H=16 T=1 W=2176 (2051 active)" and crit.spread == pytest.approx(0.04)
    assert crit.where() == "every cell (worst: H=16 T=1 W=2176 (2051 active))"
    assert crit.cells_note() == "2 of 4 cells fail"
    assert [r.cell for r in crit.failing] == [
        "H=64 T=512 W=2176 (2051 active)",
        "H=16 T=1 W=2176 (2051 active)",
    ]
    assert [round(r.measured, 4) for r in crit.per_cell] == [
        round(0.30 / 0.28, 4),
        round(0.345 / 0.40, 4),
        round(0.010 / 0.012, 4),
        round(0.021 / 0.02, 4),
    ]
    assert crit.as_row()["cells"] == 4 and crit.as_row()["failing_cells"] == 2
    cells = crit.cell_rows()
    assert [list(r) for r in cells] == [acceptance.CELL_ROW_COLUMNS] * 4
    assert [r["passed"] for r in cells] == [True, False, False, True]

    # A cell where one of the peers was not timed is not measured (its fastest is not known): a
    # failing cell still decides, but with none failing the criterion is left open.
    gap = rows[~((rows.heads == 64) & (rows.query_tokens == 1) & (rows.impl == "flashmla"))]
    crit = acceptance.criteria(
        gap, load_bench_config(_config_with(tmp_path, criteria=[spec])).criteria
    )[0]
    assert crit.passed is False and crit.cells_note() == "2 of 3 cells fail, 1 not measured"
    assert crit.as_row()["unmeasured_cells"] == 1
    quick = gap.assign(median_ms=gap.median_ms.where(gap.impl != "native", 0.001))
    crit = acceptance.criteria(
        quick, load_bench_config(_config_with(tmp_path, criteria=[spec])).criteria
    )[0]
    assert crit.passed is None and crit.cells_note() == "0 of 3 cells fail, 1 not measured"

    at_512 = {**spec, "cells": {"tokens": 512}}
    cfg = load_bench_config(_config_with(tmp_path, criteria=[at_512]))
    crit = acceptance.criteria(rows, cfg.criteria)[0]
    assert crit.cells_note() == "1 of 2 cells fail" and crit.cell.startswith("H=64 T=512")
    faster = rows.assign(median_ms=rows.median_ms.where(rows.impl != "native", 0.001))
    assert acceptance.criteria(faster, cfg.criteria)[0].passed is True
    no_peer = rows[rows.impl == "native"]
    unmeasured = acceptance.criteria(no_peer, cfg.criteria)[0]
    assert unmeasured.passed is None and unmeasured.where() == "every cell at T=512"


def test_a_roofline_criterion_reads_the_subjects_share_of_the_roofline(tmp_path):
    spec = {
        "name": "native NoPE at 60% of the roofline at 512 tokens",
        "subject": {"impl": "native", "mode": "nope"},
        "cells": {"tokens": 512},
        "min_pct_roofline": 60,
    }
    cfg = load_bench_config(_config_with(tmp_path, criteria=[spec]))
    rows = pd.DataFrame(
        [
            _cell_row("native", "nope", 16, 512, 0.28, roof=62.0),
            _cell_row("native", "nope", 64, 512, 0.40, roof=55.0),
            _cell_row("native", "nope", 64, 1, 0.02, roof=5.0),  # not selected
            _cell_row("flashinfer-fa3-bf16", "nope", 64, 512, 0.3, roof=75.0),  # not the subject
        ]
    )
    crit = acceptance.criteria(rows, cfg.criteria)[0]
    assert crit.passed is False and crit.measured == 55.0 and crit.cell.startswith("H=64 T=512")
    assert crit.target == ">= 60% of roofline" and crit.cells_note() == "1 of 2 cells fail"
    assert not crit.within_spread  # 55 / 60 is 8% off, beyond the cell's 2% spread
    near = rows.assign(pct_roofline=rows.pct_roofline.where(rows.heads != 64, 59.0))
    crit = acceptance.criteria(near, cfg.criteria)[0]
    assert crit.passed is False and crit.within_spread  # 59 / 60: 1.7%, within 2%
    both = rows.assign(pct_roofline=60.0)
    assert acceptance.criteria(both, cfg.criteria)[0].passed is True
    unknown = acceptance.criteria(rows.drop(columns="pct_roofline"), cfg.criteria)[0]
    assert unknown.passed is None and unknown.measured is None


def _with(**change):
    crit = {**FLASHMLA_VS_NATIVE_SHIM, **change}
    return [crit]


@pytest.mark.parametrize(
    "changes, needle",
    [
        (
            {"criteria": _with(subject={"impl": "flashmal", "mode": "shim"})},
            "subject impl 'flashmal' is not an implementation",
        ),
        (
            {"criteria": _with(baseline={"impl": "native", "mode": "nope-pool"})},
            "baseline mode 'nope-pool' is not one of the config's modes",
        ),
        (
            {"criteria": _with(baseline={"impl": "native", "mode": "rope"})},
            "criteria.0.baseline.mode",
        ),
        (
            {"criteria": _with(cell={"heads": 24, "tokens": 512, "width": 2176, "active": 2051})},
            "cell H=24 T=512 W=2176 (2051 active) is not in the config's grid",
        ),
        (
            {"criteria": _with(cell={"heads": 16, "tokens": 512, "width": 2176, "active": 2048})},
            "is not in the config's grid",
        ),
        ({"criteria": _with(min_speedup=0)}, "criteria.0.min_speedup"),
        ({"criteria": _with(min_speedup="fast")}, "criteria.0.min_speedup"),
        (
            {"criteria": [{k: v for k, v in FLASHMLA_VS_NATIVE_SHIM.items() if k != "cell"}]},
            "give exactly one of cell (one point) or cells (a selection)",
        ),
        (
            {"criteria": _with(cells={"tokens": 512})},
            "give exactly one of cell (one point) or cells (a selection)",
        ),
        (
            {"criteria": _with(cell=None, cells={"heads": 24})},
            "the config's grid has no cell at H=24",
        ),
        (
            {"criteria": _with(cell=None, cells={"width": 2176, "active": 2048})},
            "the config's grid has no cell at W=2176 active=2048",
        ),
        ({"criteria": _with(cell=None, cells={"rows": 1})}, "unknown key 'criteria.0.cells.rows'"),
        (
            {"criteria": _with(baseline={"fastest_of": ["native", "flashmal"], "mode": "shim"})},
            "baseline impl 'flashmal' is not an implementation",
        ),
        (
            {
                "criteria": _with(
                    baseline={"impl": "native", "fastest_of": ["flashmla"], "mode": "shim"}
                )
            },
            "give exactly one of impl or fastest_of",
        ),
        (
            {"criteria": _with(subject={"fastest_of": ["native"], "mode": "shim"})},
            "the subject is one implementation (impl)",
        ),
        (
            {"criteria": _with(min_pct_roofline=60)},
            "give either baseline and min_speedup, or min_pct_roofline",
        ),
        (
            {"criteria": _with(baseline=None)},
            "a ratio criterion needs both baseline and min_speedup",
        ),
        (
            {"criteria": _with(baseline=None, min_speedup=None, min_pct_roofline=101)},
            "criteria.0.min_pct_roofline",
        ),
        ({"criteria": _with(faster="x")}, "unknown key 'criteria.0.faster'"),
        ({"criteria": _with() + _with()}, "another criterion has this name"),
        ({"version": 1}, "version = 1: this nopebench reads bench config version 2"),
        (
            {"widths": [{"width": 2176, "active": 2051}, {"width": 2176, "active": 2048}]},
            "lists width 2176 more than once",
        ),
    ],
)
def test_bad_criteria_are_refused_in_one_line(tmp_path, changes, needle):
    path = _config_with(tmp_path, **changes)
    with pytest.raises(UsageError) as err:
        load_bench_config(path)
    assert needle in str(err.value) and "\n" not in str(err.value) and path in str(err.value)


# --- case selection -----------------------------------------------------------------------------


def test_filters_select_the_product_of_their_values():
    cases = grid(load_bench_config("h200-nope"), quick=False)
    assert decode_cases.select_cases(cases) == cases
    picked = decode_cases.select_cases(cases, heads=(16, 64), tokens=(512,), modes=("shim",))
    assert {(c.heads, c.query_tokens, c.width, c.mode) for c in picked} == {
        (h, 512, w, "shim") for h in (16, 64) for w in (2048, 2176)
    }
    (one,) = decode_cases.select_cases(cases, (128,), (8,), (2048,), ("nope",))
    assert one.case_id == "h128-t8-w2048a2048-nope"


@pytest.mark.parametrize(
    "filters, needle",
    [
        (
            {"heads": (16, 24)},
            "--heads 24 matches no case of h200-nope (its heads: 16, 32, 64, 128)",
        ),
        (
            {"tokens": (2,)},
            "--tokens 2 matches no case of h200-nope (its query tokens: 1, 8, 64, 128, 512)",
        ),
        ({"widths": (2051,)}, "--width 2051 matches no case of h200-nope (its width: 2048, 2176)"),
        (
            {"modes": ("nope-pool",)},
            "--mode nope-pool matches no case of h200-nope (its mode: nope, shim)",
        ),
    ],
)
def test_a_filter_that_matches_nothing_is_one_line(filters, needle):
    cases = grid(load_bench_config("h200-nope"), quick=False)
    with pytest.raises(UsageError) as err:
        decode_cases.select_cases(cases, grid_name="h200-nope", **filters)
    assert str(err.value) == needle


# --- the NoPE answer ----------------------------------------------------------------------------


def _answer_rows():
    """One cell (H=16, 512 tokens, 2176/2051): native NoPE 0.28 and shim 0.33, FlashMLA's shim
    0.47 (and its NoPE, run as the shim, 0.47), fa3 bf16 NoPE 0.30 and shim 0.31 (a bound: no
    serving backend), fa3 fp8 NoPE 1.6."""
    rows = _rows()
    rows = rows[(rows.heads == 16) & (rows.query_tokens == 512)].copy()
    backend = {
        "flashmla": "vLLM FLASHMLA_SPARSE",
        "flashinfer-fa3-fp8": "vLLM FLASHINFER_MLA_SPARSE_SM90 (its kernel)",
    }
    extra = rows.iloc[:1].copy()
    more = pd.concat(
        [
            extra.assign(impl="flashmla", mode="nope", median_ms=0.47),
            extra.assign(impl="flashmla", mode="shim", median_ms=0.47),
            extra.assign(impl="flashinfer-fa3-bf16", mode="shim", median_ms=0.31),
            extra.assign(
                impl="flashinfer-sm120", mode="nope", median_ms=float("nan"), skipped="needs SM120"
            ),
        ]
    )
    rows = pd.concat([rows, more], ignore_index=True)
    rows["serving_backend"] = rows.impl.map(backend)
    return rows


def test_nope_answer_against_the_best_shim_and_the_best_deployable_path():
    answer = acceptance.nope_answer(_answer_rows()).set_index("impl")
    assert set(answer.index) == {"native", "flashinfer-fa3-bf16", "flashinfer-fa3-fp8", "flashmla"}
    native = answer.loc["native"]
    assert native.best_shim == "flashinfer-fa3-bf16" and native.best_shim_ms == 0.31
    assert native.vs_best_shim == pytest.approx(0.31 / 0.28)
    # fa3 bf16 is a bound (no serving backend): the best deployable path is FlashMLA's, not fa3's
    assert native.best_deployable == "flashmla nope" and native.best_deployable_ms == 0.47
    assert native.vs_best_deployable == pytest.approx(0.47 / 0.28)
    assert native.own_shim_ms == 0.33 and native.vs_own_shim == pytest.approx(0.33 / 0.28)
    fp8 = answer.loc["flashinfer-fa3-fp8"]
    assert pd.isna(fp8.own_shim_ms) and fp8.vs_best_deployable == pytest.approx(0.47 / 1.6)
    assert answer.loc["flashmla"].vs_own_shim == pytest.approx(1.0)


def test_nope_answer_of_a_run_without_nope_rows_is_empty():
    rows = _answer_rows()
    assert acceptance.nope_answer(rows[rows["mode"] == "shim"]).empty


# --- accuracy classes ---------------------------------------------------------------------------


def test_each_implementation_is_held_to_its_own_class_and_the_row_says_which(monkeypatch):
    """A kernel whose output is off by a little more than the strict cosine bound fails strict
    but passes a class that allows it; the row records the class that was applied."""
    from nopebench.impls.interface import STRICT, Tolerance

    def slightly_off(problem):
        out = _ref(problem).float()
        noise = torch.randn(out.shape, generator=torch.Generator().manual_seed(0))
        return (out * (1 + 4e-3 * noise)).to(torch.bfloat16)

    loose = Tolerance(1e-3, 2 / 128, 1e-4, "test", max_mismatch=0.5, name="loose")
    strict_spec = _spec("strict-peer", slightly_off)
    loose_spec = replace(_spec("loose-peer", slightly_off), tolerance=loose)
    by = {r["impl"]: r for r in _run(monkeypatch, [strict_spec, loose_spec])}
    assert by["strict-peer"]["accuracy_class"] == STRICT.name and not by["strict-peer"]["passed"]
    assert by["loose-peer"]["accuracy_class"] == "loose" and by["loose-peer"]["passed"]
    assert (
        by["loose-peer"]["passed_strict"] is False and by["strict-peer"]["passed_strict"] is False
    )
    assert by["loose-peer"]["cos_diff"] > STRICT.cos_tol and "median_ms" in by["loose-peer"]
    assert by["loose-peer"]["accuracy_rule"] == loose.rule()
    assert by["loose-peer"]["library"] == "torch"
