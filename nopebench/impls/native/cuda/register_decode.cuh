// The register decode kernel's algorithm and its host-side facts, shared by register_decode.cu
// (the GPU build) and emulator.cpp (the same source run on the CPU by the tests).
//
// An includer defines the device primitives first, in namespace nopedecode: cp16, commit and
// wait_group<N> (the cp.async ring), dequant4 (four e4m3 bytes to two bf16 pairs), transpose
// (movmatrix), mma (m16n8k16 bf16) and pack (two floats to a bf16 pair). register_decode.cu
// gives their PTX forms; the emulator their meaning, as the PTX ISA states it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "row_layout.h"

// The kernel's shape, from nopebench/impls/native/constants.py (the planner's REG_* values),
// passed by the package's build as -D flags.
#if !defined(NOPEDECODE_HEADS) || !defined(NOPEDECODE_BLOCK_N) || !defined(NOPEDECODE_STAGES) || \
    !defined(NOPEDECODE_MIN_BLOCKS) || !defined(NOPEDECODE_INDEX_CAP)
#error "the register kernel's shape comes from constants.py as -DNOPEDECODE_* flags: build through nopebench.cuda_build"
#endif

namespace nopedecode {

constexpr int kAbiVersion = 1;
constexpr int kLatent = nope_row::kLatent;
constexpr int kScaleOffset = nope_row::kScaleOffset;
constexpr int kRopeOffset = nope_row::kRopeOffset;
constexpr int kBlockN = NOPEDECODE_BLOCK_N;        // keys a block
constexpr int kWarps = nope_row::kTiles;           // one a scale tile
constexpr int kThreads = 32 * kWarps;
constexpr int kHeads = NOPEDECODE_HEADS;           // heads a CTA
constexpr int kStages = NOPEDECODE_STAGES;         // cp.async ring slots
constexpr int kMinBlocks = NOPEDECODE_MIN_BLOCKS;  // CTAs an SM the registers are budgeted for
constexpr int kIndexCap = NOPEDECODE_INDEX_CAP;    // index entries a split stages in shared memory
constexpr float kTau = 8.f;  // log2 of how far a score may pass the reference max
constexpr unsigned kFull = 0xffffffffu;
static_assert(kHeads == 16, "a CTA's heads are the mma's M");
static_assert(kBlockN == 8 * kWarps, "each warp brings and scores eight rows of a block");
static_assert(kStages >= 2 && kIndexCap % kBlockN == 0, "two ring slots or more; whole blocks");

// Everything a launch needs; the Python binding mirrors this struct field for field.
struct Params {
  const __nv_bfloat16* q;  // [tokens, heads, 512 or 576]
  long long q_stride_t;    // elements; both multiples of 4, q 8-byte aligned
  long long q_stride_h;
  const uint8_t* cache;    // rows of row_bytes, 16-byte aligned
  const int* indices;      // [tokens, width] int32, negative entries skipped
  long long idx_stride_t;
  __nv_bfloat16* out;      // [tokens, heads, 512] contiguous (one split)
  float* lse;              // [tokens, heads]
  float* part;             // [splits, tokens, heads, 512] contiguous (several splits)
  float* part_lse;         // [splits, tokens, heads]
  float scale_log2;        // softmax scale * log2(e)
  int row_bytes;           // 528 or 656 (656 with the RoPE lanes)
  int tokens;
  int heads;               // a multiple of 16
  int width;
  int per_split;           // index entries a split, a multiple of 32, at most kIndexCap
  int splits;
};

template <bool kRope>
struct Smem {
  // what the ring keeps of a row
  static constexpr int kRow = kRope ? nope_row::kFullRow : nope_row::kNopeRow;
  uint8_t rows[kStages][kBlockN * kRow];
  int index[kIndexCap];        // the split's entries, -1 past its end up to a whole block
  float4 partial[kWarps][4][32];  // partial scores: [warp][n-tile][lane], one buffer
  uint2 p[kWarps][32];         // n-tile w's P (bf16 pairs), from warp w
  float block_max[kWarps][16];
  float l_sum[kWarps][16];
  int last_valid[kWarps];
};

template <bool kRope>
__device__ __forceinline__ void decode(const Params& a, uint8_t* smem_raw) {
  Smem<kRope>& sm = *reinterpret_cast<Smem<kRope>*>(smem_raw);
  constexpr int kRow = Smem<kRope>::kRow;
  const int tok = blockIdx.x, split = blockIdx.y, head0 = blockIdx.z * kHeads;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, c = lane & 3;
  const int* idx_row = a.indices + tok * a.idx_stride_t;
  const int start = split * a.per_split;
  const int end = min(start + a.per_split, a.width);

  // The split's entries into shared memory, and the last valid one: blocks past it are skipped.
  int last = -1;
#pragma unroll 8
  for (int p = start + tid; p < end; p += kThreads) {
    const int v = __ldg(idx_row + p);
    sm.index[p - start] = v;
    if (v >= 0) last = p;
  }
  for (int p = end - start + tid; p < ((end - start + kBlockN - 1) / kBlockN) * kBlockN;
       p += kThreads)
    sm.index[p] = -1;
#pragma unroll
  for (int o = 16; o; o >>= 1) last = max(last, __shfl_xor_sync(kFull, last, o));
  if (lane == 0) sm.last_valid[w] = last;

  // Warp w brings rows 8w .. 8w + 7 of a block, one row per instruction (lane l: latent bytes
  // [16l, 16l + 16)), lane 0 also the scales, lanes 0-8 the scales and the RoPE lanes.
  // Lanes 0-7 hold the index entries of the warp's eight rows.
  const int my_row = 8 * w + (lane & 7);
  auto issue = [&](int stage, int my_idx) {
    uint8_t* base = sm.rows[stage] + 8 * w * kRow;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int ri = __shfl_sync(kFull, my_idx, k);
      const bool v = ri >= 0;
      const uint8_t* src = a.cache + (v ? (long long)ri * a.row_bytes : 0);
      uint8_t* dst = base + k * kRow;
      cp16(dst + 16 * lane, src + 16 * lane, v);
      if (kRope) {
        if (lane < 9) cp16(dst + kScaleOffset + 16 * lane, src + kScaleOffset + 16 * lane, v);
      } else if (lane == 0) {
        cp16(dst + kScaleOffset, src + kScaleOffset, v);
      }
    }
  };

  // q's A fragments for warp w: logical k {2c, 2c + 1} of k-step s is dim 128w + 32c + 4s +
  // {0, 1}, {2c + 8, 2c + 9} is + {2, 3} (the order the B fragments are converted in).
  const __nv_bfloat16* q_g = a.q + tok * a.q_stride_t + (head0 + g) * a.q_stride_h;
  const __nv_bfloat16* q_g8 = q_g + 8 * a.q_stride_h;
  uint32_t qa[8][4];
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    const uint2 x = *reinterpret_cast<const uint2*>(q_g + 128 * w + 32 * c + 4 * s);
    const uint2 y = *reinterpret_cast<const uint2*>(q_g8 + 128 * w + 32 * c + 4 * s);
    qa[s][0] = x.x;
    qa[s][1] = y.x;
    qa[s][2] = x.y;
    qa[s][3] = y.y;
  }
  uint32_t qr[4];  // RoPE lanes [16w, 16w + 16): one more k-step
  if (kRope) {
    const __nv_bfloat16* r0 = q_g + kLatent + 16 * w + 2 * c;
    const __nv_bfloat16* r8 = q_g8 + kLatent + 16 * w + 2 * c;
    qr[0] = *reinterpret_cast<const uint32_t*>(r0);
    qr[1] = *reinterpret_cast<const uint32_t*>(r8);
    qr[2] = *reinterpret_cast<const uint32_t*>(r0 + 8);
    qr[3] = *reinterpret_cast<const uint32_t*>(r8 + 8);
  }
  __syncthreads();
  last = max(max(sm.last_valid[0], sm.last_valid[1]), max(sm.last_valid[2], sm.last_valid[3]));
  const int nblocks = last < 0 ? 0 : (last - start) / kBlockN + 1;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nblocks) issue(s, sm.index[s * kBlockN + my_row]);
    commit();
  }

  float o[8][2][4];
#pragma unroll
  for (int s = 0; s < 8; ++s)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[s][h][e] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // heads g and g + 8

  for (int b = 0; b < nblocks; ++b) {
    wait_group<kStages - 2>();
    __syncthreads();
    if (b + kStages - 1 < nblocks)
      issue((b + kStages - 1) % kStages, sm.index[(b + kStages - 1) * kBlockN + my_row]);
    commit();
    const uint8_t* rows = sm.rows[b % kStages];

    // kb[j][s] = K[key 8j + g][dims 128w + 32c + 4s + {0, 1}], [{2, 3}] as bf16 pairs.
    uint32_t kb[4][8][2];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint8_t* rp = rows + (8 * j + g) * kRow;
      const uint4 v0 = *reinterpret_cast<const uint4*>(rp + 128 * w + 32 * c);
      const uint4 v1 = *reinterpret_cast<const uint4*>(rp + 128 * w + 32 * c + 16);
      const float sc = *reinterpret_cast<const float*>(rp + kScaleOffset + 4 * w);
      const uint32_t wd[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
      for (int s = 0; s < 8; ++s) dequant4(wd[s], sc, kb[j][s][0], kb[j][s][1]);
    }
    float acc[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
#pragma unroll
    for (int s = 0; s < 8; ++s)
#pragma unroll
      for (int j = 0; j < 4; ++j) mma(acc[j], qa[s], kb[j][s][0], kb[j][s][1]);
    if (kRope) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint8_t* rr = rows + (8 * j + g) * kRow + kRopeOffset + 2 * (16 * w + 2 * c);
        mma(acc[j], qr, *reinterpret_cast<const uint32_t*>(rr),
            *reinterpret_cast<const uint32_t*>(rr + 16));
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
      sm.partial[w][j][lane] = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
    __syncthreads();

    // Warp w: keys 8w .. 8w + 7, summed over the four partials.
    float4 t = sm.partial[0][w][lane];
#pragma unroll
    for (int ww = 1; ww < kWarps; ++ww) {
      const float4 u = sm.partial[ww][w][lane];
      t.x += u.x;
      t.y += u.y;
      t.z += u.z;
      t.w += u.w;
    }
    const int2 iv = *reinterpret_cast<const int2*>(&sm.index[b * kBlockN + 8 * w + 2 * c]);
    const float v0 = iv.x >= 0 ? t.x * a.scale_log2 : -INFINITY;
    const float v1 = iv.y >= 0 ? t.y * a.scale_log2 : -INFINITY;
    const float v2 = iv.x >= 0 ? t.z * a.scale_log2 : -INFINITY;
    const float v3 = iv.y >= 0 ? t.w * a.scale_log2 : -INFINITY;
    float x0 = fmaxf(v0, v1), x1 = fmaxf(v2, v3);
    x0 = fmaxf(x0, __shfl_xor_sync(kFull, x0, 1));
    x0 = fmaxf(x0, __shfl_xor_sync(kFull, x0, 2));
    x1 = fmaxf(x1, __shfl_xor_sync(kFull, x1, 1));
    x1 = fmaxf(x1, __shfl_xor_sync(kFull, x1, 2));
    if (c == 0) {
      sm.block_max[w][g] = x0;
      sm.block_max[w][g + 8] = x1;
    }
    const bool grow = x0 > m0 + kTau || x1 > m1 + kTau;
    const float z0 = m0 == -INFINITY ? 0.f : m0, z1 = m1 == -INFINITY ? 0.f : m1;
    float p0 = exp2f(v0 - z0), p1 = exp2f(v1 - z0), p2 = exp2f(v2 - z1), p3 = exp2f(v3 - z1);
    sm.p[w][lane] = make_uint2(pack(p0, p1), pack(p2, p3));
    if (__syncthreads_or(grow)) {  // the reference max moves to the running max, for all warps
      float n0 = m0, n1 = m1;
#pragma unroll
      for (int ww = 0; ww < kWarps; ++ww) {
        n0 = fmaxf(n0, sm.block_max[ww][g]);
        n1 = fmaxf(n1, sm.block_max[ww][g + 8]);
      }
      const float y0 = n0 == -INFINITY ? 0.f : n0, y1 = n1 == -INFINITY ? 0.f : n1;
      const float a0 = exp2f(m0 - y0), a1 = exp2f(m1 - y1);
      m0 = n0;
      m1 = n1;
      l0 *= a0;
      l1 *= a1;
#pragma unroll
      for (int s = 0; s < 8; ++s)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          o[s][h][0] *= a0;
          o[s][h][1] *= a0;
          o[s][h][2] *= a1;
          o[s][h][3] *= a1;
        }
      p0 = exp2f(v0 - y0);
      p1 = exp2f(v1 - y0);
      p2 = exp2f(v2 - y1);
      p3 = exp2f(v3 - y1);
      __syncthreads();
      sm.p[w][lane] = make_uint2(pack(p0, p1), pack(p2, p3));
      __syncthreads();
    }
    l0 += p0 + p1;
    l1 += p2 + p3;
    uint32_t pa[2][4];  // P as A fragments: k-tile tt = n-tiles 2tt and 2tt + 1
#pragma unroll
    for (int tt = 0; tt < 2; ++tt) {
      const uint2 e0 = sm.p[2 * tt][lane], e1 = sm.p[2 * tt + 1][lane];
      pa[tt][0] = e0.x;
      pa[tt][1] = e0.y;
      pa[tt][2] = e1.x;
      pa[tt][3] = e1.y;
    }
    // o[s][h] = O[heads g, g + 8][dims 128w + 32c + 4s + 2h + {0, 1}].
#pragma unroll
    for (int s = 0; s < 8; ++s)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int tt = 0; tt < 2; ++tt)
          mma(o[s][h], pa[tt], transpose(kb[2 * tt][s][h]), transpose(kb[2 * tt + 1][s][h]));
  }

  // Each warp's l covers its own keys: the four are summed once, at the end.
  l0 += __shfl_xor_sync(kFull, l0, 1);
  l0 += __shfl_xor_sync(kFull, l0, 2);
  l1 += __shfl_xor_sync(kFull, l1, 1);
  l1 += __shfl_xor_sync(kFull, l1, 2);
  if (c == 0) {
    sm.l_sum[w][g] = l0;
    sm.l_sum[w][g + 8] = l1;
  }
  __syncthreads();
  l0 = ((sm.l_sum[0][g] + sm.l_sum[1][g]) + sm.l_sum[2][g]) + sm.l_sum[3][g];
  l1 = ((sm.l_sum[0][g + 8] + sm.l_sum[1][g + 8]) + sm.l_sum[2][g + 8]) + sm.l_sum[3][g + 8];
  const float i0 = l0 > 0.f ? 1.f / l0 : 0.f, i1 = l1 > 0.f ? 1.f / l1 : 0.f;
  const float kLn2 = 0.6931471805599453f;
  const float e0 = l0 > 0.f ? (m0 + __log2f(l0)) * kLn2 : -INFINITY;
  const float e1 = l1 > 0.f ? (m1 + __log2f(l1)) * kLn2 : -INFINITY;
  const int dim0 = 128 * w + 32 * c;
  const long long row_g = (long long)tok * a.heads + head0 + g;  // (token, head g) of out
  if (a.splits == 1) {
    __nv_bfloat16* r0 = a.out + row_g * kLatent + dim0;
    __nv_bfloat16* r1 = r0 + 8 * kLatent;
#pragma unroll
    for (int qq = 0; qq < 4; ++qq) {
      const int s = 2 * qq;
      uint4 u0, u1;
      u0.x = pack(o[s][0][0] * i0, o[s][0][1] * i0);
      u0.y = pack(o[s][1][0] * i0, o[s][1][1] * i0);
      u0.z = pack(o[s + 1][0][0] * i0, o[s + 1][0][1] * i0);
      u0.w = pack(o[s + 1][1][0] * i0, o[s + 1][1][1] * i0);
      u1.x = pack(o[s][0][2] * i1, o[s][0][3] * i1);
      u1.y = pack(o[s][1][2] * i1, o[s][1][3] * i1);
      u1.z = pack(o[s + 1][0][2] * i1, o[s + 1][0][3] * i1);
      u1.w = pack(o[s + 1][1][2] * i1, o[s + 1][1][3] * i1);
      *reinterpret_cast<uint4*>(r0 + 8 * qq) = u0;
      *reinterpret_cast<uint4*>(r1 + 8 * qq) = u1;
    }
    if (w == 0 && c == 0) {
      a.lse[row_g] = e0;
      a.lse[row_g + 8] = e1;
    }
  } else {
    const long long prow = (long long)split * a.tokens * a.heads + row_g;
    float* r0 = a.part + prow * kLatent + dim0;
    float* r1 = r0 + 8 * kLatent;
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      *reinterpret_cast<float4*>(r0 + 4 * s) =
          make_float4(o[s][0][0] * i0, o[s][0][1] * i0, o[s][1][0] * i0, o[s][1][1] * i0);
      *reinterpret_cast<float4*>(r1 + 4 * s) =
          make_float4(o[s][0][2] * i1, o[s][0][3] * i1, o[s][1][2] * i1, o[s][1][3] * i1);
    }
    if (w == 0 && c == 0) {
      a.part_lse[prow] = e0;
      a.part_lse[prow + 8] = e1;
    }
  }
}


// cudaErrorInvalidValue for arguments the kernel cannot take (the binding checks them first).
inline int check(const Params& a, bool rope) {
  const bool ok =
      a.heads > 0 && a.heads % kHeads == 0 && a.tokens >= 0 && a.width > 0 && a.splits > 0 &&
      a.per_split > 0 && a.per_split % kBlockN == 0 && a.per_split <= kIndexCap &&
      (long long)a.per_split * a.splits >= a.width &&
      (long long)a.per_split * (a.splits - 1) < a.width &&
      (a.row_bytes == nope_row::kFullRow || (!rope && a.row_bytes == nope_row::kNopeRow)) &&
      a.q_stride_t % 4 == 0 && a.q_stride_h % 4 == 0 && reinterpret_cast<uintptr_t>(a.q) % 8 == 0 &&
      reinterpret_cast<uintptr_t>(a.cache) % 16 == 0 && a.splits <= 65535 &&
      a.heads / kHeads <= 65535;
  return ok ? 0 : static_cast<int>(cudaErrorInvalidValue);
}

// Dynamic shared memory of one CTA.
inline int smem_bytes(bool rope) {
  return static_cast<int>(rope ? sizeof(Smem<true>) : sizeof(Smem<false>));
}

}  // namespace nopedecode

// The C ABI both builds export besides the launch: what the binding checks its copies against.
extern "C" {

int nopedecode_abi_version(void) { return nopedecode::kAbiVersion; }

int nopedecode_params_bytes(void) { return static_cast<int>(sizeof(nopedecode::Params)); }

int nopedecode_index_cap(void) { return nopedecode::kIndexCap; }

int nopedecode_smem_bytes(int rope) { return nopedecode::smem_bytes(rope != 0); }

}  // extern "C"
