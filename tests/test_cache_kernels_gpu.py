"""The CUDA cache kernels on a GPU: verify-layout's sweep bit-exactly, the boundary and
out-of-range cases, argument errors with device tensors, and CUDA-graph capture of the
unchecked fast path. Skipped cleanly without a GPU (tests/conftest.py).

The T = 65536 sweep cases are marked slow (their CPU-side checks take seconds each);
`nopebench verify-layout --impl cuda --sweep` runs them too."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nopebench import geometry as g
from nopebench import rowformat
from nopebench.cache_kernels import boundary, ops
from nopebench.checks import layout
from nopebench.config import load_model_config

pytestmark = pytest.mark.gpu

SWEEP = [
    *layout.sweep_cases(load_model_config("glm53-flash")),
    *layout.sweep_cases(load_model_config("glm5")),
]


def _param(case: layout.LayoutCase):
    marks = [pytest.mark.slow] if case.tokens > 4096 else []
    return pytest.param(case, id=case.case_id, marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in SWEEP])
def test_sweep_case_is_bit_exact(case):
    results = layout.run_case(case, ops.write_cache, ops.gather_upconvert, "cuda")
    failed = {r.check: r.detail for r in results if not r.passed}
    assert not failed, failed


@pytest.mark.parametrize("block_size", [1, 24, 128])
@pytest.mark.parametrize("rope_dim", [0, 64])
def test_other_block_sizes(block_size, rope_dim):
    """Block sizes the sweep does not use: 1, a non-power of two (the kernel's division path)
    and a large power of two."""
    case = layout.LayoutCase(
        tokens=300,
        block_size=block_size,
        row_bytes=656,
        rope_dim=rope_dim,
        scale_format="arbitrary_fp32",
        requests=5,
    )
    results = layout.run_case(case, ops.write_cache, ops.gather_upconvert, "cuda")
    failed = {r.check: r.detail for r in results if not r.passed}
    assert not failed, failed


def test_boundary_and_out_of_range_cases():
    outcomes = boundary.all_outcomes("cuda")
    failed = {o.name: o.detail for o in outcomes if not o.passed}
    assert not failed, failed


def _inputs(tokens: int, rope_dim: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    kv_c = layout.adversarial_latent(tokens, gen)
    k_pe = torch.randn(tokens, rope_dim, generator=gen).to(torch.bfloat16) if rope_dim else None
    return kv_c, k_pe


@pytest.mark.parametrize("fmt", rowformat.SCALE_FORMATS)
@pytest.mark.parametrize(("row_bytes", "rope_dim"), boundary.ROW_KINDS)
def test_write_equals_the_cpu_reference_byte_for_byte(fmt, row_bytes, rope_dim):
    tokens, bs = 3000, 16
    kv_c, k_pe = _inputs(tokens, rope_dim, seed=row_bytes + rope_dim)
    slots = torch.randperm(4096, generator=torch.Generator().manual_seed(1))[:tokens]
    slots[::11] = -1
    expected = torch.full((4096 // bs, bs, row_bytes), 0x5A, dtype=torch.uint8)
    got = expected.cuda()
    rowformat.write_cache(expected, kv_c, k_pe, slots, fmt)
    ops.write_cache(
        got, kv_c.cuda(), k_pe.cuda() if k_pe is not None else None, slots.int().cuda(), fmt
    )
    assert torch.equal(got.cpu(), expected)
    gathered = ops.gather_upconvert(
        got,
        torch.arange(4096 // bs, dtype=torch.int32)[None].cuda(),
        torch.zeros(1, dtype=torch.int32).cuda(),
        4096,
        rope_dim,
    )
    ref = rowformat.gather_upconvert(
        expected, torch.arange(4096 // bs)[None], torch.zeros(1, dtype=torch.int32), 4096, rope_dim
    )
    a, e = gathered.cpu().view(torch.int16).numpy(), ref.view(torch.int16).numpy()
    nan = layout._bf16_nan(a.view(np.uint16)) & layout._bf16_nan(e.view(np.uint16))
    assert np.array_equal(np.where(nan, 0, a), np.where(nan, 0, e))


def test_nan_inputs_give_nan_bytes_where_the_reference_does():
    kv_c, _ = _inputs(8, 0, seed=9)
    kv_c = kv_c.float()
    kv_c[0, 7] = float("nan")
    kv_c[1, :128] = float("nan")
    kv_c[2, 200] = float("inf")
    kv_c = kv_c.to(torch.bfloat16)
    for fmt in rowformat.SCALE_FORMATS:
        expected = torch.zeros(1, 8, 528, dtype=torch.uint8)
        rowformat.write_cache(expected, kv_c, None, torch.arange(8), fmt)
        got = torch.zeros(1, 8, 528, dtype=torch.uint8, device="cuda")
        ops.write_cache(got, kv_c.cuda(), None, torch.arange(8).cuda(), fmt)
        got, expected = got.cpu().numpy().reshape(8, 528), expected.numpy().reshape(8, 528)
        assert np.array_equal(got[:, 512:], expected[:, 512:]), fmt
        nan_got, nan_exp = (got[:, :512] & 0x7F) == 0x7F, (expected[:, :512] & 0x7F) == 0x7F
        assert np.array_equal(nan_got, nan_exp), fmt
        assert np.array_equal(
            np.where(nan_got, 0, got[:, :512]), np.where(nan_exp, 0, expected[:, :512])
        ), fmt


def test_int32_and_int64_slots_write_the_same_bytes():
    kv_c, k_pe = _inputs(100, 64)
    slots = torch.randperm(128)[:100].cuda()
    caches = []
    for dtype in (torch.int32, torch.int64):
        cache = torch.zeros(2, 64, 656, dtype=torch.uint8, device="cuda")
        ops.write_cache(cache, kv_c.cuda(), k_pe.cuda(), slots.to(dtype), "pow2_fp32")
        caches.append(cache)
    assert torch.equal(*caches)


def test_empty_calls_do_nothing():
    cache = torch.zeros(1, 16, 656, dtype=torch.uint8, device="cuda")
    ops.write_cache(
        cache,
        torch.zeros(0, 512, dtype=torch.bfloat16, device="cuda"),
        None,
        torch.zeros(0, dtype=torch.int64, device="cuda"),
        "arbitrary_fp32",
    )
    assert not cache.any()
    out = ops.gather_upconvert(
        cache,
        torch.zeros(1, 1, dtype=torch.int32, device="cuda"),
        torch.zeros(1, dtype=torch.int32, device="cuda"),
        0,
        0,
    )
    assert out.shape == (0, g.UPCONVERT_DIM) and out.is_cuda


def test_argument_errors_with_device_tensors():
    cache = torch.zeros(2, 16, 656, dtype=torch.uint8, device="cuda")
    kv_c = torch.zeros(4, 512, dtype=torch.bfloat16, device="cuda")
    slots = torch.arange(4, device="cuda")
    with pytest.raises(ValueError, match="share a device"):
        ops.write_cache(cache, kv_c.cpu(), None, slots, "arbitrary_fp32")
    with pytest.raises(ValueError, match="same slot twice"):
        ops.write_cache(
            cache, kv_c, None, torch.zeros(4, dtype=torch.int64, device="cuda"), "arbitrary_fp32"
        )
    with pytest.raises(ValueError, match="out of range"):
        ops.write_cache(cache, kv_c, None, slots + 30, "arbitrary_fp32")
    with pytest.raises(ValueError, match="pe_dim must be 64 or 0"):
        ops.write_cache(
            cache,
            kv_c,
            torch.zeros(4, 16, dtype=torch.bfloat16, device="cuda"),
            slots,
            "arbitrary_fp32",
        )
    table = torch.tensor([[0, 1]], dtype=torch.int32, device="cuda")
    starts = torch.zeros(1, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="past its block_table row"):
        ops.gather_upconvert(cache, table, starts, 33, 0)
    out = torch.empty(32, g.UPCONVERT_DIM, dtype=torch.float32, device="cuda")
    with pytest.raises(ValueError, match="out must be contiguous bf16"):
        ops.gather_upconvert_into(out, cache, table, starts, 32, 0)
    assert not cache.any()  # nothing was launched


def test_unchecked_path_captures_in_a_cuda_graph():
    """The benchmark's fast path: no host sync, so it records into a graph and replays to the
    same bytes as the validated eager call."""
    case = layout.LayoutCase(
        tokens=1000, block_size=64, row_bytes=656, rope_dim=64, scale_format="arbitrary_fp32"
    )
    inputs = layout.make_inputs(case, "cuda")
    eager = torch.zeros(inputs.num_blocks, 64, 656, dtype=torch.uint8, device="cuda")
    ops.write_cache(eager, inputs.kv_c, inputs.k_pe, inputs.slot_mapping, case.scale_format)
    eager_out = ops.gather_upconvert(
        eager, inputs.block_table, inputs.workspace_starts, inputs.total_rows, 64, inputs.seq_starts
    )

    cache = torch.zeros_like(eager)
    out = torch.empty_like(eager_out)
    ops.write_cache_unchecked(
        cache, inputs.kv_c, inputs.k_pe, inputs.slot_mapping, case.scale_format
    )  # warm up
    cache.zero_()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.write_cache_unchecked(
            cache, inputs.kv_c, inputs.k_pe, inputs.slot_mapping, case.scale_format
        )
        ops.gather_upconvert_into(
            out,
            cache,
            inputs.block_table,
            inputs.workspace_starts,
            inputs.total_rows,
            64,
            inputs.seq_starts,
        )
    assert not cache.any()  # captured, not run
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(cache, eager)
    assert torch.equal(out.view(torch.int16), eager_out.view(torch.int16))
