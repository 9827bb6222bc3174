"""Properties of the reference fp8_ds_mla row (rowformat.py), over random values and geometries.

What a row must satisfy: scales as specified, dequantization within the
e4m3 rounding bound, NoPE tails zero, RoPE tails bit-exact, skipped slots untouched; the gather
reads exactly the slots a plain per-request loop says; every argument error is a ValueError
raised before anything is written.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nopebench import e4m3, rowformat
from nopebench import geometry as g

PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SENTINEL = 0x5A
BF16_MAX = 3.3895313892515355e38
TILE_KINDS = ("normal", "wide", "zero", "subnormal", "huge", "pow2_edge", "specials")


# ---------------------------------------------------------------- strategies


@st.composite
def latents(draw, max_tokens: int = 5) -> torch.Tensor:
    """[T, 512] bf16 latent rows whose tiles each have a drawn kind and magnitude."""
    t = draw(st.integers(1, max_tokens))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    tiles = []
    for _ in range(t * g.N_TILES):
        kind = draw(st.sampled_from(TILE_KINDS))
        base = torch.randn(g.TILE, generator=gen, dtype=torch.float64)
        if kind == "normal":
            tile = base * 2.0 ** draw(st.integers(-60, 60))
        elif kind == "wide":  # magnitudes spread over ~40 binades inside one tile
            tile = base * torch.pow(2.0, torch.randint(-40, 1, (g.TILE,), generator=gen).double())
        elif kind == "zero":
            tile = torch.zeros(g.TILE, dtype=torch.float64) * draw(st.sampled_from([1.0, -1.0]))
        elif kind == "subnormal":  # bf16 subnormals: below 2**-126
            tile = base * 2.0 ** draw(st.integers(-133, -127))
        elif kind == "huge":
            tile = (base.clamp(-1, 1) * BF16_MAX).clamp(-BF16_MAX, BF16_MAX)
        elif kind == "pow2_edge":  # amax / 448 exactly a power of two, or the next bf16 above it
            j = draw(st.integers(-30, 30))
            amax = 448.0 * 2.0**j * draw(st.sampled_from([1.0, 450 / 448, 446 / 448]))
            tile = (base.clamp(-1, 1) * amax).clamp(-amax, amax)
            tile[draw(st.integers(0, g.TILE - 1))] = amax * draw(st.sampled_from([1.0, -1.0]))
        else:
            vals = draw(
                st.lists(st.floats(-BF16_MAX, BF16_MAX, width=32), min_size=1, max_size=g.TILE)
            )
            tile = torch.zeros(g.TILE, dtype=torch.float64)
            tile[: len(vals)] = torch.tensor(vals, dtype=torch.float64)
        tiles.append(tile)
    x = torch.stack(tiles).view(t, g.LATENT_DIM).float().to(torch.bfloat16)
    assert bool(torch.isfinite(x).all())
    return x


@st.composite
def write_problems(draw):
    """(kv_c, k_pe, slot_mapping, num_blocks, block_size, row_bytes, scale_format)."""
    kv_c = draw(latents())
    t = kv_c.shape[0]
    rope = draw(st.sampled_from([0, 64]))
    row_bytes = (
        g.FULL_ROW_BYTES if rope else draw(st.sampled_from([g.FULL_ROW_BYTES, g.NOPE_ROW_BYTES]))
    )
    block_size = draw(st.sampled_from([16, 32, 64]))
    num_blocks = draw(st.integers(1, 3))
    capacity = num_blocks * block_size
    slots = draw(st.lists(st.integers(0, capacity - 1), min_size=t, max_size=t, unique=True))
    skip = draw(st.lists(st.booleans(), min_size=t, max_size=t))
    slot_mapping = torch.tensor(
        [-1 if s else v for s, v in zip(skip, slots, strict=True)],
        dtype=draw(st.sampled_from([torch.int32, torch.int64])),
    )
    k_pe = None
    if rope:
        k_pe = (
            torch.randn(t, rope, generator=torch.Generator().manual_seed(t))
            * 10.0 ** draw(st.integers(-30, 30))
        ).to(torch.bfloat16)
    elif draw(st.booleans()):
        k_pe = torch.empty(t, 0, dtype=torch.bfloat16)  # NoPE passed as [T, 0], as vLLM does
    fmt = draw(st.sampled_from(rowformat.SCALE_FORMATS))
    return kv_c, k_pe, slot_mapping, num_blocks, block_size, row_bytes, fmt


def sentinel_cache(num_blocks: int, block_size: int, row_bytes: int) -> torch.Tensor:
    return torch.full((num_blocks, block_size, row_bytes), SENTINEL, dtype=torch.uint8)


def dequant_bound(x: torch.Tensor, scales: torch.Tensor, deq: torch.Tensor) -> torch.Tensor:
    """|dequant - x| may be: scale * e4m3 half-ulp of fl(x / scale) (plus saturation), then
    bf16 rounding of the product (half an ulp, 2**-9 relative, doubled for the fp32 product's
    own rounding) and half the bf16 subnormal spacing 2**-134."""
    scaled = (x.float().view(-1, g.N_TILES, g.TILE) / scales.unsqueeze(-1)).numpy()
    half_ulp = torch.from_numpy(e4m3.rounding_bound(scaled))
    d = deq.double().view(-1, g.N_TILES, g.TILE)
    return scales.double().unsqueeze(-1) * half_ulp + d.abs() * 2.0**-8 + 2.0**-134


# ---------------------------------------------------------------- write, dequantize


@PROPERTY
@given(write_problems())
def test_write_then_dequantize_within_e4m3_bound(problem):
    kv_c, k_pe, slot_mapping, num_blocks, block_size, row_bytes, fmt = problem
    cache = sentinel_cache(num_blocks, block_size, row_bytes)
    rowformat.write_cache(cache, kv_c, k_pe, slot_mapping, fmt)

    keep = slot_mapping >= 0
    flat = cache.view(-1, row_bytes)
    rows = rowformat.read_slots(cache, slot_mapping[keep])
    deq, rope = rowformat.dequantize_rows(rows)
    x = kv_c[keep]
    scales = rowformat.tile_scales(x, fmt)
    err = (deq.double() - x.double()).abs().view(-1, g.N_TILES, g.TILE)
    assert bool((err <= dequant_bound(x, scales, deq)).all())
    # Signs survive, and zero stays exactly zero.
    assert bool(((deq.float() == 0) | (deq.float().sign() == x.float().sign())).all())
    assert bool((deq[x == 0] == 0).all())

    # The stored scales are the ones the spec defines; the rows are exactly pack_rows'.
    stored = rows[:, g.SCALE_OFFSET : g.ROPE_OFFSET].contiguous().view(torch.float32)
    assert torch.equal(stored, scales)
    assert torch.equal(
        rows, rowformat.pack_rows(x, None if k_pe is None else k_pe[keep], fmt, row_bytes)
    )

    # Tails: RoPE bit-exact, NoPE zero in 656-byte rows.
    if row_bytes == g.FULL_ROW_BYTES:
        tail = rows[:, g.ROPE_OFFSET :]
        if k_pe is not None and k_pe.shape[1]:
            assert torch.equal(rope.view(torch.int16), k_pe[keep].view(torch.int16))
        else:
            assert not bool(tail.any())
    else:
        assert rope is None

    # Every slot nobody wrote still holds the sentinel.
    untouched = torch.ones(flat.shape[0], dtype=torch.bool)
    untouched[slot_mapping[keep].long()] = False
    assert bool((flat[untouched] == SENTINEL).all())


@PROPERTY
@given(latents(), st.sampled_from(rowformat.SCALE_FORMATS))
def test_latent_bytes_equal_the_independent_encoder(kv_c, fmt):
    """The packed latent is e4m3.encode(x / scale) with the divide done in numpy fp32."""
    rows = rowformat.pack_rows(kv_c, None, fmt, g.NOPE_ROW_BYTES)
    scales = rows[:, g.SCALE_OFFSET :].contiguous().view(torch.float32).numpy()
    x = kv_c.float().numpy().reshape(-1, g.N_TILES, g.TILE)
    expected = e4m3.encode((x / scales[:, :, None]).astype(np.float32)).reshape(-1, g.LATENT_DIM)
    np.testing.assert_array_equal(rows[:, : g.SCALE_OFFSET].numpy(), expected)


@pytest.mark.parametrize("j", [-20, 0, 7])
def test_quantize_is_a_true_divide(j):
    """x / scale, not x * (1 / scale): with scale 7 * 2**j, fl(1/7) is 4e-8 high, so
    x = 1.5625 * scale (an exact e4m3 tie, even neighbour 1.5) lands on 1.625 when multiplied."""
    scale = 7.0 * 2.0**j
    x = torch.zeros(1, 512, dtype=torch.float64)
    x[0, 0] = 448.0 * scale  # amax: the arbitrary scale is exactly 7 * 2**j
    x[0, 1] = 1.5625 * scale
    x[0, 2] = -1.8125 * scale  # tie between 1.75 (even) and 1.875
    x = x.to(torch.bfloat16)
    assert x.double()[0, 1].item() == 1.5625 * scale
    rows = rowformat.pack_rows(x, None, "arbitrary_fp32", g.NOPE_ROW_BYTES)
    assert rows[0, 512:516].view(torch.float32).item() == scale
    assert rowformat.dequantize_rows(rows)[0][0, 1:3].double().tolist() == [
        1.5 * scale,
        -1.75 * scale,
    ]


@PROPERTY
@given(latents(max_tokens=3), st.sampled_from(rowformat.SCALE_FORMATS))
def test_strided_inputs_write_the_same_bytes(kv_c, fmt):
    t = kv_c.shape[0]
    buf = torch.zeros(t, 640, dtype=torch.bfloat16)
    buf[:, :512] = kv_c
    buf[:, 512:576] = 3.0
    strided = sentinel_cache(1, 64, 656)
    contig = sentinel_cache(1, 64, 656)
    slots = torch.arange(t)
    rowformat.write_cache(strided, buf[:, :512], buf[:, 512:576], slots, fmt)
    rowformat.write_cache(contig, kv_c.clone(), buf[:, 512:576].clone(), slots, fmt)
    assert torch.equal(strided, contig)


def test_row_bytes_by_hand():
    """One row built byte by byte: tile 0 amax 448 (scale 1), tile 1 zero, tile 2 amax 896,
    tile 3 tiny."""
    x = torch.zeros(1, 512)
    x[0, 0], x[0, 1], x[0, 2] = 448.0, -1.0625, 3.0  # 1.0625 is a tie: rounds to 1.0
    x[0, 256], x[0, 257] = -896.0, 1.0
    x[0, 384] = 1e-30
    rope = torch.arange(64, dtype=torch.float32).view(1, 64).to(torch.bfloat16)
    row = rowformat.pack_rows(x.to(torch.bfloat16), rope, "arbitrary_fp32", 656)[0]
    assert row[:3].tolist() == [0x7E, 0xB8, 0x44]  # 448, -1.0, 3.0
    assert not row[3:128].any() and not row[128:256].any()
    assert row[256:258].tolist() == [0xFE, 0x30]  # -448, 1/2
    scales = row[512:528].view(torch.float32).tolist()
    assert scales[0] == 1.0 and scales[1] == rowformat.FLT_MIN and scales[2] == 2.0
    tiny = np.float32(torch.tensor(1e-30).to(torch.bfloat16).item())
    assert scales[3] == np.float32(tiny / np.float32(448))
    assert torch.equal(row[528:].view(torch.bfloat16), rope[0])
    pow2 = rowformat.pack_rows(x.to(torch.bfloat16), rope, "pow2_fp32", 656)[0]
    assert pow2[512:528].view(torch.float32).tolist() == [1.0, 2.0**-13, 2.0, 2.0**-13]


# ---------------------------------------------------------------- scales


@PROPERTY
@given(latents())
def test_pow2_scales_are_minimal_powers_of_two_that_never_saturate(kv_c):
    scales = rowformat.tile_scales(kv_c, "pow2_fp32").double()
    amax = kv_c.double().view(-1, g.N_TILES, g.TILE).abs().amax(-1)
    mant, _ = torch.frexp(scales)
    assert bool((mant == 0.5).all())
    assert bool((amax / scales <= g.FP8_MAX).all())
    floor = torch.clamp_min(amax / g.FP8_MAX, rowformat.POW2_FLOOR)
    assert bool((scales / 2 < floor.float().double()).all())  # the smallest such power


@pytest.mark.parametrize("j", [-13, -1, 0, 1, 20, 100])
def test_pow2_scale_just_above_a_power_of_two(j):
    """amax / 448 = 2**j * (1 + tiny): the scale must be 2**(j + 1), or x / scale exceeds 448.

    With fp32 input the excess can be 2**-20 relative, which log2 in fp32 rounds away for
    larger j; bf16 input can only be 2 ** -7.8 above (450 / 448).
    """
    exact = 448.0 * 2.0**j
    for amax, dtype, expected in [
        (exact, torch.bfloat16, 2.0**j),
        (exact * 450 / 448, torch.bfloat16, 2.0 ** (j + 1)),  # the next bf16 above
        (exact * 446 / 448, torch.bfloat16, 2.0**j),
        (exact * (1 + 2**-20), torch.float32, 2.0 ** (j + 1)),
        (exact * (1 - 2**-21), torch.float32, 2.0**j),
    ]:
        x = torch.zeros(1, 512, dtype=torch.float64)
        x[0, :128] = amax
        x = x.to(dtype)
        assert float(x[0, 0]) == amax  # exactly representable
        s = rowformat.tile_scales(x, "pow2_fp32")[0, 0].item()
        assert s == expected, (j, amax, s)
        q = rowformat.quantize_latent(x, rowformat.tile_scales(x, "pow2_fp32"))
        assert q.float()[0, 0].item() <= 448.0


def test_scale_of_all_zero_tiles():
    x = torch.zeros(2, 512, dtype=torch.bfloat16)
    x[1] = -0.0
    assert bool((rowformat.tile_scales(x, "arbitrary_fp32") == rowformat.FLT_MIN).all())
    assert bool((rowformat.tile_scales(x, "pow2_fp32") == 2.0**-13).all())
    rows = rowformat.pack_rows(x, None, "arbitrary_fp32", 528)
    assert (
        rows[0, :512].tolist() == [0] * 512 and rows[1, :512].tolist() == [0x80] * 512
    )  # +-0 kept
    deq, _ = rowformat.dequantize_rows(rows)
    assert torch.equal(deq.view(torch.int16), x.view(torch.int16))


@PROPERTY
@given(latents())
def test_arbitrary_scales_follow_the_spec(kv_c):
    scales = rowformat.tile_scales(kv_c, "arbitrary_fp32")
    amax = kv_c.float().view(-1, g.N_TILES, g.TILE).abs().amax(-1)
    expected = np.maximum(amax.numpy() / np.float32(448.0), np.finfo(np.float32).tiny)
    np.testing.assert_array_equal(scales.numpy(), expected)
    q = rowformat.quantize_latent(kv_c, scales).float()
    assert bool((q.abs() <= 448).all())


# ---------------------------------------------------------------- gather


def slow_plan(block_table, workspace_starts, total_rows, block_size, seq_starts):
    """The gather's slot for each output row, one Python loop per request."""
    reqs = len(workspace_starts)
    out = []
    for r in range(reqs):
        end = workspace_starts[r + 1] if r + 1 < reqs else total_rows
        for i in range(end - workspace_starts[r]):
            pos = (seq_starts[r] if seq_starts is not None else 0) + i
            out.append(block_table[r][pos // block_size] * block_size + pos % block_size)
    return out


@st.composite
def gather_problems(draw):
    block_size = draw(st.sampled_from([16, 32, 64]))
    rope = draw(st.sampled_from([0, 64]))
    row_bytes = (
        g.FULL_ROW_BYTES if rope else draw(st.sampled_from([g.FULL_ROW_BYTES, g.NOPE_ROW_BYTES]))
    )
    lengths = draw(st.lists(st.integers(0, 3 * block_size), min_size=1, max_size=4))
    starts = [draw(st.integers(0, 2 * block_size)) for _ in lengths]
    need = [-(-(s + n) // block_size) for s, n in zip(starts, lengths, strict=True)]
    max_blocks = max(need + [1]) + draw(st.integers(0, 2))
    num_blocks = max(sum(need), 1) + draw(st.integers(0, 3))
    perm = draw(st.permutations(range(num_blocks)))
    table, at = [], 0
    for n in need:  # each request's own blocks, padded with -1 (never read)
        table.append(list(perm[at : at + n]) + [-1] * (max_blocks - n))
        at += n
    ws = [0, *np.cumsum(lengths)[:-1].tolist()]
    with_starts = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    return (
        block_size,
        rope,
        row_bytes,
        table,
        ws,
        int(sum(lengths)),
        starts if with_starts else None,
        num_blocks,
        seed,
    )


@PROPERTY
@given(gather_problems())
def test_gather_matches_slow_loop_and_dequantize(problem):
    block_size, rope, row_bytes, table, ws, total, starts, num_blocks, seed = problem
    gen = torch.Generator().manual_seed(seed)
    # Random bytes: NaN codes and NaN/inf scales included; the gather must copy them faithfully.
    cache = torch.randint(
        0, 256, (num_blocks, block_size, row_bytes), generator=gen, dtype=torch.uint8
    )
    before = cache.clone()
    bt = torch.tensor(table, dtype=torch.int32)
    wst = torch.tensor(ws, dtype=torch.int32)
    sst = torch.tensor(starts, dtype=torch.int32) if starts is not None else None

    plan = rowformat.gather_plan(cache, bt, wst, total, rope, sst)
    assert plan.tolist() == slow_plan(table, ws, total, block_size, starts)

    out = rowformat.gather_upconvert(cache, bt, wst, total, rope, sst)
    assert out.shape == (total, g.UPCONVERT_DIM) and out.dtype == torch.bfloat16
    latent, tail = rowformat.dequantize_rows(rowformat.read_slots(cache, plan))
    assert torch.equal(out[:, :512].view(torch.int16), latent.view(torch.int16))
    if rope:
        assert torch.equal(out[:, 512:].view(torch.int16), tail.view(torch.int16))
    else:  # NoPE lanes are exactly +0 whatever the tail bytes hold
        assert not bool(out[:, 512:].view(torch.int16).any())
    assert torch.equal(cache, before)


def test_gather_with_no_rows():
    cache = sentinel_cache(2, 16, 528)
    out = rowformat.gather_upconvert(
        cache, torch.zeros(1, 1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), 0, 0
    )
    assert out.shape == (0, 576)
    none = rowformat.gather_upconvert(
        cache, torch.zeros(0, 1, dtype=torch.int32), torch.zeros(0, dtype=torch.int32), 0, 0
    )
    assert none.shape == (0, 576)


# ---------------------------------------------------------------- argument errors


def _write_args(**over):
    """Valid write arguments with one thing changed."""
    args = {
        "cache": sentinel_cache(2, 16, 656),
        "kv_c": torch.ones(3, 512, dtype=torch.bfloat16),
        "k_pe": torch.ones(3, 64, dtype=torch.bfloat16),
        "slot_mapping": torch.tensor([0, -1, 5]),
        "scale_format": "arbitrary_fp32",
    }
    args.update(over)
    return args


BAD_WRITES = {
    "kv_c fp32": {"kv_c": torch.ones(3, 512)},
    "kv_c fp16": {"kv_c": torch.ones(3, 512, dtype=torch.float16)},
    "kv_lora_rank 256": {"kv_c": torch.ones(3, 256, dtype=torch.bfloat16)},
    "kv_c 3-d": {"kv_c": torch.ones(3, 1, 512, dtype=torch.bfloat16)},
    "pe_dim 32": {"k_pe": torch.ones(3, 32, dtype=torch.bfloat16)},
    "k_pe fp32": {"k_pe": torch.ones(3, 64)},
    "k_pe wrong T": {"k_pe": torch.ones(2, 64, dtype=torch.bfloat16)},
    "RoPE with 528-byte rows": {"cache": sentinel_cache(2, 16, 528)},
    "row bytes 600": {"cache": torch.full((2, 16, 600), SENTINEL, dtype=torch.uint8)},
    "cache int8": {"cache": torch.full((2, 16, 656), 5, dtype=torch.int8)},
    "cache 2-d": {"cache": torch.full((32, 656), SENTINEL, dtype=torch.uint8)},
    "slot out of range": {"slot_mapping": torch.tensor([0, -1, 32])},
    "slot far out of range": {"slot_mapping": torch.tensor([0, 1 << 40, 3])},
    "duplicate slot": {"slot_mapping": torch.tensor([7, -1, 7])},
    "slot_mapping float": {"slot_mapping": torch.tensor([0.0, 1.0, 2.0])},
    "slot_mapping int16": {"slot_mapping": torch.tensor([0, 1, 2], dtype=torch.int16)},
    "slot_mapping wrong length": {"slot_mapping": torch.tensor([0, 1])},
    "slot_mapping 2-d": {"slot_mapping": torch.tensor([[0, 1, 2]])},
    "bad scale format": {"scale_format": "fp8"},
    "kv_c on another device": {"kv_c": torch.ones(3, 512, dtype=torch.bfloat16, device="meta")},
    "k_pe on another device": {"k_pe": torch.ones(3, 64, dtype=torch.bfloat16, device="meta")},
    "slot_mapping on another device": {"slot_mapping": torch.tensor([0, -1, 5], device="meta")},
}


@pytest.mark.parametrize("name", list(BAD_WRITES))
def test_bad_write_raises_value_error_and_leaves_cache_unchanged(name):
    args = _write_args(**BAD_WRITES[name])
    before = args["cache"].clone()
    with pytest.raises(ValueError) as info:
        rowformat.write_cache(**args)
    assert "\n" not in str(info.value)
    assert torch.equal(args["cache"], before)


def test_noncontiguous_cache_rejected_and_unchanged():
    big = torch.full((2, 16, 700), SENTINEL, dtype=torch.uint8)
    cache = big[:, :, :656]
    with pytest.raises(ValueError):
        rowformat.write_cache(**_write_args(cache=cache))
    assert bool((big == SENTINEL).all())


def test_valid_write_args_do_write():
    """The baseline the bad cases perturb really is valid (so each raise is the named fault)."""
    args = _write_args()
    rowformat.write_cache(**args)
    flat = args["cache"].view(-1, 656)
    assert not bool((flat[0] == SENTINEL).all()) and not bool((flat[5] == SENTINEL).all())
    assert bool((flat[1] == SENTINEL).all())


def _gather_args(**over):
    args = {
        "cache": sentinel_cache(3, 16, 656),
        "block_table": torch.tensor([[0, 1], [2, -1]], dtype=torch.int32),
        "workspace_starts": torch.tensor([0, 20], dtype=torch.int32),
        "total_rows": 30,
        "rope_dim": 64,
        "seq_starts": None,
    }
    args.update(over)
    return args


BAD_GATHERS = {
    "rope_dim 32": {"rope_dim": 32},
    "rope 64 from 528-byte rows": {"cache": sentinel_cache(3, 16, 528)},
    "block_table float": {"block_table": torch.tensor([[0.0, 1.0], [2.0, -1.0]])},
    "block_table 1-d": {"block_table": torch.tensor([0, 1], dtype=torch.int32)},
    "workspace_starts wrong shape": {"workspace_starts": torch.tensor([0], dtype=torch.int32)},
    "workspace_starts not from 0": {"workspace_starts": torch.tensor([1, 20], dtype=torch.int32)},
    "workspace_starts decreasing": {"workspace_starts": torch.tensor([0, -1], dtype=torch.int32)},
    "workspace_starts past total": {"workspace_starts": torch.tensor([0, 31], dtype=torch.int32)},
    "seq_starts wrong shape": {"seq_starts": torch.tensor([0], dtype=torch.int32)},
    "seq_starts negative": {"seq_starts": torch.tensor([0, -1], dtype=torch.int32)},
    "total_rows negative": {"total_rows": -1},
    "rows with no requests": {
        "block_table": torch.zeros(0, 2, dtype=torch.int32),
        "workspace_starts": torch.zeros(0, dtype=torch.int32),
    },
    "position past block_table": {"total_rows": 40},
    "block id out of range": {"block_table": torch.tensor([[0, 3], [2, -1]], dtype=torch.int32)},
    "block id -1 read": {"seq_starts": torch.tensor([0, 8], dtype=torch.int32)},
}


@pytest.mark.parametrize("name", list(BAD_GATHERS))
def test_bad_gather_raises_value_error(name):
    args = _gather_args(**BAD_GATHERS[name])
    before = args["cache"].clone()
    with pytest.raises(ValueError):
        rowformat.gather_upconvert(**args)
    assert torch.equal(args["cache"], before)


def test_valid_gather_args_gather():
    out = rowformat.gather_upconvert(**_gather_args())
    assert out.shape == (30, 576)


@pytest.mark.parametrize("slots", [[-1], [48], [0, 1 << 33]])
def test_read_slots_rejects_out_of_range(slots):
    """A negative slot would otherwise wrap around to the end of the cache (Python indexing)."""
    with pytest.raises(ValueError):
        rowformat.read_slots(sentinel_cache(3, 16, 528), torch.tensor(slots))


@pytest.mark.parametrize(
    "rows",
    [
        torch.zeros(2, 600, dtype=torch.uint8),
        torch.zeros(2, 656, dtype=torch.int8),
        torch.zeros(656, dtype=torch.uint8),
    ],
)
def test_dequantize_rejects_bad_rows(rows):
    with pytest.raises(ValueError):
        rowformat.dequantize_rows(rows)


def test_nan_input_does_not_crash_the_writer():
    """Non-finite input is verify-layout's 'input finite' check to report; the writer must not
    raise or touch other slots."""
    x = torch.ones(2, 512, dtype=torch.bfloat16)
    x[0, 3] = math.nan
    x[1, 200] = math.inf
    cache = sentinel_cache(1, 16, 656)
    for fmt in rowformat.SCALE_FORMATS:
        rowformat.write_cache(cache, x, None, torch.tensor([2, 9]), fmt)
    flat = cache.view(-1, 656)
    assert bool((flat[[0, 1, 3, 4, 5, 6, 7, 8, 10]] == SENTINEL).all())


def test_the_cuda_kernels_number_the_scale_formats_in_rowformat_order():
    """The kernels take the format as an int: their enum must list the names in the same order."""
    import re
    from pathlib import Path

    from nopebench.cache_kernels.ops import SCALE_FORMAT_CODES

    header = (
        Path(__file__).parent.parent
        / "nopebench"
        / "cache_kernels"
        / "cuda"
        / "ds_mla_numerics.cuh"
    ).read_text()
    enum = re.search(r"enum ScaleFormat : int \{([^}]*)\}", header).group(1)
    codes = {name: int(code) for name, code in re.findall(r"k(\w+) = (\d+)", enum)}
    expected = {
        "ArbitraryFp32": SCALE_FORMAT_CODES["arbitrary_fp32"],
        "Pow2Fp32": SCALE_FORMAT_CODES["pow2_fp32"],
    }
    assert codes == expected
