"""The CUDA kernels' own source, run on the CPU by cache_kernels/cuda/emulator.cpp (lanes as
coroutines, switched at every warp intrinsic), through nopebench's ctypes binding and
verify-layout's checks. This is what catches a wrong lane layout, shuffle or request search on a
machine without a GPU; the numerics' hardware path is left to test_cache_kernels_gpu.py."""

from __future__ import annotations

import ctypes
from dataclasses import replace

import pytest
import torch

from nopebench import cuda_build as b
from nopebench.cache_kernels import boundary, ops
from nopebench.cache_kernels.library import ABI_VERSION, CACHE_LIBRARY, declare
from nopebench.checks import layout
from nopebench.config import load_model_config

pytestmark = pytest.mark.skipif(b.emulator_missing() is not None, reason=str(b.emulator_missing()))


@pytest.fixture(scope="module")
def emulated_lib(tmp_path_factory) -> ctypes.CDLL:
    out = tmp_path_factory.mktemp("emulator") / "libnopecache_emulated.so"
    lib = declare(ctypes.CDLL(str(b.compile_emulator(CACHE_LIBRARY, out))))
    assert lib.nopecache_abi_version() == ABI_VERSION
    return lib


@pytest.fixture
def emulated(emulated_lib, monkeypatch):
    """ops launches the emulated kernels on CPU tensors; every host-side check still runs."""
    monkeypatch.setattr(ops, "load_library", lambda device: emulated_lib)
    monkeypatch.setattr(ops, "require_cuda", lambda cache: None)
    return emulated_lib


def assert_case(case: layout.LayoutCase) -> None:
    results = layout.run_case(case, ops.write_cache, ops.gather_upconvert, "cpu")
    failed = {r.check: r.detail for r in results if not r.passed}
    assert not failed, failed


SWEEP = [
    c
    for m in ("glm53-flash", "glm5")
    for c in layout.sweep_cases(load_model_config(m), tokens=(1, 63, 64, 65, 4096))
]


@pytest.mark.parametrize("case", SWEEP, ids=[c.case_id for c in SWEEP])
def test_sweep_case(emulated, case):
    assert_case(case)


@pytest.mark.parametrize("block_size", [1, 24, 128])
@pytest.mark.parametrize("requests", [1, 40, 300])
def test_block_sizes_and_request_counts(emulated, block_size, requests):
    """Non-power-of-two block sizes (the division path) and enough requests for the 32-way
    request search to take two rounds."""
    case = layout.LayoutCase(
        tokens=700,
        block_size=block_size,
        row_bytes=656,
        rope_dim=64,
        scale_format="pow2_fp32",
        requests=requests,
    )
    assert_case(case)


def test_boundary_and_out_of_range_cases(emulated):
    outcomes = boundary.all_outcomes("cpu")
    failed = {o.name: o.detail for o in outcomes if not o.passed}
    assert not failed, failed


@pytest.mark.parametrize("requests", [5, 40])
def test_empty_requests_and_equal_starts(emulated, requests):
    """Requests that gather nothing (equal workspace starts) own no rows, with few requests
    (one probe per lane) and many (the search plus stepping forward)."""
    case = layout.LayoutCase(
        tokens=400,
        block_size=16,
        row_bytes=528,
        rope_dim=0,
        scale_format="arbitrary_fp32",
        requests=requests,
    )
    inputs = layout.make_inputs(case)
    storage, cache = layout.guarded_cache(inputs.num_blocks, 16, 528, "cpu")
    ops.write_cache(cache, inputs.kv_c, inputs.k_pe, inputs.slot_mapping, case.scale_format)
    expected = ops.gather_upconvert(
        cache, inputs.block_table, inputs.workspace_starts, inputs.total_rows, 0, inputs.seq_starts
    )
    # an empty request (same start) in front of every third one, and one at the very end
    pick = [r for r in range(requests) for _ in range(2 if r % 3 == 0 else 1)]
    new_starts = torch.cat(
        [inputs.workspace_starts[pick], torch.tensor([inputs.total_rows], dtype=torch.int32)]
    )
    pick.append(requests - 1)
    table, seq = inputs.block_table[pick], inputs.seq_starts[pick]
    got = ops.gather_upconvert(cache, table, new_starts, inputs.total_rows, 0, seq)
    assert torch.equal(got.view(torch.int16), expected.view(torch.int16))


def test_strided_block_table_and_int64_indices(emulated):
    """A block table that is a column slice of a wider one (row stride != width), and int64
    index tensors (converted to int32 on the way in)."""
    case = replace(
        layout.LayoutCase(
            tokens=300, block_size=16, row_bytes=656, rope_dim=0, scale_format="arbitrary_fp32"
        ),
        requests=6,
    )
    inputs = layout.make_inputs(case)
    storage, cache = layout.guarded_cache(inputs.num_blocks, 16, 656, "cpu")
    ops.write_cache(cache, inputs.kv_c, inputs.k_pe, inputs.slot_mapping.int(), case.scale_format)
    rows, width = inputs.block_table.shape
    wide = torch.full((rows, width + 5), -1, dtype=torch.int32)
    wide[:, :width] = inputs.block_table
    sliced = wide[:, :width]
    assert sliced.stride(0) == width + 5
    expected = ops.gather_upconvert(
        cache, inputs.block_table, inputs.workspace_starts, inputs.total_rows, 0, inputs.seq_starts
    )
    for table, starts, seq in (
        (sliced, inputs.workspace_starts, inputs.seq_starts),
        (inputs.block_table.long(), inputs.workspace_starts.long(), inputs.seq_starts.long()),
    ):
        got = ops.gather_upconvert(cache, table, starts, inputs.total_rows, 0, seq)
        assert torch.equal(got.view(torch.int16), expected.view(torch.int16))
