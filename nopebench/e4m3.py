"""An independent float8_e4m3fn encoder and the e4m3 rounding bound, in numpy.

verify-layout checks the reference writer (which uses torch's cast) against this bit-level
construction, so a bug in either shows up as a byte mismatch rather than agreeing with itself.
"""

from __future__ import annotations

import numpy as np

EXP_BIAS = 7
MANT_BITS = 3
MIN_NORMAL_EXP = -6  # 2**-6, code 0x08
SUBNORMAL_STEP = 2.0**-9  # spacing below 2**-6
MAX_FINITE = 448.0
MAX_CODE = 0x7E  # 448
NAN_CODE = 0x7F


def encode(values: np.ndarray) -> np.ndarray:
    """Round float32 values to e4m3fn bytes: nearest-even, saturating at +-448, NaN -> 0x7F/0xFF.

    Exponent and mantissa are taken with frexp, so every step is exact in float64.
    """
    with np.errstate(invalid="ignore"):  # signalling NaNs widen quietly: they encode as NaN
        v = np.asarray(values, dtype=np.float32).astype(np.float64)
    sign = np.signbit(v).astype(np.uint8) << 7
    a = np.abs(v)
    nan = np.isnan(a)
    a = np.where(nan, 0.0, np.minimum(a, MAX_FINITE))  # saturate (inf included)
    code = np.zeros(a.shape, dtype=np.int64)

    sub = a < 2.0**MIN_NORMAL_EXP
    # Subnormals: multiples of 2**-9; rounding up to 8 lands exactly on the min normal code.
    code[sub] = np.rint(a[sub] / SUBNORMAL_STEP).astype(np.int64)

    norm = ~sub
    _, exp = np.frexp(a[norm])  # a = m * 2**exp, m in [0.5, 1)
    e = exp.astype(np.int64) - 1  # a in [2**e, 2**(e+1))
    steps = np.rint(a[norm] / np.ldexp(1.0, e - MANT_BITS)).astype(np.int64)  # 8..16
    carry = steps == 2 ** (MANT_BITS + 1)
    e = e + carry
    steps = np.where(carry, 2**MANT_BITS, steps)
    code[norm] = ((e + EXP_BIAS) << MANT_BITS) | (steps - 2**MANT_BITS)
    code = np.minimum(code, MAX_CODE)  # 448 rounds to itself; saturation already applied
    out = code.astype(np.uint8) | sign
    return np.where(nan, NAN_CODE | sign, out).astype(np.uint8)


def rounding_bound(scaled: np.ndarray) -> np.ndarray:
    """Largest |fp8(x) - x| for x = `scaled` (already divided by its scale), in scaled units.

    Half a unit in the last place: 2**(e-4) for |x| in [2**e, 2**(e+1)) with e >= -6, and
    2**-10 in the subnormal range. Above 448 the error is |x| - 448 (saturation).
    """
    a = np.abs(np.asarray(scaled, dtype=np.float64))
    _, exp = np.frexp(np.maximum(a, 2.0**MIN_NORMAL_EXP))
    half_ulp = np.ldexp(1.0, exp.astype(np.int64) - 1 - MANT_BITS - 1)
    return np.where(a > MAX_FINITE, a - MAX_FINITE, half_ulp)
