// Register-path sparse MLA decode (prototype, NoPE rows, 16 heads per CTA).
//
// Four warps per CTA, warp w owning latent tile w (dims 128w..128w+127). Each warp loads its
// tile of every gathered row straight from global memory into registers (no shared ring),
// dequantizes it exactly as the reference does (fp8 -> f32 * scale -> bf16), and uses the
// same registers as the B operand of mma.sync for S = Q K^T (partial over its 128 dims) and,
// transposed in registers by movmatrix, as the B operand of O = P V for its 128 output dims.
// The partial scores are summed across the four warps through shared memory (one barrier a
// block); every warp then runs the same online softmax on the same sums.
//
// Dim permutation: lane (g = lane/4, c = lane%4) holds bytes [16c, 16c+16) and
// [64+16c, 64+16c+16) of its tile; k-step j uses 4 consecutive of them, as the mma k-slots
// {2c, 2c+1, 2c+8, 2c+9}. Q's fragments use the same permutation, so S is exact, and the
// output's columns map back to dims through the same function when stored.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kLatent = 512;
constexpr int kScaleOffset = 512;
constexpr int kHeads = 16;  // heads per CTA: one mma M
constexpr int kWarps = 4;   // one per 128-dim tile
constexpr int kThreads = 32 * kWarps;
constexpr int kBlockN = 16;  // rows per block: two n8 tiles
#ifndef RING
#define RING 3
#endif
constexpr int kRing = RING;  // blocks of rows in flight per warp (the current one included)

struct Params {
  const __nv_bfloat16* q;
  const uint8_t* cache;
  const int* idx;
  float* part;      // [splits, T, H, 512] when splits > 1
  float* part_lse;  // [splits, T, H]
  __nv_bfloat16* out;  // [T, H, 512] when splits == 1
  float* lse;          // [T, H]
  int tokens, heads, width, per_split, splits, row_bytes;
  long long q_st, q_sh, idx_st;
  float scale_log2;
};

struct Rows {  // one block's share of one lane: rows g and 8 + g of the block
  uint4 a[2][2];
  float s[2];
  int e[2];
};

__device__ __forceinline__ int phys(int c, int j) {  // first of 4 dims k-step j takes
  return (j < 4) ? 16 * c + 4 * j : 64 + 16 * c + 4 * (j - 4);
}

__device__ __forceinline__ uint32_t word(const Rows& r, int i, int j) {
  const uint4& v = r.a[i][j >> 2];
  switch (j & 3) {
    case 0: return v.x;
    case 1: return v.y;
    case 2: return v.z;
    default: return v.w;
  }
}

// 4 e4m3 bytes -> bf16(float(x) * s), as two bf16x2 (low byte first).
__device__ __forceinline__ void dequant(uint32_t w, float s, uint32_t& lo, uint32_t& hi) {
  __half2_raw h0 = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xffff), __NV_E4M3);
  __half2_raw h1 = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> 16), __NV_E4M3);
  float2 f0 = __half22float2(*reinterpret_cast<__half2*>(&h0));
  float2 f1 = __half22float2(*reinterpret_cast<__half2*>(&h1));
  __nv_bfloat162 b0 = __floats2bfloat162_rn(__fmul_rn(f0.x, s), __fmul_rn(f0.y, s));
  __nv_bfloat162 b1 = __floats2bfloat162_rn(__fmul_rn(f1.x, s), __fmul_rn(f1.y, s));
  lo = *reinterpret_cast<uint32_t*>(&b0);
  hi = *reinterpret_cast<uint32_t*>(&b1);
}

__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t trans8x8(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float a, float b) {
  __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ int load_entry(const int* row, int r, int end) {
  return r < end ? __ldg(row + r) : -1;
}

__device__ __forceinline__ void load_rows(Rows& r, const uint8_t* cache, int row_bytes,
                                          int tile, int c, const int (&e)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    r.e[i] = e[i];
    if (e[i] >= 0) {
      const uint8_t* base = cache + (long long)e[i] * row_bytes;
      const uint8_t* t = base + 128 * tile + 16 * c;
      r.a[i][0] = __ldg(reinterpret_cast<const uint4*>(t));
      r.a[i][1] = __ldg(reinterpret_cast<const uint4*>(t + 64));
      r.s[i] = __ldg(reinterpret_cast<const float*>(base + kScaleOffset) + tile);
    } else {
      r.a[i][0] = make_uint4(0, 0, 0, 0);
      r.a[i][1] = make_uint4(0, 0, 0, 0);
      r.s[i] = 0.f;
    }
  }
}

__global__ void __launch_bounds__(kThreads, 2) regpath_decode_kernel(const Params p) {
  __shared__ float4 xs[2][kWarps][2][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int head_groups = p.heads / kHeads;
  int pid = blockIdx.x;
  const int hg = pid % head_groups;
  pid /= head_groups;
  const int split = pid % p.splits;
  const int token = pid / p.splits;
  const int start = split * p.per_split;
  const int end = min(p.width, start + p.per_split);
  const int nb = (end - start + kBlockN - 1) / kBlockN;
  const int* irow = p.idx + (long long)token * p.idx_st;

  // q's fragments for this warp's tile: 8 k-steps x 4 bf16x2.
  uint32_t qf[8][4];
  {
    const __nv_bfloat16* q0 = p.q + (long long)token * p.q_st + (long long)(hg * kHeads + g) * p.q_sh;
    const __nv_bfloat16* q1 = q0 + 8 * p.q_sh;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int d = 128 * warp + phys(c, j);
      uint2 v0 = *reinterpret_cast<const uint2*>(q0 + d);
      uint2 v1 = *reinterpret_cast<const uint2*>(q1 + d);
      qf[j][0] = v0.x;
      qf[j][1] = v1.x;
      qf[j][2] = v0.y;
      qf[j][3] = v1.y;
    }
  }

  float o[8][2][4];
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int v = 0; v < 4; ++v) o[j][h][v] = 0.f;
  float m[2] = {-INFINITY, -INFINITY};  // running max (log2 units) of heads g, g + 8
  float l[2] = {0.f, 0.f};              // this lane's share of the running sums

  Rows ring[kRing];
  int ent[kRing][2];
#pragma unroll
  for (int k = 0; k < kRing; ++k) {
    int e[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) e[i] = load_entry(irow, start + kBlockN * k + 8 * i + g, end);
    load_rows(ring[k], p.cache, p.row_bytes, warp, c, e);
#pragma unroll
    for (int i = 0; i < 2; ++i)
      ent[k][i] = load_entry(irow, start + kBlockN * (k + kRing) + 8 * i + g, end);
  }

  for (int b0 = 0; b0 < nb; b0 += kRing) {
#pragma unroll
    for (int k = 0; k < kRing; ++k) {
      const int b = b0 + k;
      // A block whose entries are all -1 adds nothing (every warp sees the same entries).
      const bool empty = __all_sync(0xffffffffu, ring[k].e[0] < 0 && ring[k].e[1] < 0);
      if (b < nb && empty) {
        load_rows(ring[k], p.cache, p.row_bytes, warp, c, ent[k]);
#pragma unroll
        for (int i = 0; i < 2; ++i)
          ent[k][i] = load_entry(irow, start + kBlockN * (b + 2 * kRing) + 8 * i + g, end);
      } else if (b < nb) {
        // Dequantize and score this warp's tile.
        uint32_t kf[2][8][2];
        float s[2][4];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
#pragma unroll
          for (int v = 0; v < 4; ++v) s[i][v] = 0.f;
#pragma unroll
          for (int j = 0; j < 8; ++j) {
#ifdef NO_DEQ
            { const uint32_t w = word(ring[k], i, j);
              kf[i][j][0] = __byte_perm(w, 0, 0x1404) ^ 0x3c003c00u; kf[i][j][1] = __byte_perm(w, 0, 0x3424) ^ 0x3c003c00u; }
#else
            dequant(word(ring[k], i, j), ring[k].s[i], kf[i][j][0], kf[i][j][1]);
#endif
            mma16816(s[i], qf[j], kf[i][j][0], kf[i][j][1]);
          }
        }
        int valid[2][2];
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            valid[i][e] = __shfl_sync(0xffffffffu, ring[k].e[i], 4 * (2 * c + e)) >= 0;
        // Refill this ring slot kRing blocks ahead, and its entries 2 kRing ahead.
        load_rows(ring[k], p.cache, p.row_bytes, warp, c, ent[k]);
#pragma unroll
        for (int i = 0; i < 2; ++i)
          ent[k][i] = load_entry(irow, start + kBlockN * (b + 2 * kRing) + 8 * i + g, end);

        // Sum the four warps' partial scores.
        const int buf = b & 1;
#ifndef NO_XCHG
#pragma unroll
        for (int i = 0; i < 2; ++i)
          xs[buf][warp][i][lane] = make_float4(s[i][0], s[i][1], s[i][2], s[i][3]);
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          float4 t = xs[buf][0][i][lane];
#pragma unroll
          for (int w = 1; w < kWarps; ++w) {
            const float4 u = xs[buf][w][i][lane];
            t.x += u.x;
            t.y += u.y;
            t.z += u.z;
            t.w += u.w;
          }
#else
        for (int i = 0; i < 2; ++i) { float4 t = make_float4(s[i][0], s[i][1], s[i][2], s[i][3]);
#endif
          s[i][0] = valid[i][0] ? t.x * p.scale_log2 : -INFINITY;
          s[i][1] = valid[i][1] ? t.y * p.scale_log2 : -INFINITY;
          s[i][2] = valid[i][0] ? t.z * p.scale_log2 : -INFINITY;
          s[i][3] = valid[i][1] ? t.w * p.scale_log2 : -INFINITY;
        }
        // Online softmax (heads g and g + 8).
#ifdef NO_XCHG
#endif
        float mx[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          mx[r] = fmaxf(fmaxf(s[0][2 * r], s[0][2 * r + 1]), fmaxf(s[1][2 * r], s[1][2 * r + 1]));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
          mx[r] = fmaxf(mx[r], m[r]);
        }
        const bool grew = (mx[0] > m[0]) || (mx[1] > m[1]);
        float alpha[2], base[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          base[r] = (mx[r] == -INFINITY) ? 0.f : mx[r];
          alpha[r] = exp2f(m[r] - base[r]);
          m[r] = mx[r];
          l[r] *= alpha[r];
        }
        if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
          for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              o[j][h][0] *= alpha[0];
              o[j][h][1] *= alpha[0];
              o[j][h][2] *= alpha[1];
              o[j][h][3] *= alpha[1];
            }
        }
        uint32_t pf[4];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          float e0 = exp2f(s[i][0] - base[0]), e1 = exp2f(s[i][1] - base[0]);
          float e2 = exp2f(s[i][2] - base[1]), e3 = exp2f(s[i][3] - base[1]);
          l[0] += e0 + e1;
          l[1] += e2 + e3;
          pf[2 * i] = pack_bf16(e0, e1);
          pf[2 * i + 1] = pack_bf16(e2, e3);
        }
        // O += P V over this warp's 128 dims.
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h)
#ifdef NO_PV
            o[j][h][0] += __uint_as_float(pf[0] ^ kf[0][j][h] ^ kf[1][j][h]);
#else
            mma16816(o[j][h], pf, trans8x8(kf[0][j][h]), trans8x8(kf[1][j][h]));
#endif
      }
    }
  }

  // Finish: quad sums, normalise, store this warp's dims.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  const float inv[2] = {l[0] > 0.f ? 1.f / l[0] : 0.f, l[1] > 0.f ? 1.f / l[1] : 0.f};
  const float lse[2] = {
      l[0] > 0.f ? (m[0] + log2f(l[0])) * 0.69314718055994531f : -INFINITY,
      l[1] > 0.f ? (m[1] + log2f(l[1])) * 0.69314718055994531f : -INFINITY};
  const int h0 = hg * kHeads + g;
  const long long th = (long long)token * p.heads;
  if (p.splits == 1) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      __nv_bfloat16* dst = p.out + (th + h0 + 8 * r) * kLatent + 128 * warp;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        uint2 v;
        v.x = pack_bf16(o[j][0][2 * r] * inv[r], o[j][0][2 * r + 1] * inv[r]);
        v.y = pack_bf16(o[j][1][2 * r] * inv[r], o[j][1][2 * r + 1] * inv[r]);
        *reinterpret_cast<uint2*>(dst + phys(c, j)) = v;
      }
      if (warp == 0 && c == 0) p.lse[th + h0 + 8 * r] = lse[r];
    }
  } else {
    const long long sth = (long long)split * p.tokens * p.heads + th;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float* dst = p.part + (sth + h0 + 8 * r) * kLatent + 128 * warp;
#pragma unroll
      for (int j = 0; j < 8; ++j)
        *reinterpret_cast<float4*>(dst + phys(c, j)) =
            make_float4(o[j][0][2 * r] * inv[r], o[j][0][2 * r + 1] * inv[r],
                        o[j][1][2 * r] * inv[r], o[j][1][2 * r + 1] * inv[r]);
      if (warp == 0 && c == 0) p.part_lse[sth + h0 + 8 * r] = lse[r];
    }
  }
}

}  // namespace

extern "C" int regpath_decode(const void* q, const void* cache, const void* idx, void* part,
                              void* part_lse, void* out, void* lse, int tokens, int heads,
                              int width, int per_split, int splits, int row_bytes,
                              long long q_st, long long q_sh, long long idx_st,
                              float scale_log2, void* stream) {
  if (heads % kHeads || per_split % kBlockN || row_bytes % 16) return 1;
  Params p{static_cast<const __nv_bfloat16*>(q),
           static_cast<const uint8_t*>(cache),
           static_cast<const int*>(idx),
           static_cast<float*>(part),
           static_cast<float*>(part_lse),
           static_cast<__nv_bfloat16*>(out),
           static_cast<float*>(lse),
           tokens, heads, width, per_split, splits, row_bytes, q_st, q_sh, idx_st, scale_log2};
  const int grid = tokens * splits * (heads / kHeads);
  regpath_decode_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  return static_cast<int>(cudaGetLastError());
}
