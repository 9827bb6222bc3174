// Per-value numerics of the fp8_ds_mla row, shared by the kernels and a host-side check.
//
// Everything here is __host__ __device__ so that kernels/numerics_check.cu can run the exact
// same functions on the CPU against nopebench/rowformat.py (tests/test_cache_kernels.py); on
// the device the intrinsics below are used, on the host their IEEE equivalents.
//
// The rules that make the kernels bit-exact with the reference:
//   * amax is taken on bf16 bit patterns with the sign cleared: for non-negative floats the
//     integer order is the float order, so -0, subnormals and infinities need no special case,
//     and a NaN (a pattern above the infinity's) wins the max as it does in torch's amax
//     (the arbitrary_fp32 scale of such a tile is then the canonical NaN, as torch's).
//   * arbitrary_fp32 scale: max(amax / 448, FLT_MIN), an IEEE divide (not a reciprocal).
//   * pow2_fp32 scale: 2 ** ceil(log2(max(amax / 448, 1e-4))), the exponent read off the
//     float's bits (exact, like the reference's frexp); infinity and NaN give 1.0, as torch's
//     frexp (exponent 0) does.
//   * quantization: fp8_e4m3(x / scale), IEEE divide, round-to-nearest-even saturating
//     conversion (the reference's clamp(+-448) then cast).
//   * dequantization: fp8 -> half (exact) -> float, one rounded multiply by the scale, bf16 RNE
//     (integer rounding, exact for subnormal products).
// Build without fast math: subnormal inputs and scales must survive the divide and multiply.

#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>
#include <string.h>

#define NC_HD __host__ __device__ __forceinline__

namespace nopecache {

constexpr float kFp8Max = 448.0f;
constexpr float kFltMin = 1.17549435082228750797e-38f;
constexpr float kPow2Floor = 1e-4f;

enum ScaleFormat : int { kArbitraryFp32 = 0, kPow2Fp32 = 1 };

NC_HD float bits_to_float(uint32_t bits) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  float f;
  memcpy(&f, &bits, sizeof(f));
  return f;
#endif
}

NC_HD uint32_t float_to_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t bits;
  memcpy(&bits, &f, sizeof(bits));
  return bits;
#endif
}

NC_HD float div_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;  // SSE divide: IEEE, round to nearest even, subnormals kept
#endif
}

NC_HD float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);  // never contracted into an FMA
#else
  return a * b;
#endif
}

// Per-halfword unsigned max of two words holding two 16-bit patterns each.
NC_HD uint32_t max_u16x2(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
  return __vmaxu2(a, b);
#else
  const uint32_t lo = (a & 0xffffu) > (b & 0xffffu) ? (a & 0xffffu) : (b & 0xffffu);
  const uint32_t hi = (a >> 16) > (b >> 16) ? (a >> 16) : (b >> 16);
  return lo | (hi << 16);
#endif
}

// Largest |bf16| of 8 values packed in 4 words, as a 16-bit pattern.
NC_HD uint32_t abs_max8(uint4 w) {
  uint32_t m = max_u16x2(w.x & 0x7fff7fffu, w.y & 0x7fff7fffu);
  m = max_u16x2(m, max_u16x2(w.z & 0x7fff7fffu, w.w & 0x7fff7fffu));
  const uint32_t lo = m & 0xffffu, hi = m >> 16;
  return lo > hi ? lo : hi;
}

// Per-tile scale from the tile's largest bf16 magnitude (bit pattern, sign cleared).
NC_HD float tile_scale(uint32_t amax_bits, int scale_format) {
  const float amax = bits_to_float(amax_bits << 16);
  // NaN tile: torch's amax gives the canonical quiet NaN, and frexp(NaN) an exponent of 0.
  if (amax != amax) return scale_format == kArbitraryFp32 ? bits_to_float(0x7fc00000u) : 1.0f;
  float ratio = div_rn(amax, kFp8Max);
  if (scale_format == kArbitraryFp32) return ratio < kFltMin ? kFltMin : ratio;
  ratio = ratio < kPow2Floor ? kPow2Floor : ratio;
  const uint32_t bits = float_to_bits(ratio);
  if ((bits & 0x7f800000u) == 0x7f800000u) return 1.0f;  // frexp(inf): exponent 0
  // ratio = 1.m * 2**(E-127) is normal here (>= 1e-4); ceil(log2) adds one unless m == 0.
  const uint32_t exponent = (bits >> 23) + ((bits & 0x7fffffu) != 0u ? 1u : 0u);
  return bits_to_float(exponent << 23);
}

// Two bf16 (one word) divided by the scale, to two e4m3 bytes (low byte = first value).
// A quotient that is an fp32 subnormal rounds to a signed zero; that byte is set from the
// sign directly so the result does not depend on how the converter treats subnormal input.
NC_HD uint32_t quantize_pair(uint32_t w, float scale) {
  float2 q;
  q.x = div_rn(bits_to_float(w << 16), scale);
  q.y = div_rn(bits_to_float(w & 0xffff0000u), scale);
  uint32_t bytes = static_cast<uint32_t>(__nv_cvt_float2_to_fp8x2(q, __NV_SATFINITE, __NV_E4M3));
  const uint32_t bx = float_to_bits(q.x), by = float_to_bits(q.y);
  if ((bx & 0x7f800000u) == 0u) bytes = (bytes & 0xff00u) | ((bx >> 24) & 0x80u);
  if ((by & 0x7f800000u) == 0u) bytes = (bytes & 0x00ffu) | ((by >> 16) & 0x8000u);
  return bytes;
}

// float -> bf16 bits, round to nearest even, in integer arithmetic: exact for subnormals
// without relying on the converter's subnormal mode. NaN becomes the quiet NaN 0x7fc0
// with its sign (the gather check treats every NaN alike).
NC_HD uint32_t bf16_bits_rn(float f) {
  const uint32_t bits = float_to_bits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return ((bits >> 16) & 0x8000u) | 0x7fc0u;
  return (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
}

// Two e4m3 bytes (low 16 bits) times the scale, to two bf16 (one word, first value low).
NC_HD uint32_t dequantize_pair(uint32_t bytes, float scale) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(bytes & 0xffffu), __NV_E4M3);
  __half_raw lo, hi;
  lo.x = h.x;
  hi.x = h.y;
  const float a = mul_rn(__half2float(__half(lo)), scale);
  const float b = mul_rn(__half2float(__half(hi)), scale);
  return bf16_bits_rn(a) | (bf16_bits_rn(b) << 16);
}

}  // namespace nopecache
