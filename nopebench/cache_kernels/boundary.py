"""Boundary cases of the CUDA cache kernels, small enough to run under compute-sanitizer.

`python -m nopebench.cache_kernels.boundary` runs:
  * verify-layout's checks (layout.run_case) for T in {1, 63, 64, 65} x block sizes {16, 64} x
    {528-byte NoPE, 656-byte NoPE, 656-byte RoPE} rows x both scale formats, with -1 slots,
    guard rows around the cache and contiguous and strided inputs alternating;
  * writes from inputs that are not 16-byte aligned (the kernel's scalar-load path);
  * unchecked calls with slots and block ids outside the cache, which the kernels must skip
    (write) or turn into NaN rows (gather) without touching anything outside their buffers.
Exit status 0 when every check passed. Under `compute-sanitizer --tool memcheck` a clean run
also shows that no access strayed, which the guard rows alone only show for writes.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

import numpy as np
import torch

from nopebench import geometry as g
from nopebench import rowformat
from nopebench.cache_kernels import ops
from nopebench.checks import layout

BOUNDARY_TOKENS = (1, 63, 64, 65)
ROW_KINDS = ((g.NOPE_ROW_BYTES, 0), (g.FULL_ROW_BYTES, 0), (g.FULL_ROW_BYTES, g.ROPE_DIM))


@dataclass(frozen=True)
class Outcome:
    name: str
    passed: bool
    detail: str = ""


def boundary_cases(tokens: tuple[int, ...] = BOUNDARY_TOKENS) -> list[layout.LayoutCase]:
    """The small grid; contiguous and strided inputs in a checkerboard over the grid indices
    (as layout.sweep_cases), so every row kind and format sees both input layouts."""
    base = layout.LayoutCase(
        tokens=1,
        block_size=64,
        row_bytes=g.FULL_ROW_BYTES,
        rope_dim=0,
        scale_format="arbitrary_fp32",
    )
    cases = []
    for i, t in enumerate(tokens):
        for j, bs in enumerate((16, 64)):
            for k, (row_bytes, rope_dim) in enumerate(ROW_KINDS):
                for m, fmt in enumerate(rowformat.SCALE_FORMATS):
                    cases.append(
                        replace(
                            base,
                            tokens=t,
                            block_size=bs,
                            row_bytes=row_bytes,
                            rope_dim=rope_dim,
                            scale_format=fmt,
                            strided_inputs=(i + j + k + m) % 2 == 0,
                        )
                    )
    return cases


def layout_outcomes(cases: list[layout.LayoutCase], device: str = "cuda") -> list[Outcome]:
    outcomes = []
    for case in cases:
        results = layout.run_case(case, ops.write_cache, ops.gather_upconvert, device)
        failed = [r for r in results if not r.passed]
        detail = "; ".join(f"{r.check}: {r.detail}" for r in failed)
        outcomes.append(Outcome(f"layout {case.case_id}", not failed, detail))
    return outcomes


def _random_inputs(
    tokens: int, rope_dim: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    gen = torch.Generator().manual_seed(seed)
    kv_c = layout.adversarial_latent(tokens, gen)
    k_pe = torch.randn(tokens, rope_dim, generator=gen).to(torch.bfloat16) if rope_dim else None
    return kv_c, k_pe


def misaligned_write_outcome(
    tokens: int, row_bytes: int, rope_dim: int, scale_format: str, device: str = "cuda"
) -> Outcome:
    """Inputs 2 bytes past a 16-byte boundary with odd row strides: the scalar-load path."""
    kv_c, k_pe = _random_inputs(tokens, rope_dim, seed=tokens * 7 + rope_dim + row_bytes)
    width = g.LATENT_DIM + rope_dim
    buf = torch.zeros(tokens, width + 3, dtype=torch.bfloat16)
    buf[:, 1 : 1 + g.LATENT_DIM] = kv_c
    if rope_dim:
        buf[:, 1 + g.LATENT_DIM : 1 + width] = k_pe
    dev = buf.to(device)
    kv_dev = dev[:, 1 : 1 + g.LATENT_DIM]
    pe_dev = dev[:, 1 + g.LATENT_DIM : 1 + width] if rope_dim else None
    slots = torch.randperm(tokens + 5, generator=torch.Generator().manual_seed(tokens))[:tokens]
    slots[::7] = -1
    cache = torch.full((tokens + 5, 1, row_bytes), layout.SENTINEL, dtype=torch.uint8)
    expected = cache.clone()
    rowformat.write_cache(expected, kv_c, k_pe, slots, scale_format)
    got = cache.to(device)
    ops.write_cache(got, kv_dev, pe_dev, slots.to(device), scale_format)
    return _bytes_outcome(
        f"misaligned inputs T{tokens}-row{row_bytes}-rope{rope_dim}-{scale_format}",
        got.cpu(),
        expected,
    )


def unchecked_write_outcome(device: str = "cuda") -> Outcome:
    """Slots past the cache's end and below -1 are skipped by the kernel itself."""
    tokens, capacity = 40, 48
    kv_c, _ = _random_inputs(tokens, 0, seed=11)
    slots = torch.arange(tokens, dtype=torch.int64)
    slots[::5] = capacity + torch.arange(0, tokens, 5)  # just past the end, and further
    slots[1::9] = -7
    storage, cache = layout.guarded_cache(capacity // 16, 16, g.NOPE_ROW_BYTES, device)
    ops.write_cache_unchecked(cache, kv_c.to(device), None, slots.to(device), "arbitrary_fp32")
    exp_storage, exp_cache = layout.guarded_cache(capacity // 16, 16, g.NOPE_ROW_BYTES, "cpu")
    valid = torch.where(slots < capacity, slots, torch.full_like(slots, -1))
    rowformat.write_cache(exp_cache, kv_c, None, valid, "arbitrary_fp32")
    return _bytes_outcome("unchecked write: out-of-range slots skipped", storage.cpu(), exp_storage)


def unchecked_gather_outcome(device: str = "cuda") -> Outcome:
    """Table entries outside the cache (-1, past the end, past the row) give NaN rows only."""
    num_blocks, bs = 6, 16
    storage, cache = layout.guarded_cache(num_blocks, bs, g.FULL_ROW_BYTES, "cpu")
    kv_c, k_pe = _random_inputs(num_blocks * bs, g.ROPE_DIM, seed=5)
    rowformat.write_cache(cache, kv_c, k_pe, torch.arange(num_blocks * bs), "pow2_fp32")
    block_table = torch.tensor(
        [[0, -1, 3], [num_blocks + 2, 5, 1], [2, 4, num_blocks]], dtype=torch.int32
    )
    workspace_starts = torch.tensor([0, 40, 70], dtype=torch.int32)
    seq_starts = torch.tensor([3, 5, 0], dtype=torch.int32)
    total_rows = 120  # the last request reads past its 3 blocks (48 positions)
    out = torch.full((total_rows, g.UPCONVERT_DIM), 1.0, dtype=torch.bfloat16, device=device)
    ops.gather_upconvert_into(
        out,
        cache.to(device),
        block_table.to(device),
        workspace_starts.to(device),
        total_rows,
        g.ROPE_DIM,
        seq_starts.to(device),
    )
    got = out.cpu().view(torch.int16).numpy().view(np.uint16)
    rows = cache.view(-1, g.FULL_ROW_BYTES).numpy()
    bounds = [*workspace_starts.tolist(), total_rows]
    for r in range(3):
        for row in range(bounds[r], bounds[r + 1]):
            pos = int(seq_starts[r]) + row - bounds[r]
            col = pos // bs
            block = int(block_table[r, col]) if col < block_table.shape[1] else -1
            if 0 <= block < num_blocks:
                expected = layout.independent_gather(rows[block * bs + pos % bs][None], g.ROPE_DIM)[
                    0
                ]
                if not np.array_equal(
                    np.where(layout._bf16_nan(expected), 0, got[row]),
                    np.where(layout._bf16_nan(expected), 0, expected),
                ):
                    return Outcome(
                        "unchecked gather: bad table entries",
                        False,
                        f"row {row} (request {r}, valid slot) differs",
                    )
            elif not layout._bf16_nan(got[row]).all():
                return Outcome(
                    "unchecked gather: bad table entries",
                    False,
                    f"row {row} (request {r}, block {block}) is not all NaN",
                )
    return Outcome("unchecked gather: bad table entries", True)


def _bytes_outcome(name: str, got: torch.Tensor, expected: torch.Tensor) -> Outcome:
    diff = (got != expected).reshape(-1)
    if not bool(diff.any()):
        return Outcome(name, True)
    first = int(torch.nonzero(diff)[0])
    return Outcome(name, False, f"{int(diff.sum())} bytes differ, first at byte {first}")


def all_outcomes(device: str = "cuda") -> list[Outcome]:
    outcomes = layout_outcomes(boundary_cases(), device)
    for t in (1, 63, 65):
        for row_bytes, rope_dim in ROW_KINDS:
            outcomes.append(
                misaligned_write_outcome(t, row_bytes, rope_dim, "arbitrary_fp32", device)
            )
    outcomes.append(unchecked_write_outcome(device))
    outcomes.append(unchecked_gather_outcome(device))
    return outcomes


def main() -> int:
    if not torch.cuda.is_available():
        print("boundary: needs a CUDA GPU; none is visible", file=sys.stderr)
        return 2
    outcomes = all_outcomes()
    torch.cuda.synchronize()
    for o in outcomes:
        print(f"{'pass' if o.passed else 'FAIL'}  {o.name}" + (f": {o.detail}" if o.detail else ""))
    failed = sum(not o.passed for o in outcomes)
    print(f"boundary: {len(outcomes) - failed}/{len(outcomes)} passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
