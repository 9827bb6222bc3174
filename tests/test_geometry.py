"""The pure geometry functions every derived number comes from."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nopebench import geometry as g


def test_row_layout_constants():
    assert (g.LATENT_DIM, g.TILE, g.N_TILES, g.ROPE_DIM) == (512, 128, 4, 64)
    assert (g.SCALE_OFFSET, g.ROPE_OFFSET) == (512, 528)
    assert (g.FULL_ROW_BYTES, g.NOPE_ROW_BYTES, g.UPCONVERT_DIM) == (656, 528, 576)
    assert g.FP8_MAX == 448.0


@pytest.mark.parametrize(
    ("topk", "kpool", "width"),
    [
        (2048, 4, 2176),
        (2048, 1, 2048),
        (2048, 2, 2176),
        (128, 1, 128),
        (1, 1, 128),
        (2049, 1, 2176),
        (2046, 3, 2048),
    ],
)
def test_topk_buffer_width(topk, kpool, width):
    assert g.topk_buffer_width(topk, kpool) == width


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 1 << 17), st.integers(1, 1024))
def test_topk_buffer_width_is_the_smallest_aligned_cover(topk, kpool):
    width = g.topk_buffer_width(topk, kpool)
    active = g.max_active_topk(topk, kpool)
    assert active == topk + kpool - 1
    assert width % g.TOPK_ALIGN == 0
    assert active <= width < active + g.TOPK_ALIGN


@pytest.mark.parametrize(("topk", "kpool"), [(0, 1), (-1, 4), (2048, 0), (2048, -3)])
def test_topk_buffer_width_rejects_non_positive(topk, kpool):
    with pytest.raises(ValueError):
        g.topk_buffer_width(topk, kpool)


def test_round_up():
    assert [g.round_up(v, 128) for v in (0, 1, 127, 128, 129, 2051)] == [
        0,
        128,
        128,
        128,
        256,
        2176,
    ]
    with pytest.raises(ValueError):
        g.round_up(5, 0)


def test_widths_by_rope():
    assert (g.qk_dim(0), g.qk_dim(64)) == (512, 576)
    assert (g.row_bytes_read(0), g.row_bytes_read(64)) == (528, 656)


def test_cost_model():
    # 2 * T * H * active * (d_qk + 512)
    assert g.decode_flops(512, 16, 2048, 512) == 2 * 512 * 16 * 2048 * 1024
    assert g.decode_bytes(1, 16, 2048, 528, 512) == 2048 * 528 + 16 * 512 * 2 + 16 * 512 * 2
    assert (
        g.decode_bytes(2, 128, 10, 656, 576) == 2 * 10 * 656 + 2 * 128 * 576 * 2 + 2 * 128 * 512 * 2
    )
    assert g.cache_write_bytes(3, 0, 528) == 3 * (1024 + 528)
    assert g.cache_write_bytes(3, 64, 656) == 3 * (1024 + 128 + 656)
    assert g.gather_bytes(5, 656) == 5 * (656 + 1152)
