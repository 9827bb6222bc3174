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
#include <limits.h>
#include <math.h>
#include <stdint.h>

namespace nopedecode {

constexpr int kAbiVersion = 2;
constexpr int kLatent = 512;
constexpr int kScaleOffset = 512;
constexpr int kRopeOffset = 528;
constexpr int kRopeLanes = 64;
constexpr int kTile = 128;       // latent dims a scale
constexpr int kBlockN = 32;      // keys a block
constexpr int kIndexCap = 2208;  // index entries of one split staged in shared memory
constexpr float kTau = 8.f;      // log2 of how far a score may pass the reference max
constexpr unsigned kFull = 0xffffffffu;

// The launch shape of a head block of kHeadsT heads: everything else follows from it.
template <int kHeadsT>
struct Shape {
  static constexpr int kHeads = kHeadsT;
  static constexpr int kMTiles = kHeads / 16;          // the mma's M is 16
  static constexpr int kWarps = 4 * kMTiles;           // one a (M tile, n-tile) of a block
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kDims = kLatent / kWarps;       // latent dims a warp: 128 or 64
  static constexpr int kSteps = kDims / 16;            // k-steps a warp: 8 or 4
  static constexpr int kRowsPerWarp = kBlockN / kWarps;  // rows a warp brings a block
  static constexpr int kMinBlocks = 2 / kMTiles;       // CTAs an SM (255 registers, no spills)
  static constexpr int kStages = 4 * kMTiles;          // ring slots (16 heads: 3 and 5 slower)
  static constexpr int kRopeWarps = kRopeLanes / 16;   // warps 0-3 score the RoPE k-step
  static_assert(kHeads == 16 || kHeads == 32, "16 or 32 heads a CTA");
};

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
  int heads;               // a multiple of block_h
  int width;
  int per_split;           // index entries a split, a multiple of 32, at most kIndexCap
  int splits;
  int block_h;             // heads a CTA: 16 or 32
};

template <bool kRope, int kHeads>
struct Smem {
  using S = Shape<kHeads>;
  static constexpr int kRow = kRope ? 656 : 528;  // what the ring keeps of a row
  uint8_t rows[S::kStages][kBlockN * kRow];
  int index[kIndexCap];  // the split's entries, -1 past its end up to a whole block
  float4 partial[S::kWarps][S::kMTiles][4][32];  // partial scores: [warp][M tile][n-tile][lane]
  uint2 p[S::kWarps][32];  // warp w's (M tile w / 4, n-tile w % 4) of P, bf16 pairs
  float block_max[S::kWarps][16];
  float l_sum[S::kWarps][16];
  int last_valid[S::kWarps];
};

// The entry of a per-M-tile array owned by M tile `mt` (a register select, not a local load).
template <int kN>
__device__ __forceinline__ float pick(const float (&x)[kN], int mt) {
  float r = x[0];
#pragma unroll
  for (int i = 1; i < kN; ++i) r = mt == i ? x[i] : r;
  return r;
}

template <bool kRope, int kHeads>
__device__ __forceinline__ void decode(const Params& a, uint8_t* smem_raw) {
  using S = Shape<kHeads>;
  constexpr int kM = S::kMTiles, kSteps = S::kSteps, kR = S::kRowsPerWarp;
  Smem<kRope, kHeads>& sm = *reinterpret_cast<Smem<kRope, kHeads>*>(smem_raw);
  constexpr int kRow = Smem<kRope, kHeads>::kRow;
  const int head_blocks = a.heads / kHeads;
  const int tok = blockIdx.x / head_blocks, split = blockIdx.y;
  const int head0 = (blockIdx.x % head_blocks) * kHeads;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, c = lane & 3;
  const int own_mt = w / 4, own_nt = w % 4;  // the (M tile, n-tile) this warp softmaxes
  const int dbase = S::kDims * w;            // this warp's latent dims
  const int* idx_row = a.indices + tok * a.idx_stride_t;
  const int start = split * a.per_split;
  const int end = min(start + a.per_split, a.width);

  // The split's entries into shared memory, and the last valid one: blocks past it are skipped.
  int last = -1;
#pragma unroll 8
  for (int p = start + tid; p < end; p += S::kThreads) {
    const int v = __ldg(idx_row + p);
    sm.index[p - start] = v;
    if (v >= 0) last = p;
  }
  for (int p = end - start + tid; p < ((end - start + kBlockN - 1) / kBlockN) * kBlockN;
       p += S::kThreads)
    sm.index[p] = -1;
#pragma unroll
  for (int o = 16; o; o >>= 1) last = max(last, __shfl_xor_sync(kFull, last, o));
  if (lane == 0) sm.last_valid[w] = last;

  // Warp w brings rows Rw .. Rw + R - 1 of a block, one row per instruction (lane l: latent
  // bytes [16l, 16l + 16)), lane 0 also the scales, lanes 0-8 the scales and the RoPE lanes.
  // Lanes 0 .. R - 1 hold the index entries of the warp's rows.
  const int my_row = kR * w + (lane % kR);
  auto issue = [&](int stage, int my_idx) {
    uint8_t* base = sm.rows[stage] + kR * w * kRow;
#pragma unroll
    for (int k = 0; k < kR; ++k) {
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

  // q's A fragments for warp w and M tile mt (heads head0 + 16mt + {g, g + 8}): logical k
  // {2c, 2c + 1} of k-step s is dim Dw + 4 kSteps c + 4s + {0, 1}, {2c + 8, 2c + 9} is
  // + {2, 3} (the order the B fragments are converted in).
  const int lane_dim = dbase + 4 * kSteps * c;  // this lane's first latent dim
  uint32_t qa[kM][kSteps][4];
  uint32_t qr[kM][4];  // RoPE lanes [16w, 16w + 16), warps 0-3: one more k-step
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
    const __nv_bfloat16* q_g = a.q + tok * a.q_stride_t + (head0 + 16 * mt + g) * a.q_stride_h;
    const __nv_bfloat16* q_g8 = q_g + 8 * a.q_stride_h;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const uint2 x = *reinterpret_cast<const uint2*>(q_g + lane_dim + 4 * s);
      const uint2 y = *reinterpret_cast<const uint2*>(q_g8 + lane_dim + 4 * s);
      qa[mt][s][0] = x.x;
      qa[mt][s][1] = y.x;
      qa[mt][s][2] = x.y;
      qa[mt][s][3] = y.y;
    }
    if (kRope && w < S::kRopeWarps) {
      const __nv_bfloat16* r0 = q_g + kLatent + 16 * w + 2 * c;
      const __nv_bfloat16* r8 = q_g8 + kLatent + 16 * w + 2 * c;
      qr[mt][0] = *reinterpret_cast<const uint32_t*>(r0);
      qr[mt][1] = *reinterpret_cast<const uint32_t*>(r8);
      qr[mt][2] = *reinterpret_cast<const uint32_t*>(r0 + 8);
      qr[mt][3] = *reinterpret_cast<const uint32_t*>(r8 + 8);
    }
  }
  __syncthreads();
#pragma unroll
  for (int ww = 0; ww < S::kWarps; ++ww) last = max(last, sm.last_valid[ww]);
  const int nblocks = last < 0 ? 0 : (last - start) / kBlockN + 1;

#pragma unroll
  for (int s = 0; s < S::kStages - 1; ++s) {
    if (s < nblocks) issue(s, sm.index[s * kBlockN + my_row]);
    commit();
  }

  float o[kM][kSteps][2][4];
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
#pragma unroll
    for (int s = 0; s < kSteps; ++s)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mt][s][h][e] = 0.f;
  // The reference max of heads 16mt + g and 16mt + g + 8, the same in every warp; l covers the
  // warp's own keys of its own M tile.
  float m0[kM], m1[kM];
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) m0[mt] = m1[mt] = -INFINITY;
  float l0 = 0.f, l1 = 0.f;

  for (int b = 0; b < nblocks; ++b) {
    wait_group<S::kStages - 2>();
    __syncthreads();
    if (b + S::kStages - 1 < nblocks)
      issue((b + S::kStages - 1) % S::kStages,
            sm.index[(b + S::kStages - 1) * kBlockN + my_row]);
    commit();
    const uint8_t* rows = sm.rows[b % S::kStages];

    // kb[j][s] = K[key 8j + g][dims lane_dim + 4s + {0, 1}], [{2, 3}] as bf16 pairs.
    uint32_t kb[4][kSteps][2];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint8_t* rp = rows + (8 * j + g) * kRow;
      const float sc = *reinterpret_cast<const float*>(rp + kScaleOffset + 4 * (dbase / kTile));
#pragma unroll
      for (int v = 0; v < kSteps / 4; ++v) {
        const uint4 x = *reinterpret_cast<const uint4*>(rp + lane_dim + 16 * v);
        const uint32_t wd[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
        for (int s = 0; s < 4; ++s) dequant4(wd[s], sc, kb[j][4 * v + s][0], kb[j][4 * v + s][1]);
      }
    }
    float acc[kM][4][4];
#pragma unroll
    for (int mt = 0; mt < kM; ++mt)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;
#pragma unroll
    for (int s = 0; s < kSteps; ++s)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int mt = 0; mt < kM; ++mt) mma(acc[mt][j], qa[mt][s], kb[j][s][0], kb[j][s][1]);
    if (kRope && w < S::kRopeWarps) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint8_t* rr = rows + (8 * j + g) * kRow + kRopeOffset + 2 * (16 * w + 2 * c);
        const uint32_t r0 = *reinterpret_cast<const uint32_t*>(rr);
        const uint32_t r1 = *reinterpret_cast<const uint32_t*>(rr + 16);
#pragma unroll
        for (int mt = 0; mt < kM; ++mt) mma(acc[mt][j], qr[mt], r0, r1);
      }
    }
#pragma unroll
    for (int mt = 0; mt < kM; ++mt)
#pragma unroll
      for (int j = 0; j < 4; ++j)
        sm.partial[w][mt][j][lane] =
            make_float4(acc[mt][j][0], acc[mt][j][1], acc[mt][j][2], acc[mt][j][3]);
    __syncthreads();

    // Warp w: keys 8 own_nt .. + 7 of M tile own_mt, summed over the warps' partials.
    float4 t = sm.partial[0][own_mt][own_nt][lane];
#pragma unroll
    for (int ww = 1; ww < S::kWarps; ++ww) {
      const float4 u = sm.partial[ww][own_mt][own_nt][lane];
      t.x += u.x;
      t.y += u.y;
      t.z += u.z;
      t.w += u.w;
    }
    const int2 iv = *reinterpret_cast<const int2*>(&sm.index[b * kBlockN + 8 * own_nt + 2 * c]);
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
    const float own0 = pick(m0, own_mt), own1 = pick(m1, own_mt);
    const bool grow = x0 > own0 + kTau || x1 > own1 + kTau;
    const float z0 = own0 == -INFINITY ? 0.f : own0, z1 = own1 == -INFINITY ? 0.f : own1;
    float p0 = exp2f(v0 - z0), p1 = exp2f(v1 - z0), p2 = exp2f(v2 - z1), p3 = exp2f(v3 - z1);
    sm.p[w][lane] = make_uint2(pack(p0, p1), pack(p2, p3));
    if (__syncthreads_or(grow)) {  // the reference max moves to the running max, for all warps
      float y0[kM], y1[kM];
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
        float n0 = m0[mt], n1 = m1[mt];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          n0 = fmaxf(n0, sm.block_max[4 * mt + nt][g]);
          n1 = fmaxf(n1, sm.block_max[4 * mt + nt][g + 8]);
        }
        y0[mt] = n0 == -INFINITY ? 0.f : n0;
        y1[mt] = n1 == -INFINITY ? 0.f : n1;
        const float a0 = exp2f(m0[mt] - y0[mt]), a1 = exp2f(m1[mt] - y1[mt]);
        m0[mt] = n0;
        m1[mt] = n1;
        if (mt == own_mt) {
          l0 *= a0;
          l1 *= a1;
        }
#pragma unroll
        for (int s = 0; s < kSteps; ++s)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            o[mt][s][h][0] *= a0;
            o[mt][s][h][1] *= a0;
            o[mt][s][h][2] *= a1;
            o[mt][s][h][3] *= a1;
          }
      }
      const float yo0 = pick(y0, own_mt), yo1 = pick(y1, own_mt);
      p0 = exp2f(v0 - yo0);
      p1 = exp2f(v1 - yo0);
      p2 = exp2f(v2 - yo1);
      p3 = exp2f(v3 - yo1);
      __syncthreads();
      sm.p[w][lane] = make_uint2(pack(p0, p1), pack(p2, p3));
      __syncthreads();
    }
    l0 += p0 + p1;
    l1 += p2 + p3;
    uint32_t pa[kM][2][4];  // P as A fragments: k-tile tt = n-tiles 2tt and 2tt + 1
#pragma unroll
    for (int mt = 0; mt < kM; ++mt)
#pragma unroll
      for (int tt = 0; tt < 2; ++tt) {
        const uint2 e0 = sm.p[4 * mt + 2 * tt][lane], e1 = sm.p[4 * mt + 2 * tt + 1][lane];
        pa[mt][tt][0] = e0.x;
        pa[mt][tt][1] = e0.y;
        pa[mt][tt][2] = e1.x;
        pa[mt][tt][3] = e1.y;
      }
    // o[mt][s][h] = O[heads 16mt + {g, g + 8}][dims lane_dim + 4s + 2h + {0, 1}].
#pragma unroll
    for (int s = 0; s < kSteps; ++s)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int tt = 0; tt < 2; ++tt) {
          const uint32_t v0t = transpose(kb[2 * tt][s][h]), v1t = transpose(kb[2 * tt + 1][s][h]);
#pragma unroll
          for (int mt = 0; mt < kM; ++mt) mma(o[mt][s][h], pa[mt][tt], v0t, v1t);
        }
  }

  // Each warp's l covers its own keys: the four of an M tile are summed once, at the end.
  l0 += __shfl_xor_sync(kFull, l0, 1);
  l0 += __shfl_xor_sync(kFull, l0, 2);
  l1 += __shfl_xor_sync(kFull, l1, 1);
  l1 += __shfl_xor_sync(kFull, l1, 2);
  if (c == 0) {
    sm.l_sum[w][g] = l0;
    sm.l_sum[w][g + 8] = l1;
  }
  __syncthreads();
  const float kLn2 = 0.6931471805599453f;
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
    const float (*ls)[16] = sm.l_sum + 4 * mt;
    const float L0 = ((ls[0][g] + ls[1][g]) + ls[2][g]) + ls[3][g];
    const float L1 = ((ls[0][g + 8] + ls[1][g + 8]) + ls[2][g + 8]) + ls[3][g + 8];
    const float i0 = L0 > 0.f ? 1.f / L0 : 0.f, i1 = L1 > 0.f ? 1.f / L1 : 0.f;
    const float e0 = L0 > 0.f ? (m0[mt] + __log2f(L0)) * kLn2 : -INFINITY;
    const float e1 = L1 > 0.f ? (m1[mt] + __log2f(L1)) * kLn2 : -INFINITY;
    const long long row_g = (long long)tok * a.heads + head0 + 16 * mt + g;  // out's row
    if (a.splits == 1) {
      __nv_bfloat16* r0 = a.out + row_g * kLatent + lane_dim;
      __nv_bfloat16* r1 = r0 + 8 * kLatent;
#pragma unroll
      for (int qq = 0; qq < kSteps / 2; ++qq) {
        const int s = 2 * qq;
        uint4 u0, u1;
        u0.x = pack(o[mt][s][0][0] * i0, o[mt][s][0][1] * i0);
        u0.y = pack(o[mt][s][1][0] * i0, o[mt][s][1][1] * i0);
        u0.z = pack(o[mt][s + 1][0][0] * i0, o[mt][s + 1][0][1] * i0);
        u0.w = pack(o[mt][s + 1][1][0] * i0, o[mt][s + 1][1][1] * i0);
        u1.x = pack(o[mt][s][0][2] * i1, o[mt][s][0][3] * i1);
        u1.y = pack(o[mt][s][1][2] * i1, o[mt][s][1][3] * i1);
        u1.z = pack(o[mt][s + 1][0][2] * i1, o[mt][s + 1][0][3] * i1);
        u1.w = pack(o[mt][s + 1][1][2] * i1, o[mt][s + 1][1][3] * i1);
        *reinterpret_cast<uint4*>(r0 + 8 * qq) = u0;
        *reinterpret_cast<uint4*>(r1 + 8 * qq) = u1;
      }
      if (w == 0 && c == 0) {
        a.lse[row_g] = e0;
        a.lse[row_g + 8] = e1;
      }
    } else {
      const long long prow = (long long)split * a.tokens * a.heads + row_g;
      float* r0 = a.part + prow * kLatent + lane_dim;
      float* r1 = r0 + 8 * kLatent;
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        *reinterpret_cast<float4*>(r0 + 4 * s) = make_float4(o[mt][s][0][0] * i0, o[mt][s][0][1] * i0,
                                                             o[mt][s][1][0] * i0, o[mt][s][1][1] * i0);
        *reinterpret_cast<float4*>(r1 + 4 * s) = make_float4(o[mt][s][0][2] * i1, o[mt][s][0][3] * i1,
                                                             o[mt][s][1][2] * i1, o[mt][s][1][3] * i1);
      }
      if (w == 0 && c == 0) {
        a.part_lse[prow] = e0;
        a.part_lse[prow + 8] = e1;
      }
    }
  }
}

// cudaErrorInvalidValue for arguments the kernel cannot take (the binding checks them first).
inline int check(const Params& a, bool rope) {
  const bool ok =
      (a.block_h == 16 || a.block_h == 32) && a.heads > 0 && a.heads % a.block_h == 0 &&
      a.tokens >= 0 && a.width > 0 && a.splits > 0 && a.per_split > 0 &&
      a.per_split % kBlockN == 0 && a.per_split <= kIndexCap &&
      (long long)a.per_split * a.splits >= a.width &&
      (long long)a.per_split * (a.splits - 1) < a.width &&
      (a.row_bytes == 656 || (!rope && a.row_bytes == 528)) && a.q_stride_t % 4 == 0 &&
      a.q_stride_h % 4 == 0 && reinterpret_cast<uintptr_t>(a.q) % 8 == 0 &&
      reinterpret_cast<uintptr_t>(a.cache) % 16 == 0 && a.splits <= 65535 &&
      (long long)a.tokens * (a.heads / a.block_h) <= INT_MAX;
  return ok ? 0 : static_cast<int>(cudaErrorInvalidValue);
}


template <bool kRope>
int smem_bytes(int block_h) {
  return static_cast<int>(block_h == 16 ? sizeof(Smem<kRope, 16>) : sizeof(Smem<kRope, 32>));
}

}  // namespace nopedecode

// The C ABI both builds export besides the launch: what the binding checks its copies against.
extern "C" {

int nopedecode_abi_version(void) { return nopedecode::kAbiVersion; }

int nopedecode_params_bytes(void) { return static_cast<int>(sizeof(nopedecode::Params)); }

int nopedecode_index_cap(void) { return nopedecode::kIndexCap; }

// The launch shape of a head block of `block_h` heads: warps, CTAs an SM and ring slots into
// out[0:3]; 0, or -1 for a block_h there is no kernel for.
int nopedecode_shape(int block_h, int* out) {
  using nopedecode::Shape;
  if (block_h != 16 && block_h != 32) return -1;
  out[0] = block_h == 16 ? Shape<16>::kWarps : Shape<32>::kWarps;
  out[1] = block_h == 16 ? Shape<16>::kMinBlocks : Shape<32>::kMinBlocks;
  out[2] = block_h == 16 ? Shape<16>::kStages : Shape<32>::kStages;
  return 0;
}

// Dynamic shared memory of one CTA; 0 for a block_h there is no kernel for.
int nopedecode_smem_bytes(int rope, int block_h) {
  if (block_h != 16 && block_h != 32) return 0;
  return rope ? nopedecode::smem_bytes<true>(block_h) : nopedecode::smem_bytes<false>(block_h);
}

}  // extern "C"
