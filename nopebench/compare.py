"""Comparing a fast path's output with the reference.

Two kinds of comparison exist in this project:
- byte layouts (cache rows, scales, gathered bf16): exact, `bytes_equal`;
- attention outputs, where a kernel accumulates in another order: `close`, FlashMLA's rule
  (kernelkit/compare.py). Per element `|out - ref| <= abs_tol or <= rel_tol * |ref|`, with
  abs 1e-3 (bf16 outputs near zero) and rel 2/128 (two bf16 ulps: the output is rounded to
  bf16 once and the softmax weights are rounded to bf16 before the PV product), plus a cosine
  difference below 5e-6 over the whole tensor (catches small systematic errors the element rule
  lets through), plus identical NaN/inf positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ABS_TOL = 1e-3
REL_TOL = 2 / 128
COS_DIFF_TOL = 5e-6


@dataclass(frozen=True)
class Comparison:
    passed: bool
    max_abs_err: float
    mismatch_fraction: float
    cos_diff: float
    worst_index: tuple[int, ...] | None
    worst_out: float | None
    worst_ref: float | None
    detail: str

    def as_row(self) -> dict:
        return {
            "passed": self.passed,
            "max_abs_err": self.max_abs_err,
            "mismatch_fraction": self.mismatch_fraction,
            "cos_diff": self.cos_diff,
            "detail": self.detail,
        }


def cosine_difference(out: torch.Tensor, ref: torch.Tensor) -> float:
    """1 - cos(out, ref) over the flattened tensors, in float64; 0 for two all-zero tensors."""
    x, y = out.double().flatten(), ref.double().flatten()
    denom = (x * x).sum() + (y * y).sum()
    if denom == 0:
        return 0.0
    return float(1 - 2 * (x * y).sum() / denom)


def close(
    out: torch.Tensor,
    ref: torch.Tensor,
    abs_tol: float = ABS_TOL,
    rel_tol: float = REL_TOL,
    cos_tol: float = COS_DIFF_TOL,
    max_mismatch: float = 0.0,
) -> Comparison:
    """Compare attention outputs; on failure `detail` names the worst element and mismatch %.
    `max_mismatch` is the fraction of elements allowed outside the element rule: 0 (FlashMLA's
    rule) unless an implementation's accuracy class says otherwise."""
    if out.shape != ref.shape:
        return Comparison(
            False,
            float("inf"),
            1.0,
            float("inf"),
            None,
            None,
            None,
            f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}",
        )
    o, r = out.double(), ref.double()
    finite_pattern = torch.isfinite(o) == torch.isfinite(r)
    same_nonfinite = ~torch.isfinite(r) & ((o == r) | (torch.isnan(o) & torch.isnan(r)))
    if not bool(finite_pattern.all()) or not bool((same_nonfinite | torch.isfinite(r)).all()):
        bad = (~finite_pattern | (~torch.isfinite(r) & ~same_nonfinite)).nonzero()[0].tolist()
        return Comparison(
            False,
            float("inf"),
            1.0,
            float("inf"),
            tuple(bad),
            float(o[tuple(bad)]),
            float(r[tuple(bad)]),
            f"NaN/inf pattern differs at {tuple(bad)}",
        )
    finite = torch.isfinite(r)
    err = torch.where(finite, (o - r).abs(), torch.zeros_like(o))
    ok = (err <= abs_tol) | (err <= rel_tol * r.abs())
    mismatch = float((~ok).double().mean()) if ok.numel() else 0.0
    cos = cosine_difference(torch.where(finite, o, 0), torch.where(finite, r, 0))
    max_err = float(err.max()) if err.numel() else 0.0
    worst = (
        tuple(int(i) for i in torch.unravel_index(err.argmax(), err.shape)) if err.numel() else None
    )
    passed = mismatch <= max_mismatch and cos < cos_tol
    detail = "ok"
    if not passed:
        detail = (
            f"{mismatch:.4%} of elements outside abs {abs_tol:g} / rel {rel_tol:g} (allowed "
            f"{max_mismatch:.4%}); "
            f"cos diff {cos:.3g} "
            f"(limit {cos_tol:g}); worst at {worst}: {float(o[worst]):.6g} vs reference "
            f"{float(r[worst]):.6g}"
        )
    return Comparison(
        passed,
        max_err,
        mismatch,
        cos,
        worst,
        float(o[worst]) if worst else None,
        float(r[worst]) if worst else None,
        detail,
    )
