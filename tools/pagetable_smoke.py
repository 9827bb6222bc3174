"""GPU smoke test: each decode adapter against the reference on the model's widened top-k
buffer, NoPE and the zero-padded shim, printed as one table (tools/device_pagetable.sh runs it).

    python3 tools/pagetable_smoke.py [IMPL ...]
"""

from __future__ import annotations

import dataclasses
import sys

import torch

from nopebench import compare
from nopebench import console as out
from nopebench.checks import pagetable as pt
from nopebench.config import load_model_config
from nopebench.errors import EXIT_CHECK_FAILED, EXIT_OK
from nopebench.impls import registry


def smoke_rows(
    impls: list[str] | None = None,
    heads: tuple[int, ...] = (16, 64),
    rope_dims: tuple[int, ...] = (0, 64),
    seed: int = 0,
    model: str = "glm53-flash",
) -> list[dict]:
    """Each adapter against the reference on the model's widened buffer, NoPE and the shim."""
    cfg = load_model_config(model)
    specs = registry.implementations()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    for h in heads:
        for rope in rope_dims:
            case = dataclasses.replace(
                pt.model_case(cfg, pt.GPU_QUERY_TOKENS, seed, rope_dim=rope), heads=h
            )
            problem = pt.build_problem(case, device)
            reference = None
            for name in impls or [n for n in specs if n != "reference"]:
                spec = specs[name]
                reason = spec.unsupported(problem)
                base = {"impl": name, "heads": h, "rope_dim": rope}
                if reason:
                    rows.append(
                        {
                            **base,
                            "result": "skipped",
                            "max_abs_err": None,
                            "cos_diff": None,
                            "detail": reason,
                        }
                    )
                    continue
                try:
                    got = pt.run_impl(problem, name, specs).out
                    reference = (
                        reference
                        if reference is not None
                        else pt.run_impl(problem, "reference", specs).out
                    )
                    cmp = compare.close(got, reference)
                    rows.append(
                        {
                            **base,
                            "result": "passed" if cmp.passed else "failed",
                            "max_abs_err": cmp.max_abs_err,
                            "cos_diff": cmp.cos_diff,
                            "detail": cmp.detail,
                        }
                    )
                except Exception as exc:
                    rows.append(
                        {
                            **base,
                            "result": "failed",
                            "max_abs_err": None,
                            "cos_diff": None,
                            "detail": pt.error_detail(exc),
                        }
                    )
    return rows


def smoke_main(impls: list[str] | None = None) -> int:
    """Print the smoke table; exit status 0 when nothing that ran failed."""
    rows = smoke_rows(impls)
    verdicts = {"passed": True, "failed": False, "skipped": None}
    out.console.print(
        out.table(
            "adapter smoke test vs reference (glm53-flash widened buffer)",
            ["impl", "heads", "rope_dim", "result", "max abs err", "cos diff", "detail"],
            [
                (
                    r["impl"],
                    r["heads"],
                    r["rope_dim"],
                    out.verdict(verdicts[r["result"]]),
                    r["max_abs_err"],
                    r["cos_diff"],
                    r["detail"],
                )
                for r in rows
            ],
        )
    )
    return EXIT_OK if pt.passed(rows) else EXIT_CHECK_FAILED


if __name__ == "__main__":
    raise SystemExit(smoke_main(sys.argv[1:] or None))
