"""Check, then time, every (case, implementation) of a bench-decode grid.

One result row per (case, implementation); a refusal or a failure is a row with `skipped` or
`error` set, never a crash. An implementation is timed only after its output matched the
reference in the same run: it runs once, its outputs are poisoned with NaN, it runs again, and
that second output is compared (so an element it never writes cannot pass). Each is held to its
own accuracy class (ImplSpec.tolerance: strict for the harness's kernels, the measured class of
a peer such as FlashInfer fa3 or FlashMLA); the row records which class was applied.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable
from dataclasses import asdict

import torch

from nopebench import compare
from nopebench.bench.decode_cases import BenchConfig, DecodeCase, build_cache, make_problem
from nopebench.bench.timing import Ceilings, rotation_count, time_gpu
from nopebench.config import ModelConfig
from nopebench.impls import registry as impl_registry
from nopebench.impls.interface import STRICT, DecodeOutput, ImplSpec, Tolerance
from nopebench.impls.reference import reference_of


def roofline_ms(case: DecodeCase, ceil: Ceilings) -> float:
    """The larger of bytes / copy bandwidth and FLOPs / matmul rate: no kernel beats it."""
    return (
        max(case.bytes() / (ceil.copy_gbps * 1e9), case.flops() / (ceil.matmul_tflops * 1e12)) * 1e3
    )


def check_output(
    run: Callable[[], DecodeOutput],
    ref_out: torch.Tensor,
    ref_lse: torch.Tensor,
    tokens: int,
    tolerance: Tolerance = STRICT,
) -> dict:
    """Run, poison the outputs with NaN, run again, compare the first `tokens` query tokens
    with the reference under `tolerance` (and the natural-log LSE, when there is one).
    `passed_strict` says whether the output also met the strict class."""
    first = run()
    first.out.fill_(math.nan)
    if first.lse is not None:
        first.lse.fill_(math.nan)
    res = run()
    if res.out.is_cuda:
        torch.cuda.synchronize()
    cmp = compare.close(res.out[:tokens], ref_out, **tolerance.kwargs())
    strict = cmp if tolerance == STRICT else compare.close(res.out[:tokens], ref_out)
    row = {
        "passed": cmp.passed,
        "passed_strict": strict.passed,  # the output rule alone, for a peer held to its own class
        "max_abs_err": cmp.max_abs_err,
        "mismatch_fraction": cmp.mismatch_fraction,
        "cos_diff": cmp.cos_diff,
        "check_detail": cmp.detail,
        "lse_err": None,
    }
    if res.lse is not None:
        got, want = res.lse[:tokens].double(), ref_lse.double()
        same_inf = torch.equal(torch.isinf(got), torch.isinf(want))
        finite = torch.isfinite(want)
        lse_err = float((got[finite] - want[finite]).abs().max()) if bool(finite.any()) else 0.0
        row["lse_err"] = lse_err if same_inf else math.inf
        if not same_inf or lse_err > tolerance.lse_abs_tol:
            row["passed"] = False
            row["check_detail"] += f"; lse error {lse_err:.3g} (limit {tolerance.lse_abs_tol:g})"
    return row


def describe(spec: ImplSpec) -> dict:
    """The columns every row of an implementation carries: what it stands for, the accuracy
    class it is held to, and the library (and version) behind it."""
    library, version = spec.library()
    return {
        "impl": spec.name,
        "serving_backend": spec.serving_backend,
        "deployable": spec.deployable,
        "accuracy_class": spec.tolerance.name,
        "accuracy_rule": spec.tolerance.rule(),
        "library": library,
        "library_version": version,
    }


def run_case(
    case: DecodeCase,
    cfg: BenchConfig,
    model: ModelConfig,
    cache: torch.Tensor,
    usable: int,
    registry: dict[str, ImplSpec],
    impls: list[str],
    ceil: Ceilings,
    budget_s: float,
    l2_bytes: int | None,
) -> list[dict]:
    """Rows for one case: each requested implementation checked, then timed."""
    base = {
        "case": case.case_id,
        **asdict(case),
        "row_bytes": case.row_bytes,
        "bytes": case.bytes(),
        "flops": case.flops(),
        "roofline_ms": roofline_ms(case, ceil),
    }
    check_tokens = min(case.query_tokens, cfg.check_tokens)
    problem0 = make_problem(case, cache, usable, model, 0)
    sets = rotation_count(case.query_tokens * case.active * case.row_bytes, l2_bytes)
    problems = [problem0] + [make_problem(case, cache, usable, model, i) for i in range(1, sets)]
    ref_out, ref_lse = reference_of(problem0, check_tokens)
    rows = []
    for name in impls:
        spec = registry[name]
        row = {**base, **describe(spec), "kernel": None, "skipped": None, "error": None}
        rows.append(row)
        reason = spec.unsupported(problem0)
        if reason is None and name == "reference" and case.query_tokens > cfg.reference_max_tokens:
            reason = (
                f"reference is timed up to {cfg.reference_max_tokens} query tokens "
                "(config reference_max_tokens)"
            )
        if reason is not None:
            row["skipped"] = reason
            continue
        try:
            row["kernel"] = spec.kernel(problem0) if spec.kernel else None
            runs = [
                impl_registry.prepare(p, name, registry)
                for p in (problems if name != "reference" else problems[:1])
            ]
            row.update(check_output(runs[0], ref_out, ref_lse, check_tokens, spec.tolerance))
            if not row["passed"]:
                row["error"] = f"correctness check failed: {row['check_detail']}"
                continue
            timing = time_gpu(
                runs,
                budget_s=budget_s,
                min_samples=cfg.timing.min_samples,
                max_samples=cfg.timing.max_samples,
            )
        except Exception as exc:  # noqa: BLE001 - a failing implementation is a row, not a crash
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[
                :400
            ]
            row["traceback"] = traceback.format_exc(limit=3)[-1500:]
            continue
        ms = timing.median_ms
        row.update(timing.as_row())
        row.update(
            rotation_sets=len(runs),
            tbps=case.bytes() / (ms * 1e-3) / 1e12,
            tflops=case.flops() / (ms * 1e-3) / 1e12,
            pct_copy_bw=100 * case.bytes() / (ms * 1e-3) / (ceil.copy_gbps * 1e9),
            pct_matmul=100 * case.flops() / (ms * 1e-3) / (ceil.matmul_tflops * 1e12),
            pct_roofline=100 * base["roofline_ms"] / ms,
        )
    return rows


def run_grid(
    cfg: BenchConfig,
    model: ModelConfig,
    cases: list[DecodeCase],
    impls: list[str],
    ceil: Ceilings,
    budget_s: float,
    progress: Callable[[str], None] | None = None,
    device: str = "cuda",
) -> list[dict]:
    """All rows of a grid; caches are built once per mode and freed when the mode is done."""
    from nopebench.environment import gpu_info

    registry = impl_registry.implementations()
    l2 = gpu_info().get("l2_bytes")
    rows: list[dict] = []
    for mode in dict.fromkeys(c.mode for c in cases):
        cache, usable = build_cache(
            mode, cfg.cache_rows, model.block_size, model.kv_scale_format, device
        )
        for case in (c for c in cases if c.mode == mode):
            if progress:
                progress(case.case_id)
            rows.extend(
                run_case(case, cfg, model, cache, usable, registry, impls, ceil, budget_s, l2)
            )
        del cache
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows
