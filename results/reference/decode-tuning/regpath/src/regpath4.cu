// Register-path sparse MLA decode, v2 (prototype, NoPE rows, 16 heads per CTA).
//
// As regpath.cu (four warps, warp w owns latent tile w; mma.sync with the B operand from
// registers; movmatrix for V; partial scores summed across warps through shared memory), but:
// - each warp copies its tile of every row with cp.async into a private DEPTH-stage ring in
//   shared memory (zero-filled for -1 entries), so many blocks are in flight without registers;
// - the fp8 values enter the products unscaled, as exact f16: K's tile scale multiplies the
//   partial scores, V's scale multiplies V in f16 (one HMUL2 a pair);
// - q enters as f16, each head scaled by a power of two that puts its largest |q| just below
//   2^15 (exact for every value above 2^-24 of that maximum); the scores undo it.

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <cuda_bf16.h>

namespace {

constexpr int kLatent = 512;
constexpr int kScaleOffset = 512;
constexpr int kHeads = 16;
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
#ifndef BN
#define BN 16
#endif
constexpr int kBlockN = BN;  // rows per block: BN / 8 n8 tiles
constexpr int kTiles = kBlockN / 8;
#ifndef DEPTH
#define DEPTH 6
#endif
constexpr int kDepth = DEPTH;
#ifndef SPLITACC
#define SPLITACC 0
#endif
#ifndef PIPE
#define PIPE 1
#endif
#ifndef EXACT
#define EXACT 1
#endif
#ifndef MINB
#define MINB 2
#endif

struct Params {
  const __nv_bfloat16* q;
  const uint8_t* cache;
  const int* idx;
  float* part;
  float* part_lse;
  __nv_bfloat16* out;
  float* lse;
  int tokens, heads, width, per_split, splits, row_bytes;
  long long q_st, q_sh, idx_st;
  float scale_log2;
};

struct Stage {  // one warp's share of one block: its tile of 16 rows, their scales and entries
  uint4 data[kBlockN][8];  // 16-byte chunk ch of row r at [r][ch ^ ((r & 1) << 2)]
  float scale[kBlockN];
  int entry[kBlockN];
};

__device__ __forceinline__ int phys(int c, int j) {
  return (j < 4) ? 16 * c + 4 * j : 64 + 16 * c + 4 * (j - 4);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp16(void* dst, const void* src, bool on) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(on ? 16 : 0));
}
__device__ __forceinline__ void cp4(void* dst, const void* src, bool on) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(on ? 4 : 0));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void wait_groups() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t trans8x8(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two) {
  __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)two, __NV_E4M3);
  return *reinterpret_cast<uint32_t*>(&h);
}

__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
  __half2 r = __hmul2(*reinterpret_cast<__half2*>(&a), *reinterpret_cast<__half2*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}

__device__ __forceinline__ uint32_t pack_f16(float a, float b) {
  __half2 v = __floats2half2_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t pack_bf16(float a, float b) {
  __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&v);
}

// 4 e4m3 bytes -> bf16(float(x) * s), as two bf16x2 (low byte first): the reference's rounding.
__device__ __forceinline__ void dequant(uint32_t w, float s, uint32_t& lo, uint32_t& hi) {
  __half2_raw h0 = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xffff), __NV_E4M3);
  __half2_raw h1 = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> 16), __NV_E4M3);
  float2 f0 = __half22float2(*reinterpret_cast<__half2*>(&h0));
  float2 f1 = __half22float2(*reinterpret_cast<__half2*>(&h1));
  lo = pack_bf16(__fmul_rn(f0.x, s), __fmul_rn(f0.y, s));
  hi = pack_bf16(__fmul_rn(f1.x, s), __fmul_rn(f1.y, s));
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#if EXACT
#define mma mma_bf16
#define pack_p pack_bf16
#else
#define mma mma_f16
#define pack_p pack_f16
#endif

__device__ __forceinline__ int entry_at(const int* row, int r, int end) {
  return r < end ? __ldg(row + r) : -1;
}

// Issue one block's copies: lane copies chunk (lane & 7) of rows (lane >> 3) + 4k, and lanes
// 0..15 the tile scale of row lane and its entry. `e` is this lane's entry (row = lane & 15).
__device__ __forceinline__ void issue(Stage& st, const uint8_t* cache, int row_bytes, int tile,
                                      int lane, int e) {
  const int ch = lane & 7;
#pragma unroll
  for (int k = 0; k < kBlockN / 4; ++k) {
    const int r = (lane >> 3) + 4 * k;
    const int er = __shfl_sync(0xffffffffu, e, r);
    const uint8_t* src = cache + (long long)max(er, 0) * row_bytes + 128 * tile + 16 * ch;
    cp16(&st.data[r][ch ^ ((r & 1) << 2)], src, er >= 0);
  }
  if (lane < kBlockN) {
    const uint8_t* src = cache + (long long)max(e, 0) * row_bytes + kScaleOffset + 4 * tile;
    cp4(&st.scale[lane], src, e >= 0);
    st.entry[lane] = e;
  }
  commit();
}

__global__ void __launch_bounds__(kThreads, MINB) regpath4_decode_kernel(const Params p) {
  extern __shared__ __align__(16) uint8_t smem[];
  Stage* ring = reinterpret_cast<Stage*>(smem) + threadIdx.x / 32 * kDepth;
  float4(*xs)[kWarps][kTiles][32] = reinterpret_cast<float4(*)[kWarps][kTiles][32]>(
      smem + sizeof(Stage) * kDepth * kWarps);
  float* qmax = reinterpret_cast<float*>(smem + sizeof(Stage) * kDepth * kWarps +
                                         2 * sizeof(float4) * kWarps * kTiles * 32);

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
  const int nb = max(0, (end - start + kBlockN - 1) / kBlockN);
  const int* irow = p.idx + (long long)token * p.idx_st;

  // Start the ring first: DEPTH - 1 blocks in flight.
  int e_next = entry_at(irow, start + (lane & (kBlockN - 1)), end);
#pragma unroll
  for (int s = 0; s < kDepth - 1; ++s) {
    issue(ring[s], p.cache, p.row_bytes, warp, lane, e_next);
    e_next = entry_at(irow, start + kBlockN * (s + 1) + (lane & (kBlockN - 1)), end);
  }

  uint32_t qf[8][4];
  float qscale[2] = {p.scale_log2, p.scale_log2};
#if EXACT
  {
    const __nv_bfloat16* q0 =
        p.q + (long long)token * p.q_st + (long long)(hg * kHeads + g) * p.q_sh + 128 * warp;
    const __nv_bfloat16* q1 = q0 + 8 * p.q_sh;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint2 v0 = *reinterpret_cast<const uint2*>(q0 + phys(c, j));
      const uint2 v1 = *reinterpret_cast<const uint2*>(q1 + phys(c, j));
      qf[j][0] = v0.x;
      qf[j][1] = v1.x;
      qf[j][2] = v0.y;
      qf[j][3] = v1.y;
    }
  }
#else
  // q: f16 fragments, each head scaled by a power of two (max |q| of the head below 2^15).
  {
    const __nv_bfloat16* q0 =
        p.q + (long long)token * p.q_st + (long long)(hg * kHeads + g) * p.q_sh + 128 * warp;
    const __nv_bfloat16* q1 = q0 + 8 * p.q_sh;
    uint2 v[2][8];
    float mx[2] = {0.f, 0.f};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      v[0][j] = *reinterpret_cast<const uint2*>(q0 + phys(c, j));
      v[1][j] = *reinterpret_cast<const uint2*>(q1 + phys(c, j));
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float2 a = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&v[r][j].x));
        const float2 b = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&v[r][j].y));
        mx[r] = fmaxf(mx[r], fmaxf(fmaxf(fabsf(a.x), fabsf(a.y)), fmaxf(fabsf(b.x), fabsf(b.y))));
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      if (c == 0) qmax[warp * kHeads + g + 8 * r] = mx[r];
    }
    __syncthreads();
    float up[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) m = fmaxf(m, qmax[w * kHeads + g + 8 * r]);
      int ex = 0;
      frexpf(m, &ex);  // m = f * 2^ex, f in [0.5, 1)
      const int sh = (m > 0.f) ? 15 - ex : 0;
      up[r] = ldexpf(1.f, sh);
      qscale[r] = ldexpf(1.f, -sh) * p.scale_log2;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float2 a = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&v[r][j].x));
        const float2 b = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&v[r][j].y));
        qf[j][r] = pack_f16(a.x * up[r], a.y * up[r]);
        qf[j][2 + r] = pack_f16(b.x * up[r], b.y * up[r]);
      }
    }
  }

#endif
  float o[8][2][4];
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int v = 0; v < 4; ++v) o[j][h][v] = 0.f;
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};

  // consume(n): refill the ring, wait for block n, load this lane's values and score them
  // (partial over this warp's tile); kv gets the V fragments (before movmatrix).
  int issued = kDepth - 1;
  auto consume = [&](int n, uint32_t (&kv)[kTiles][8][2], float (&s)[kTiles][4], bool (&valid)[kTiles][2]) {
    issue(ring[issued % kDepth], p.cache, p.row_bytes, warp, lane, e_next);
    ++issued;
    e_next = entry_at(irow, start + kBlockN * issued + (lane & (kBlockN - 1)), end);
    wait_groups<kDepth - 1>();
    __syncwarp();
    const Stage& st = ring[n % kDepth];
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      const int r = 8 * i + g;
      const uint4 lo = st.data[r][c ^ ((r & 1) << 2)];
      const uint4 hi = st.data[r][(4 + c) ^ ((r & 1) << 2)];
      const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
      for (int v = 0; v < 4; ++v) s[i][v] = 0.f;
#if EXACT
      const float sv = st.scale[r];
#if SPLITACC
      float s2[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        dequant(w[j], sv, kv[i][j][0], kv[i][j][1]);
        if (j & 1) mma(s2, qf[j], kv[i][j][0], kv[i][j][1]);
        else mma(s[i], qf[j], kv[i][j][0], kv[i][j][1]);
      }
#pragma unroll
      for (int v = 0; v < 4; ++v) s[i][v] += s2[v];
#else
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        dequant(w[j], sv, kv[i][j][0], kv[i][j][1]);
        mma(s[i], qf[j], kv[i][j][0], kv[i][j][1]);
      }
#endif
#else
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        kv[i][j][0] = e4m3x2_to_f16x2(w[j] & 0xffff);
        kv[i][j][1] = e4m3x2_to_f16x2(w[j] >> 16);
        mma(s[i], qf[j], kv[i][j][0], kv[i][j][1]);
      }
#endif
    }
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      valid[i][0] = st.entry[8 * i + 2 * c] >= 0;
      valid[i][1] = st.entry[8 * i + 2 * c + 1] >= 0;
#if !EXACT
      const float s0 = st.scale[8 * i + 2 * c], s1 = st.scale[8 * i + 2 * c + 1];
      s[i][0] *= s0;
      s[i][1] *= s1;
      s[i][2] *= s0;
      s[i][3] *= s1;
      const float sv = st.scale[8 * i + g];
      const uint32_t sv2 = pack_f16(sv, sv);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        kv[i][j][0] = hmul2(kv[i][j][0], sv2);
        kv[i][j][1] = hmul2(kv[i][j][1], sv2);
      }
#endif
    }
  };
  // softmax(n): sum the warps' partial scores of block n, update the running max and sums,
  // return P; alpha is the factor O must take before P V is added.
  auto softmax = [&](int n, float (&s)[kTiles][4], const bool (&valid)[kTiles][2], uint32_t (&pf)[kTiles / 2][4],
                     float (&alpha)[2]) -> bool {
    const int buf = n & 1;
#pragma unroll
    for (int i = 0; i < kTiles; ++i)
      xs[buf][warp][i][lane] = make_float4(s[i][0], s[i][1], s[i][2], s[i][3]);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      float4 t = xs[buf][0][i][lane];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) {
        const float4 u = xs[buf][w][i][lane];
        t.x += u.x;
        t.y += u.y;
        t.z += u.z;
        t.w += u.w;
      }
      s[i][0] = valid[i][0] ? t.x * qscale[0] : -INFINITY;
      s[i][1] = valid[i][1] ? t.y * qscale[0] : -INFINITY;
      s[i][2] = valid[i][0] ? t.z * qscale[1] : -INFINITY;
      s[i][3] = valid[i][1] ? t.w * qscale[1] : -INFINITY;
    }
    float mx[2], base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(s[0][2 * r], s[0][2 * r + 1]);
#pragma unroll
      for (int i = 1; i < kTiles; ++i) mx[r] = fmaxf(mx[r], fmaxf(s[i][2 * r], s[i][2 * r + 1]));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      mx[r] = fmaxf(mx[r], m[r]);
    }
    const bool grew = (mx[0] > m[0]) || (mx[1] > m[1]);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      base[r] = (mx[r] == -INFINITY) ? 0.f : mx[r];
      alpha[r] = exp2f(m[r] - base[r]);
      m[r] = mx[r];
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      const float e0 = exp2f(s[i][0] - base[0]), e1 = exp2f(s[i][1] - base[0]);
      const float e2 = exp2f(s[i][2] - base[1]), e3 = exp2f(s[i][3] - base[1]);
      l[0] += e0 + e1;
      l[1] += e2 + e3;
      pf[i / 2][2 * (i & 1)] = pack_p(e0, e1);
      pf[i / 2][2 * (i & 1) + 1] = pack_p(e2, e3);
    }
    return __any_sync(0xffffffffu, grew);
  };
  auto rescale = [&](const float (&alpha)[2]) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        o[j][h][0] *= alpha[0];
        o[j][h][1] *= alpha[0];
        o[j][h][2] *= alpha[1];
        o[j][h][3] *= alpha[1];
      }
  };

  for (int b = 0; b < nb; ++b) {
    uint32_t kv[kTiles][8][2], pf[kTiles / 2][4];
    float s[kTiles][4], alpha[2];
    bool valid[kTiles][2];
    consume(b, kv, s, valid);
    if (softmax(b, s, valid, pf, alpha)) rescale(alpha);
#pragma unroll
    for (int kk = 0; kk < kTiles / 2; ++kk)
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          mma(o[j][h], pf[kk], trans8x8(kv[2 * kk][j][h]), trans8x8(kv[2 * kk + 1][j][h]));
  }
  wait_groups<0>();

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
  const size_t smem = sizeof(Stage) * kDepth * kWarps + 2 * sizeof(float4) * kWarps * kTiles * 32 +
                      sizeof(float) * kWarps * kHeads;
  cudaError_t err = cudaFuncSetAttribute(regpath4_decode_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (err != cudaSuccess) return static_cast<int>(err);
  Params p{static_cast<const __nv_bfloat16*>(q),
           static_cast<const uint8_t*>(cache),
           static_cast<const int*>(idx),
           static_cast<float*>(part),
           static_cast<float*>(part_lse),
           static_cast<__nv_bfloat16*>(out),
           static_cast<float*>(lse),
           tokens, heads, width, per_split, splits, row_bytes, q_st, q_sh, idx_st, scale_log2};
  const int grid = tokens * splits * (heads / kHeads);
  regpath4_decode_kernel<<<grid, kThreads, smem, static_cast<cudaStream_t>(stream)>>>(p);
  return static_cast<int>(cudaGetLastError());
}
