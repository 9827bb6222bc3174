"""`check-pagetable` end to end on CPU, and that its checks go red for the bugs they target."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest
import torch

from nopebench.checks import pagetable
from nopebench.commands import check_pagetable
from nopebench.commands.options import CheckPagetableOptions, Output
from nopebench.config import load_model_config
from nopebench.errors import EXIT_CHECK_FAILED, EXIT_OK, UsageError
from nopebench.impls import metadata
from nopebench.impls.interface import DecodeOutput, ImplSpec
from nopebench.impls.reference import reference_spec, sparse_decode_reference
from nopebench.records import read_run

GLM53 = load_model_config("glm53-flash")


def only_run_dir(root):
    (path,) = (root / "check-pagetable").iterdir()
    return path


def test_command_passes_and_records_everything(tmp_path, capsys):
    code = check_pagetable.execute(CheckPagetableOptions("glm53-flash", 0, Output(tmp_path, True)))
    assert code == EXIT_OK
    run = only_run_dir(tmp_path)
    assert read_run(run)["status"] == "passed"
    rows = pd.read_csv(run / "checks.csv").to_dict("records")
    by_check = {}
    for r in rows:
        by_check.setdefault(r["check"], []).append(r)
    assert {r["result"] for r in rows} <= {"passed", "skipped"}
    graph = {r["result"] for r in by_check["cuda-graph-capture"]}
    if torch.cuda.is_available():
        assert "passed" in graph
    else:
        assert graph == {"skipped"}
    assert [r["result"] for r in by_check["padding-bounds-active"] if r["impl"] == "reference"] == [
        "passed"
    ]
    validation = by_check["flashinfer-sm120-validation"]
    assert {(r["layout"], r["sizing"], r["sparse_mla_top_k"]) for r in validation} == {
        ("GLM53_NOPE", "fixed", 2176),
        ("GLM53_NOPE", "pre-fix", 2048),
        ("GLM_NSA shim", "fixed", 2176),
        ("GLM_NSA shim", "pre-fix", 2048),
    }
    prefix = [r for r in validation if r["sizing"] == "pre-fix"]
    assert all(
        "expects sparse block_tables shape (512, 1, 2048), got (512, 1, 2176)" in r["detail"]
        for r in prefix
    )
    assert all(r["run_id"] == run.name for r in rows)
    widths = pd.read_csv(run / "widths.csv")
    assert len(widths) == 9 and set(widths["width"]) == {512, 640, 1024, 1152, 2048, 2176}
    payload = json.loads((run / "checks.json").read_text())
    assert payload["summary"]["failed"] == 0 and payload["summary"]["topk_width"] == 2176
    printed = capsys.readouterr().out
    assert json.loads(printed[printed.index("[\n") :])[0]["check"] == "buffer-width"


def test_command_fails_when_the_backend_sizes_by_index_topk(tmp_path, monkeypatch):
    """Reintroduce the upstream bug in the sizing function: the command must exit 1."""

    def pre_fix(buffer):
        width = buffer if isinstance(buffer, int) else int(buffer.shape[1])
        return metadata.PageTableSizing("fixed", width, GLM53.index_topk, GLM53.index_topk)

    monkeypatch.setattr(metadata, "sizing_from_buffer", pre_fix)
    assert (
        check_pagetable.execute(CheckPagetableOptions("glm53-flash", 0, Output(tmp_path, False)))
        == EXIT_CHECK_FAILED
    )
    rows = pd.read_csv(only_run_dir(tmp_path) / "checks.csv")
    failed = set(rows[rows["result"] == "failed"]["check"])
    assert {"sizing", "flashinfer-sm120-validation"} <= failed


def test_bad_model_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError):
        check_pagetable.execute(CheckPagetableOptions("no-such-model", 0, Output(tmp_path, False)))
    assert not (tmp_path / "check-pagetable").exists()


def test_dsv32_model_passes_too(tmp_path):
    assert (
        check_pagetable.execute(CheckPagetableOptions("dsv32", 0, Output(tmp_path, False)))
        == EXIT_OK
    )


# --- the problem builder and the padding checks --------------------------------------------------


def small_case(**changes):
    return dataclasses.replace(pagetable.model_case(GLM53, 6, 0), **changes)


def test_built_problem_has_the_widened_layout():
    case = small_case()
    problem = pagetable.build_problem(case, torch.device("cpu"))
    counts = metadata.valid_counts(problem.indices)
    assert problem.indices.shape == (6, 2176)
    assert counts.tolist() == [2051] * 4 + [0] * 2
    assert bool((problem.indices[:4, 2051:] == -1).all())
    poison_first = (problem.cache.shape[0] - 1) * case.block_size
    valid = problem.indices[problem.indices >= 0]
    assert int(valid.max()) < poison_first  # nothing names the poisoned block
    assert all(
        len(set(r[r >= 0].tolist())) == int(c) for r, c in zip(problem.indices, counts, strict=True)
    )


def test_compact_and_shuffled_keep_each_rows_entries():
    problem = pagetable.build_problem(small_case(), torch.device("cpu"))
    for other in (pagetable.compact_problem(problem), pagetable.shuffled_problem(problem, 1)):
        for a, b in zip(problem.indices, other.indices, strict=True):
            assert sorted(a[a >= 0].tolist()) == sorted(b[b >= 0].tolist())
    assert pagetable.compact_problem(problem).width == 2051


def _impl(name, transform):
    """A fake implementation: the reference over indices rewritten by `transform`."""

    def prepare(problem):
        def run():
            indices = transform(problem.indices)
            out, lse = sparse_decode_reference(
                problem.q, problem.cache, indices, problem.softmax_scale, problem.rope_dim
            )
            return DecodeOutput(out, lse)

        return run

    return ImplSpec(name, "fake", lambda p: None, prepare)


@pytest.mark.parametrize("bug", ["capacity-index-topk", "minus-one-reads-slot-0"])
def test_padding_checks_catch_kernels_with_the_bugs_they_target(bug):
    transforms = {
        # reads only the first index_topk columns: the pre-fix capacity
        "capacity-index-topk": lambda idx: torch.where(
            torch.arange(idx.shape[1]) < GLM53.index_topk, idx, -1
        ).to(idx.dtype),
        # treats -1 as slot 0 instead of skipping it
        "minus-one-reads-slot-0": lambda idx: idx.clamp_min(0),
    }
    spec = _impl(bug, transforms[bug])
    registry = {"reference": reference_spec(), bug: spec}
    problem = pagetable.build_problem(small_case(), torch.device("cpu"))
    reference = pagetable.run_impl(pagetable.compact_problem(problem), "reference", registry).out
    rows = pagetable.padding_rows(spec, problem, registry, 5, reference)
    assert any(r["result"] == "failed" for r in rows), rows
    good = pagetable.padding_rows(registry["reference"], problem, registry, 5, reference)
    assert all(r["result"] == "passed" for r in good), good


def test_a_check_that_raises_is_a_failed_row():
    def boom():
        raise ValueError(
            "SM120 sparse MLA v32/GLM expects sparse block_tables shape (4, 1, 2048), "
            "got (4, 1, 2176)"
        )

    (r,) = pagetable.guarded("x", "impl", boom)
    assert r["result"] == "failed" and "page-table capacity fix" in r["detail"]


def test_row_refuses_fields_that_are_not_columns():
    with pytest.raises(ValueError):
        pagetable.row("x", "-", True, "d", heads=16)
