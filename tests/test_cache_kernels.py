"""The CUDA cache kernels without a GPU: their per-value numerics (ds_mla_numerics.cuh, built
for the host) against the reference, and the host-side checks that reject bad calls before any
launch. The kernels' memory side runs in test_cache_kernels_gpu.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from nopebench import cuda_build as b
from nopebench import geometry as g
from nopebench import rowformat
from nopebench.cache_kernels import ops
from nopebench.cache_kernels.library import CACHE_LIBRARY
from nopebench.checks import layout

needs_nvcc = pytest.mark.skipif(b.find_nvcc() is None, reason="nvcc not found")
FORMATS = rowformat.SCALE_FORMATS


# ---------------------------------------------------------------- numerics on the host


@pytest.fixture(scope="module")
def numerics(tmp_path_factory) -> Path:
    """cache_kernels/cuda/numerics_check.cu compiled for the host with the library's numerics
    flags."""
    out = tmp_path_factory.mktemp("numerics") / "numerics_check"
    cmd = [
        str(b.find_nvcc()),
        "-O2",
        "-std=c++17",
        "-I",
        str(CACHE_LIBRARY.source_dir),
        "-o",
        str(out),
        str(CACHE_LIBRARY.source_dir / "numerics_check.cu"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out


def run_numerics(
    exe: Path, tmp_path: Path, mode: str, data: np.ndarray, fmt: str | None = None
) -> np.ndarray:
    src, dst = tmp_path / f"{mode}.in", tmp_path / f"{mode}.out"
    np.ascontiguousarray(data).tofile(src)
    args = [str(exe), mode] + ([str(FORMATS.index(fmt))] if fmt else []) + [str(src), str(dst)]
    subprocess.run(args, check=True, timeout=120)
    return np.fromfile(dst, dtype=np.uint8)


def bf16_bits(x: torch.Tensor) -> np.ndarray:
    return x.contiguous().view(torch.int16).numpy().view(np.uint16)


@needs_nvcc
@pytest.mark.parametrize("fmt", FORMATS)
def test_scale_of_every_bf16_magnitude(numerics, tmp_path, fmt):
    """Every amax a tile can have (all 32768 non-negative bf16 patterns, NaN and inf included)."""
    mags = np.arange(0x8000, dtype=np.uint16)
    got = run_numerics(numerics, tmp_path, "scale", mags, fmt).view(np.uint32)
    tiles = torch.zeros(mags.size, g.LATENT_DIM, dtype=torch.bfloat16)
    tiles.view(torch.int16)[:, 0] = torch.from_numpy(mags.view(np.int16))
    expected = rowformat.tile_scales(tiles, fmt)[:, 0].numpy().view(np.uint32)
    bad = np.nonzero(got != expected)[0]
    assert not bad.size, [(hex(mags[i]), hex(got[i]), hex(expected[i])) for i in bad[:5]]


@needs_nvcc
@pytest.mark.parametrize("fmt", FORMATS)
def test_quantized_rows_equal_the_reference(numerics, tmp_path, fmt):
    """Adversarial latents (zeros, -0, subnormals, near-max, exact +-amax) byte for byte."""
    latent = layout.adversarial_latent(3000, torch.Generator().manual_seed(3))
    got = run_numerics(numerics, tmp_path, "quantize", bf16_bits(latent), fmt).reshape(
        -1, g.NOPE_ROW_BYTES
    )
    expected = rowformat.pack_rows(latent, None, fmt, g.NOPE_ROW_BYTES).numpy()
    rows = np.nonzero((got != expected).any(axis=1))[0]
    assert not rows.size, f"{rows.size} rows differ, first {rows[0]}"


@needs_nvcc
@pytest.mark.parametrize("fmt", FORMATS)
def test_non_finite_inputs_give_nan_bytes_where_the_reference_does(numerics, tmp_path, fmt):
    """NaN and inf in a tile: the scale equals the reference's; finite bytes are equal and NaN
    bytes are NaN (0x7f or 0xff: a NaN's sign after a divide is the platform's choice)."""
    latent = layout.adversarial_latent(64, torch.Generator().manual_seed(4)).float()
    latent[0, 5] = float("nan")
    latent[1, 130] = float("inf")
    latent[2, 300] = -float("inf")
    latent[3, :128] = float("nan")
    latent[4, 400] = float("nan")
    latent[4, 401] = float("inf")
    latent = latent.to(torch.bfloat16)
    got = run_numerics(numerics, tmp_path, "quantize", bf16_bits(latent), fmt).reshape(
        -1, g.NOPE_ROW_BYTES
    )
    expected = rowformat.pack_rows(latent, None, fmt, g.NOPE_ROW_BYTES).numpy()
    scales_got = got[:, 512:].copy().view(np.uint32)
    scales_exp = expected[:, 512:].copy().view(np.uint32)
    assert np.array_equal(scales_got, scales_exp)
    nan_got = (got[:, :512] & 0x7F) == 0x7F
    nan_exp = (expected[:, :512] & 0x7F) == 0x7F
    assert np.array_equal(nan_got, nan_exp)
    assert np.array_equal(
        np.where(nan_got, 0, got[:, :512]), np.where(nan_exp, 0, expected[:, :512])
    )
    assert nan_got[0, 5] and nan_got[3, :128].all()


@needs_nvcc
def test_dequantize_every_fp8_byte_with_awkward_scales(numerics, tmp_path):
    """All 256 e4m3 bytes times scales whose products are subnormal, huge, or NaN; plus the
    sentinel row verify-layout leaves in unwritten slots."""
    scales = np.array(
        [
            1.0,
            2.0**-126,
            2.0**-140,
            3e-39,
            7.5e-3,
            0.3333333,
            2.0**100,
            1e38,
            np.float32(np.nan),
            2.0**-13,
            1.0 / 448,
            6.1e-5,
        ],
        dtype=np.float32,
    )
    codes = np.arange(256, dtype=np.uint8)
    rows = np.zeros((len(scales), g.NOPE_ROW_BYTES), dtype=np.uint8)
    for i, s in enumerate(scales):
        rows[i, :512] = np.roll(np.tile(codes, 2), i)
        rows[i, 512:528] = np.array([s, s, s, s], dtype=np.float32).view(np.uint8)
    rows = np.concatenate([rows, np.full((1, g.NOPE_ROW_BYTES), layout.SENTINEL, dtype=np.uint8)])
    got = (
        run_numerics(numerics, tmp_path, "dequantize", rows)
        .view(np.uint16)
        .reshape(-1, g.LATENT_DIM)
    )
    expected = bf16_bits(rowformat.dequantize_rows(torch.from_numpy(rows))[0])
    nan_got, nan_exp = layout._bf16_nan(got), layout._bf16_nan(expected)
    assert np.array_equal(nan_got, nan_exp)
    bad = np.argwhere((got != expected) & ~nan_exp)
    assert not bad.size, [(tuple(i), hex(got[tuple(i)]), hex(expected[tuple(i)])) for i in bad[:5]]


# --- host-side checks, before any launch --------------------------------------------------


@pytest.fixture
def no_launch(monkeypatch):
    """Any attempt to load the library (the step before a launch) fails the test."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the CUDA library was loaded: a check ran too late")

    monkeypatch.setattr(ops, "load_library", forbidden)


def write_args(tokens=8, rope_dim=0, row_bytes=656, num_blocks=2, block_size=16):
    gen = torch.Generator().manual_seed(0)
    return dict(
        cache=torch.zeros(num_blocks, block_size, row_bytes, dtype=torch.uint8),
        kv_c=torch.randn(tokens, 512, generator=gen).to(torch.bfloat16),
        k_pe=torch.randn(tokens, rope_dim, generator=gen).to(torch.bfloat16) if rope_dim else None,
        slot_mapping=torch.arange(tokens, dtype=torch.int64),
        scale_format="arbitrary_fp32",
    )


def call_write(fn=ops.write_cache, **overrides):
    args = {**write_args(), **overrides}
    fn(args["cache"], args["kv_c"], args["k_pe"], args["slot_mapping"], args["scale_format"])


BAD_WRITES = {
    "scale format": (dict(scale_format="fp8"), "scale_format must be one of"),
    "kv_c dtype": (dict(kv_c=torch.zeros(8, 512)), "kv_c must be bf16 \\[T, 512\\]"),
    "kv_lora_rank 576": (dict(kv_c=torch.zeros(8, 576, dtype=torch.bfloat16)), "kv_lora_rank 512"),
    "rope 32": (dict(k_pe=torch.zeros(8, 32, dtype=torch.bfloat16)), "pe_dim must be 64 or 0"),
    "k_pe rows": (dict(k_pe=torch.zeros(7, 64, dtype=torch.bfloat16)), "k_pe must be bf16"),
    "rope in 528 rows": (
        dict(
            cache=torch.zeros(2, 16, 528, dtype=torch.uint8),
            k_pe=torch.zeros(8, 64, dtype=torch.bfloat16),
        ),
        "528-byte rows hold no RoPE",
    ),
    "row bytes 600": (dict(cache=torch.zeros(2, 16, 600, dtype=torch.uint8)), "528 or 656 bytes"),
    "cache dtype": (dict(cache=torch.zeros(2, 16, 656, dtype=torch.int8)), "cache must be uint8"),
    "cache 2-D": (
        dict(cache=torch.zeros(32, 656, dtype=torch.uint8)),
        "cache must be uint8 \\[num_blocks",
    ),
    "cache strided": (dict(cache=torch.zeros(2, 32, 656, dtype=torch.uint8)[:, ::2]), "contiguous"),
    "block size 0": (
        dict(cache=torch.zeros(2, 0, 656, dtype=torch.uint8), slot_mapping=torch.full((8,), -1)),
        "block_size must be >= 1",
    ),
    "cache misaligned": (
        dict(cache=torch.zeros(2 * 16 * 656 + 8, dtype=torch.uint8)[8:].view(2, 16, 656)),
        "16-byte boundary",
    ),
    "slot dtype": (dict(slot_mapping=torch.arange(8, dtype=torch.float32)), "int32 or int64"),
    "slot length": (dict(slot_mapping=torch.arange(9)), "slot_mapping must be \\[T\\]"),
    "slot out of range": (
        dict(slot_mapping=torch.tensor([0, 1, 2, 3, 4, 5, 6, 32])),
        "slot 32 out of range",
    ),
    "slot twice": (dict(slot_mapping=torch.tensor([0, 1, 2, 3, 4, 5, 6, 6])), "same slot twice"),
}


@pytest.mark.parametrize("name", list(BAD_WRITES))
def test_write_rejects_bad_arguments_before_launch(no_launch, name):
    overrides, message = BAD_WRITES[name]
    with pytest.raises(ValueError, match=message):
        call_write(**overrides)


@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize(("rope_dim", "row_bytes"), [(0, 528), (0, 656), (64, 656)])
def test_valid_write_stops_only_at_the_device_check(no_launch, slot_dtype, rope_dim, row_bytes):
    args = write_args(rope_dim=rope_dim, row_bytes=row_bytes)
    args["slot_mapping"] = torch.tensor([0, -1, 5, 31, -1, 2, 3, 4], dtype=slot_dtype)
    with pytest.raises(ValueError, match="need tensors on a CUDA device, got cpu"):
        call_write(**args)


def test_unchecked_write_skips_only_the_value_checks(no_launch):
    with pytest.raises(ValueError, match="CUDA device"):  # a duplicate slot is not looked at
        call_write(ops.write_cache_unchecked, slot_mapping=torch.zeros(8, dtype=torch.int64))
    with pytest.raises(ValueError, match="kv_c must be bf16"):  # shapes still are
        call_write(ops.write_cache_unchecked, kv_c=torch.zeros(8, 512))


def gather_args(rope_dim=0, row_bytes=656):
    return dict(
        cache=torch.zeros(4, 16, row_bytes, dtype=torch.uint8),
        block_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
        workspace_starts=torch.tensor([0, 20], dtype=torch.int32),
        total_rows=40,
        rope_dim=rope_dim,
        seq_starts=torch.tensor([3, 0], dtype=torch.int64),
    )


def call_gather(**overrides):
    a = {**gather_args(), **overrides}
    return ops.gather_upconvert(
        a["cache"],
        a["block_table"],
        a["workspace_starts"],
        a["total_rows"],
        a["rope_dim"],
        a["seq_starts"],
    )


BAD_GATHERS = {
    "rope 32": (dict(rope_dim=32), "rope_dim must be 0 or 64"),
    "rope in 528 rows": (
        dict(rope_dim=64, cache=torch.zeros(4, 16, 528, dtype=torch.uint8)),
        "needs 656-byte rows",
    ),
    "row bytes": (dict(cache=torch.zeros(4, 16, 512, dtype=torch.uint8)), "528 or 656 bytes"),
    "block size 0": (
        dict(cache=torch.zeros(4, 0, 656, dtype=torch.uint8)),
        "block_size must be >= 1",
    ),
    "table dtype": (dict(block_table=torch.zeros(2, 2)), "block_table must be int32/int64"),
    "table 1-D": (dict(block_table=torch.zeros(4, dtype=torch.int32)), "block_table must be"),
    "starts shape": (
        dict(workspace_starts=torch.tensor([0, 20, 30])),
        "workspace_starts must be \\[2\\]",
    ),
    "starts dtype": (
        dict(workspace_starts=torch.tensor([0.0, 20.0])),
        "workspace_starts must be int32 or int64",
    ),
    "seq shape": (dict(seq_starts=torch.tensor([0])), "seq_starts must be \\[2\\]"),
    "total rows negative": (dict(total_rows=-1), "total_rows must be >= 0"),
    "total rows float": (dict(total_rows=40.0), "total_rows must be an int"),
    "no requests": (
        dict(
            block_table=torch.zeros(0, 2, dtype=torch.int32),
            workspace_starts=torch.zeros(0, dtype=torch.int32),
            seq_starts=None,
        ),
        "no requests",
    ),
    "starts not at 0": (
        dict(workspace_starts=torch.tensor([1, 20], dtype=torch.int32)),
        "must start at 0",
    ),
    "starts decreasing": (
        dict(workspace_starts=torch.tensor([0, 50], dtype=torch.int32)),
        "non-decreasing",
    ),
    "negative seq start": (dict(seq_starts=torch.tensor([-1, 0])), "seq_starts must be >= 0"),
    "past the table": (dict(seq_starts=torch.tensor([20, 0])), "past its block_table row"),
    "block id out of range": (
        dict(block_table=torch.tensor([[0, 1], [2, 4]], dtype=torch.int32)),
        "block id outside",
    ),
    "block id -1": (
        dict(block_table=torch.tensor([[0, -1], [2, 3]], dtype=torch.int32)),
        "block id outside",
    ),
}


@pytest.mark.parametrize("name", list(BAD_GATHERS))
def test_gather_rejects_bad_arguments_before_launch(no_launch, name):
    overrides, message = BAD_GATHERS[name]
    with pytest.raises(ValueError, match=message):
        call_gather(**overrides)


@pytest.mark.parametrize(("rope_dim", "row_bytes"), [(0, 528), (0, 656), (64, 656)])
def test_valid_gather_stops_only_at_the_device_check(no_launch, rope_dim, row_bytes):
    args = gather_args(rope_dim, row_bytes)
    with pytest.raises(ValueError, match="need tensors on a CUDA device"):
        call_gather(**args)
    with pytest.raises(ValueError, match="need tensors on a CUDA device"):
        call_gather(**{**args, "seq_starts": None, "block_table": args["block_table"].long()})


def test_gather_into_checks_the_output(no_launch):
    a = gather_args()
    out = torch.empty(40, 576, dtype=torch.float32)
    with pytest.raises(ValueError, match="CUDA device"):  # the device check comes first here
        ops.gather_upconvert_into(out, a["cache"], a["block_table"], a["workspace_starts"], 40, 0)


# ---------------------------------------------------------------- the memcheck driver's own logic


def _emulated_write_unchecked(cache, kv_c, k_pe, slots, fmt):
    """The kernel's unchecked semantics in torch: slots outside [0, capacity) are skipped."""
    capacity = cache.shape[0] * cache.shape[1]
    keep = (slots >= 0) & (slots < capacity)
    rowformat.write_cache(
        cache, kv_c, k_pe, torch.where(keep, slots, torch.full_like(slots, -1)), fmt
    )


def _emulated_gather_into(out, cache, table, starts, total_rows, rope_dim, seq_starts=None):
    """The kernel's unchecked semantics: the last request whose start <= row owns it; a table
    entry outside the cache gives a NaN row."""
    flat = cache.view(-1, cache.shape[-1])
    bs = cache.shape[1]
    for row in range(total_rows):
        r = int((starts <= row).nonzero().max()) if bool((starts <= row).any()) else 0
        pos = (int(seq_starts[r]) if seq_starts is not None else 0) + row - int(starts[r])
        col = pos // bs
        block = int(table[r, col]) if pos >= 0 and col < table.shape[1] else -1
        if 0 <= block < cache.shape[0]:
            latent, rope = rowformat.dequantize_rows(flat[block * bs + pos % bs][None])
            out[row, : g.LATENT_DIM] = latent[0]
            out[row, g.LATENT_DIM :] = rope[0] if rope_dim else 0
        else:
            out[row] = float("nan")
    return out


def test_boundary_driver_passes_with_the_reference_in_place_of_the_kernels(monkeypatch):
    """Runs every outcome of `python -m nopebench.cache_kernels.boundary` on the CPU with the
    kernels' semantics emulated, so its own expectations are checked before GPU time is spent."""
    from nopebench.cache_kernels import boundary

    monkeypatch.setattr(ops, "write_cache", rowformat.write_cache)
    monkeypatch.setattr(ops, "gather_upconvert", rowformat.gather_upconvert)
    monkeypatch.setattr(ops, "write_cache_unchecked", _emulated_write_unchecked)
    monkeypatch.setattr(ops, "gather_upconvert_into", _emulated_gather_into)
    cases = boundary.boundary_cases()
    assert len(cases) == 48 and len({c.case_id for c in cases}) == 48
    for kind in boundary.ROW_KINDS:
        layouts = {c.strided_inputs for c in cases if (c.row_bytes, c.rope_dim) == kind}
        assert layouts == {True, False}
    outcomes = boundary.all_outcomes("cpu")
    failed = {o.name: o.detail for o in outcomes if not o.passed}
    assert not failed, failed


def test_boundary_driver_catches_a_wrong_kernel(monkeypatch):
    from nopebench.cache_kernels import boundary

    monkeypatch.setattr(ops, "write_cache_unchecked", lambda *args: None)  # writes nothing
    outcome = boundary.unchecked_write_outcome("cpu")
    assert not outcome.passed and "bytes differ" in outcome.detail

    def no_nan_rows(out, cache, table, starts, total_rows, rope_dim, seq_starts=None):
        _emulated_gather_into(out, cache, table, starts, total_rows, rope_dim, seq_starts)
        return out.nan_to_num_(0.0)

    monkeypatch.setattr(ops, "gather_upconvert_into", no_nan_rows)
    outcome = boundary.unchecked_gather_outcome("cpu")
    assert not outcome.passed and "not all NaN" in outcome.detail
