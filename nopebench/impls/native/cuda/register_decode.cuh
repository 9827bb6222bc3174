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
    !defined(NOPEDECODE_MIN_BLOCKS) || !defined(NOPEDECODE_INDEX_CAP) || !defined(NOPEDECODE_WARPS)
#error "the register kernel's shape comes from constants.py as -DNOPEDECODE_* flags: build through nopebench.cuda_build"
#endif

namespace nopedecode {

constexpr int kAbiVersion = 1;
constexpr int kLatent = nope_row::kLatent;
constexpr int kScaleOffset = nope_row::kScaleOffset;
constexpr int kRopeOffset = nope_row::kRopeOffset;
constexpr int kBlockN = NOPEDECODE_BLOCK_N;        // keys a block
constexpr int kWarps = NOPEDECODE_WARPS;           // warps a CTA, each owning kDims latent dims
constexpr int kThreads = 32 * kWarps;
constexpr int kDims = kLatent / kWarps;            // latent dims a warp owns
constexpr int kSteps = kDims / 16;                 // its k-steps of the score product
constexpr int kRowsPerWarp = kBlockN / kWarps;     // rows of a block a warp brings
constexpr int kNTiles = kBlockN / 8;               // the block's n-tiles of 8 keys
constexpr int kOwn = 2 * kNTiles / kWarps;         // (n-tile, head half) pairs a warp's softmax runs
constexpr int kHeads = NOPEDECODE_HEADS;           // heads a CTA
constexpr int kStages = NOPEDECODE_STAGES;         // cp.async ring slots
constexpr int kMinBlocks = NOPEDECODE_MIN_BLOCKS;  // CTAs an SM the registers are budgeted for
constexpr int kIndexCap = NOPEDECODE_INDEX_CAP;    // index entries a split stages in shared memory
constexpr float kTau = 8.f;  // log2 of how far a score may pass the reference max
constexpr unsigned kFull = 0xffffffffu;
static_assert(kHeads == 16, "a CTA's heads are the mma's M");
static_assert(kBlockN == 32, "four n-tiles of 8 keys a block");
static_assert(kWarps == 4 || kWarps == 8, "a warp's softmax takes one n-tile, both head halves or one");
static_assert(nope_row::kTile % kDims == 0, "a warp's dims lie in one scale tile");
static_assert(nope_row::kRopeDim / 16 <= kWarps, "one RoPE k-step a warp at most");
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
  // partial scores [warp][n-tile], one buffer: with 4 warps a float4 a lane (both head
  // halves), with 8 a float2 a lane and half (the half a warp reads, contiguous)
  alignas(16) float partial[kWarps][kNTiles][128];
  uint2 p[kNTiles][32];        // n-tile j's P as bf16 pairs: .x heads g, .y heads g + 8
  float block_max[kNTiles][16];  // [n-tile][head]: the block's max over the tile's keys
  float l_sum[kNTiles][16];
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

  // Warp w brings rows kRowsPerWarp * w + k of a block, one row per instruction (lane l: latent
  // bytes [16l, 16l + 16)), lane 0 also the scales, lanes 0-8 the scales and the RoPE lanes.
  // Lanes 0 .. kRowsPerWarp - 1 hold the index entries of the warp's rows.
  const int my_row = kRowsPerWarp * w + lane % kRowsPerWarp;
  auto issue = [&](int stage, int my_idx) {
    uint8_t* base = sm.rows[stage] + kRowsPerWarp * w * kRow;
#pragma unroll
    for (int k = 0; k < kRowsPerWarp; ++k) {
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

  // Lane (g, c) of warp w covers latent dims dim_c + [0, 4 kSteps): in k-step s, logical k
  // {2c, 2c + 1} is dim dim_c + 4s + {0, 1} and {2c + 8, 2c + 9} is + {2, 3} (the order the B
  // fragments are converted in), so one 16-byte load of a row feeds four k-steps.
  const int dim_c = kDims * w + 4 * kSteps * c;
  const __nv_bfloat16* q_g = a.q + tok * a.q_stride_t + (head0 + g) * a.q_stride_h;
  const __nv_bfloat16* q_g8 = q_g + 8 * a.q_stride_h;
  uint32_t qa[kSteps][4];
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    const uint2 x = *reinterpret_cast<const uint2*>(q_g + dim_c + 4 * s);
    const uint2 y = *reinterpret_cast<const uint2*>(q_g8 + dim_c + 4 * s);
    qa[s][0] = x.x;
    qa[s][1] = y.x;
    qa[s][2] = x.y;
    qa[s][3] = y.y;
  }
  // RoPE lanes [16w, 16w + 16) for warps w < 4: one more k-step.
  constexpr int kRopeWarps = nope_row::kRopeDim / 16;
  const bool rope_warp = kRope && w < kRopeWarps;
  uint32_t qr[4] = {0u, 0u, 0u, 0u};
  if (rope_warp) {
    const __nv_bfloat16* r0 = q_g + kLatent + 16 * w + 2 * c;
    const __nv_bfloat16* r8 = q_g8 + kLatent + 16 * w + 2 * c;
    qr[0] = *reinterpret_cast<const uint32_t*>(r0);
    qr[1] = *reinterpret_cast<const uint32_t*>(r8);
    qr[2] = *reinterpret_cast<const uint32_t*>(r0 + 8);
    qr[3] = *reinterpret_cast<const uint32_t*>(r8 + 8);
  }
  __syncthreads();
  last = sm.last_valid[0];
#pragma unroll
  for (int ww = 1; ww < kWarps; ++ww) last = max(last, sm.last_valid[ww]);
  const int nblocks = last < 0 ? 0 : (last - start) / kBlockN + 1;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nblocks) issue(s, sm.index[s * kBlockN + my_row]);
    commit();
  }

  // The softmax of warp w: n-tile jt (keys 8 jt .. 8 jt + 7) for its kOwn head halves.
  const int jt = w % kNTiles;
  auto half_of = [&](int i) { return kOwn == 2 ? i : w / kNTiles; };
  auto pick = [](const float (&v)[2], int h) { return h ? v[1] : v[0]; };  // no local memory
  auto put_p = [&](const float (&p)[kOwn][2]) {  // this warp's P into n-tile jt's fragments
    if constexpr (kOwn == 2)
      sm.p[jt][lane] = make_uint2(pack(p[0][0], p[0][1]), pack(p[1][0], p[1][1]));
    else
      reinterpret_cast<uint32_t*>(&sm.p[jt][lane])[half_of(0)] = pack(p[0][0], p[0][1]);
  };

  float o[kSteps][2][4];
#pragma unroll
  for (int s = 0; s < kSteps; ++s)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[s][h][e] = 0.f;
  float m[2] = {-INFINITY, -INFINITY};  // the reference max of heads g and g + 8
  float l[kOwn];                        // this warp's share of the sums of its halves' heads
#pragma unroll
  for (int i = 0; i < kOwn; ++i) l[i] = 0.f;

  for (int b = 0; b < nblocks; ++b) {
    wait_group<kStages - 2>();
    __syncthreads();
    if (b + kStages - 1 < nblocks)
      issue((b + kStages - 1) % kStages, sm.index[(b + kStages - 1) * kBlockN + my_row]);
    commit();
    const uint8_t* rows = sm.rows[b % kStages];

    // kb[j][s] = K[key 8j + g][dims dim_c + 4s + {0, 1}], [{2, 3}] as bf16 pairs.
    uint32_t kb[kNTiles][kSteps][2];
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
      const uint8_t* rp = rows + (8 * j + g) * kRow;
      const float sc = *reinterpret_cast<const float*>(rp + kScaleOffset + 4 * (kDims * w / nope_row::kTile));
      uint32_t wd[kSteps];
#pragma unroll
      for (int u = 0; u < kSteps / 4; ++u) {
        const uint4 v = *reinterpret_cast<const uint4*>(rp + dim_c + 16 * u);
        wd[4 * u] = v.x;
        wd[4 * u + 1] = v.y;
        wd[4 * u + 2] = v.z;
        wd[4 * u + 3] = v.w;
      }
#pragma unroll
      for (int s = 0; s < kSteps; ++s) dequant4(wd[s], sc, kb[j][s][0], kb[j][s][1]);
    }
    float acc[kNTiles][4];
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
#pragma unroll
    for (int s = 0; s < kSteps; ++s)
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) mma(acc[j], qa[s], kb[j][s][0], kb[j][s][1]);
    if (rope_warp) {
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        const uint8_t* rr = rows + (8 * j + g) * kRow + kRopeOffset + 2 * (16 * w + 2 * c);
        mma(acc[j], qr, *reinterpret_cast<const uint32_t*>(rr),
            *reinterpret_cast<const uint32_t*>(rr + 16));
      }
    }
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
      if constexpr (kOwn == 2) {
        *reinterpret_cast<float4*>(&sm.partial[w][j][4 * lane]) =
            make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
      } else {
        *reinterpret_cast<float2*>(&sm.partial[w][j][2 * lane]) = make_float2(acc[j][0], acc[j][1]);
        *reinterpret_cast<float2*>(&sm.partial[w][j][64 + 2 * lane]) =
            make_float2(acc[j][2], acc[j][3]);
      }
    }
    __syncthreads();

    // Warp w: keys 8 jt .. 8 jt + 7 of its halves, summed over the kWarps partials in warp order.
    float2 t[kOwn];
    if constexpr (kOwn == 2) {
      float4 u = *reinterpret_cast<const float4*>(&sm.partial[0][jt][4 * lane]);
#pragma unroll
      for (int ww = 1; ww < kWarps; ++ww) {
        const float4 x = *reinterpret_cast<const float4*>(&sm.partial[ww][jt][4 * lane]);
        u.x += x.x;
        u.y += x.y;
        u.z += x.z;
        u.w += x.w;
      }
      t[0] = make_float2(u.x, u.y);
      t[1] = make_float2(u.z, u.w);
    } else {
      const int off = 64 * half_of(0) + 2 * lane;
      float2 u = *reinterpret_cast<const float2*>(&sm.partial[0][jt][off]);
#pragma unroll
      for (int ww = 1; ww < kWarps; ++ww) {
        const float2 x = *reinterpret_cast<const float2*>(&sm.partial[ww][jt][off]);
        u.x += x.x;
        u.y += x.y;
      }
      t[0] = u;
    }
    const int2 iv = *reinterpret_cast<const int2*>(&sm.index[b * kBlockN + 8 * jt + 2 * c]);
    float v[kOwn][2], x[kOwn];
    bool grow = false;
#pragma unroll
    for (int i = 0; i < kOwn; ++i) {
      v[i][0] = iv.x >= 0 ? t[i].x * a.scale_log2 : -INFINITY;
      v[i][1] = iv.y >= 0 ? t[i].y * a.scale_log2 : -INFINITY;
      x[i] = fmaxf(v[i][0], v[i][1]);
      x[i] = fmaxf(x[i], __shfl_xor_sync(kFull, x[i], 1));
      x[i] = fmaxf(x[i], __shfl_xor_sync(kFull, x[i], 2));
      if (c == 0) sm.block_max[jt][8 * half_of(i) + g] = x[i];
      grow = grow || x[i] > pick(m, half_of(i)) + kTau;
    }
    float p[kOwn][2];
#pragma unroll
    for (int i = 0; i < kOwn; ++i) {
      const float mi = pick(m, half_of(i));
      const float z = mi == -INFINITY ? 0.f : mi;
      p[i][0] = exp2f(v[i][0] - z);
      p[i][1] = exp2f(v[i][1] - z);
    }
    put_p(p);
    if (__syncthreads_or(grow)) {  // the reference max moves to the running max, for all warps
      float n[2] = {m[0], m[1]}, al[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) n[h] = fmaxf(n[h], sm.block_max[j][8 * h + g]);
        const float y = n[h] == -INFINITY ? 0.f : n[h];
        al[h] = exp2f(m[h] - y);
        m[h] = n[h];
      }
#pragma unroll
      for (int s = 0; s < kSteps; ++s)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          o[s][h][0] *= al[0];
          o[s][h][1] *= al[0];
          o[s][h][2] *= al[1];
          o[s][h][3] *= al[1];
        }
#pragma unroll
      for (int i = 0; i < kOwn; ++i) {
        l[i] *= pick(al, half_of(i));
        const float y = pick(m, half_of(i)) == -INFINITY ? 0.f : pick(m, half_of(i));
        p[i][0] = exp2f(v[i][0] - y);
        p[i][1] = exp2f(v[i][1] - y);
      }
      __syncthreads();
      put_p(p);
      __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < kOwn; ++i) l[i] += p[i][0] + p[i][1];
    uint32_t pa[2][4];  // P as A fragments: k-tile tt = n-tiles 2tt and 2tt + 1
#pragma unroll
    for (int tt = 0; tt < 2; ++tt) {
      const uint2 e0 = sm.p[2 * tt][lane], e1 = sm.p[2 * tt + 1][lane];
      pa[tt][0] = e0.x;
      pa[tt][1] = e0.y;
      pa[tt][2] = e1.x;
      pa[tt][3] = e1.y;
    }
    // o[s][h] = O[heads g, g + 8][dims dim_c + 4s + 2h + {0, 1}].
#pragma unroll
    for (int s = 0; s < kSteps; ++s)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int tt = 0; tt < 2; ++tt)
          mma(o[s][h], pa[tt], transpose(kb[2 * tt][s][h]), transpose(kb[2 * tt + 1][s][h]));
  }

  // Each warp's l covers its own keys: the n-tiles' sums meet once, at the end.
#pragma unroll
  for (int i = 0; i < kOwn; ++i) {
    l[i] += __shfl_xor_sync(kFull, l[i], 1);
    l[i] += __shfl_xor_sync(kFull, l[i], 2);
    if (c == 0) sm.l_sum[jt][8 * half_of(i) + g] = l[i];
  }
  __syncthreads();
  float L[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    L[h] = sm.l_sum[0][8 * h + g];
#pragma unroll
    for (int j = 1; j < kNTiles; ++j) L[h] += sm.l_sum[j][8 * h + g];
  }
  const float i0 = L[0] > 0.f ? 1.f / L[0] : 0.f, i1 = L[1] > 0.f ? 1.f / L[1] : 0.f;
  const float kLn2 = 0.6931471805599453f;
  const float e0 = L[0] > 0.f ? (m[0] + __log2f(L[0])) * kLn2 : -INFINITY;
  const float e1 = L[1] > 0.f ? (m[1] + __log2f(L[1])) * kLn2 : -INFINITY;
  const long long row_g = (long long)tok * a.heads + head0 + g;  // (token, head g) of out
  if (a.splits == 1) {
    __nv_bfloat16* r0 = a.out + row_g * kLatent + dim_c;
    __nv_bfloat16* r1 = r0 + 8 * kLatent;
#pragma unroll
    for (int qq = 0; qq < kSteps / 2; ++qq) {
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
    float* r0 = a.part + prow * kLatent + dim_c;
    float* r1 = r0 + 8 * kLatent;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
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
