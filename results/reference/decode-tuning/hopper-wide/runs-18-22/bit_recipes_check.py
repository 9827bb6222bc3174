"""CPU check of run 18's two integer recipes for e4m3 codes (branch wip/producer-recipes,
`hopper_ws_decode._F16_BITS_ASM` and `_F32_BITS_ASM`): the same shifts and masks in numpy, for
every code in every byte position of a 32-bit word (with another code beside it, so a leak
between bytes shows), against torch's float8_e4m3fn conversion.

    python3 bit_recipes_check.py
"""

import numpy as np
import torch

codes = np.arange(256, dtype=np.uint32)
ref = torch.from_numpy(codes.astype(np.uint8)).view(torch.float8_e4m3fn).float().numpy()
finite = ~np.isnan(ref)
bad = 0
for pos in range(4):
    w = ((codes << (8 * pos)) | (0x5A << (8 * ((pos + 1) % 4)))).astype(np.uint32)
    # f16 recipe: even bytes to the high byte of each 16-bit half, odd bytes in place, then
    # (bits >> 1) keeps sign, exponent and mantissa in f16 places: value * 2^-8.
    even = (((w << 7) & 0x3F803F80) | ((w << 8) & 0x80008000)).astype(np.uint32)
    odd = (((w >> 1) & 0x3F803F80) | (w & 0x80008000)).astype(np.uint32)
    half = {0: even & 0xFFFF, 1: odd & 0xFFFF, 2: even >> 16, 3: odd >> 16}[pos]
    f16 = half.astype(np.uint16).view(np.float16).astype(np.float32) * np.float32(256)
    # fp32 recipe: the byte at the top, arithmetic shift by 4, mask: value * 2^-120 (fp32
    # subnormals for e4m3 subnormals), then times 2^120.
    top = ((w << {0: 24, 1: 16, 2: 8, 3: 0}[pos]) & 0xFFFFFFFF).astype(np.uint32)
    bits = ((top.view(np.int32) >> 4).view(np.uint32) & 0x87F00000).astype(np.uint32)
    f32 = (bits.view(np.float32).astype(np.float64) * 2.0**120).astype(np.float32)
    for name, got in (("f16bits", f16), ("f32bits", f32)):
        wrong = finite & (got != ref)
        bad += int(wrong.sum())
        print(
            f"{name} byte {pos}: {int((finite & (got == ref)).sum())} of {int(finite.sum())} "
            f"finite codes exact"
        )
print("all exact" if bad == 0 else f"{bad} mismatches")
