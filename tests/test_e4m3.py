"""The independent e4m3 encoder against torch's cast path, and the rounding bound.

The reference writer quantizes with torch (`rowformat.quantize_latent`: fp32 divide, clamp to
+-448, cast); verify-layout checks it against `e4m3.encode`. These tests make sure the two agree
on every kind of float32 (ties, subnormals, +-0, saturation, inf, NaN), so a byte mismatch in
verify-layout means a broken writer, not two encoders that disagree with each other.
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nopebench import e4m3, rowformat
from nopebench.checks.layout import decode_e4m3

PROPERTY = settings(max_examples=60, deadline=None)


def torch_cast_path(values: np.ndarray) -> np.ndarray:
    """The reference writer's own cast: quantize_latent with unit scales (x / 1.0 is exact)."""
    flat = np.asarray(values, dtype=np.float32).ravel()
    pad = (-flat.size) % 512
    x = torch.from_numpy(np.concatenate([flat, np.zeros(pad, np.float32)])).view(-1, 512)
    q = rowformat.quantize_latent(x, torch.ones(x.shape[0], 4))
    return q.view(torch.uint8).numpy().ravel()[: flat.size]


def all_codes_values() -> np.ndarray:
    """The 254 finite e4m3fn values (both zeros included)."""
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], dtype=np.uint8)
    return decode_e4m3(codes)


def midpoints_and_neighbours() -> np.ndarray:
    """Every rounding midpoint between adjacent positive e4m3 values, and 3 float32 ulps either
    side of it (and of each value), both signs: where round-to-nearest-even is decided."""
    vals = np.unique(np.abs(all_codes_values()))
    mids = ((vals[1:].astype(np.float64) + vals[:-1]) / 2).astype(np.float32)
    centres = np.concatenate([vals, mids, np.float32([464.0, 480.0, 2.0**-6, 2.0**-10])])
    bits = centres.view(np.int32)[:, None] + np.arange(-3, 4, dtype=np.int32)[None, :]
    out = bits.ravel().view(np.float32)
    out = out[np.isfinite(out) & (out >= 0)]
    return np.concatenate([out, -out])


def test_encode_matches_torch_on_every_bf16_pattern():
    """All 65536 bf16 bit patterns (every finite, subnormal, inf and NaN bf16 value)."""
    bits = (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(e4m3.encode(bits), torch_cast_path(bits))


def test_encode_matches_torch_at_every_midpoint():
    values = midpoints_and_neighbours()
    np.testing.assert_array_equal(e4m3.encode(values), torch_cast_path(values))


def test_ties_round_to_even():
    # 1.0625 lies halfway between 1.0 (mantissa 000) and 1.125 (001): even wins, so 1.0.
    # 1.1875 lies between 1.125 (001) and 1.25 (010): 1.25. Same in the subnormal range.
    values = np.float32([1.0625, 1.1875, -1.0625, 2.0**-10, 3 * 2.0**-10, 432.0, 31 * 2.0**-5])
    got = decode_e4m3(e4m3.encode(values))
    np.testing.assert_array_equal(got, np.float32([1.0, 1.25, -1.0, 0.0, 2.0**-8, 448.0, 1.0]))
    np.testing.assert_array_equal(e4m3.encode(values), torch_cast_path(values))


def test_special_values():
    values = np.float32(
        [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 448.0, 449.0, 1e30, -1e30, 2.0**-9, 2.0**-11]
    )
    expected = np.uint8([0x00, 0x80, 0x7E, 0xFE, 0x7F, 0xFF, 0x7E, 0x7E, 0x7E, 0xFE, 0x01, 0x00])
    np.testing.assert_array_equal(e4m3.encode(values), expected)
    np.testing.assert_array_equal(torch_cast_path(values), expected)


def test_decode_encode_round_trip_on_every_code():
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], dtype=np.uint8)
    np.testing.assert_array_equal(e4m3.encode(decode_e4m3(codes)), codes)
    torch_vals = torch.from_numpy(codes).view(torch.float8_e4m3fn).float().numpy()
    np.testing.assert_array_equal(decode_e4m3(codes), torch_vals)


@PROPERTY
@given(st.lists(st.floats(width=32), min_size=1, max_size=300))
@example(
    [
        0.0,
        -0.0,
        float("nan"),
        float("inf"),
        -float("inf"),
        448.0,
        464.0,
        2.0**-10,
        3 * 2.0**-10,
        1e-45,
    ]
)
def test_encode_equals_torch_cast_on_arbitrary_float32(values):
    v = np.array(values, dtype=np.float32)
    np.testing.assert_array_equal(e4m3.encode(v), torch_cast_path(v))


@PROPERTY
@given(
    st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1, max_size=300)
)
def test_rounding_bound_holds_and_is_tight_at_ties(values):
    v = np.array(values, dtype=np.float32)
    err = np.abs(decode_e4m3(e4m3.encode(v)).astype(np.float64) - v.astype(np.float64))
    bound = e4m3.rounding_bound(v)
    assert np.all(err <= bound)


def test_rounding_bound_is_attained_at_midpoints():
    vals = np.unique(np.abs(all_codes_values()))
    mids = ((vals[1:].astype(np.float64) + vals[:-1]) / 2).astype(np.float32)
    err = np.abs(decode_e4m3(e4m3.encode(mids)).astype(np.float64) - mids)
    np.testing.assert_array_equal(err, e4m3.rounding_bound(mids))
    # Above 448 the bound is the saturation error.
    assert e4m3.rounding_bound(np.float32([500.0]))[0] == 52.0
