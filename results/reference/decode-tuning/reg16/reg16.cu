// Prototype: sparse NoPE decode for 16 heads with the dequantized rows kept in registers.
// One CTA = (query token, split); 4 warps, warp w owns latent dims [128w, 128w+128) (= scale
// tile w). Per 32-key block: raw rows cp.async'd into a ring; each warp converts its 128 dims
// of the 32 rows into bf16 mma.sync B fragments, computes its partial S = Q_w K_w^T, the four
// partials are summed through shared memory, every warp runs the same online softmax, and the
// same registers, transposed with movmatrix, feed O_w += P V_w.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#ifndef STAGES
#define STAGES 4
#endif
#ifndef TAU
#define TAU 8.f
#endif
#ifndef MINB
#define MINB 2
#endif

namespace {
#ifdef ROPE
// The shim's 656-byte rows: 64 bf16 RoPE lanes after the scales, q 576 wide; warp w adds
// RoPE lanes [16w, 16w + 16) to its partial scores (one more k-step, no conversion).
constexpr int ROW = 656;
constexpr int QK = 576;
constexpr int ROPE_OFF = 528;
#else
constexpr int ROW = 528;
constexpr int QK = 512;
#endif
constexpr int SCALE_OFF = 512;
constexpr int BN = 32;
constexpr int WARPS = 4;
constexpr int THREADS = 32 * WARPS;
constexpr int HEADS = 16;

struct Smem {
  uint8_t rows[STAGES][BN * ROW];
  int idx[STAGES][BN];
#ifdef IDX_SMEM
  int all[IDX_SMEM];  // the split's index entries, -1 past its end up to a whole block
#endif
  float4 red[WARPS][4][32];  // one buffer: the next write is past the next block's first barrier
#ifdef RS
  uint2 pbuf[WARPS][32];  // n-tile w's P (bf16 pairs), from warp w
  float lmax[WARPS][16];
  float lsum[WARPS][16];
#endif
#ifdef Q_SMEM
  uint4 qf[WARPS][8][32];
#endif
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Four e4m3 bytes -> two bf16x2 words of round_bf16(fp32(e) * s), as the reference rounds.
__device__ __forceinline__ void dequant4(uint32_t w, float s, uint32_t& lo, uint32_t& hi) {
  uint32_t h0, h1;
  asm("{\n .reg .b16 a, b;\n mov.b32 {a, b}, %2;\n cvt.rn.f16x2.e4m3x2 %0, a;\n"
      " cvt.rn.f16x2.e4m3x2 %1, b;\n}\n"
      : "=r"(h0), "=r"(h1)
      : "r"(w));
  __half2 x0 = *reinterpret_cast<__half2*>(&h0);
  __half2 x1 = *reinterpret_cast<__half2*>(&h1);
  __nv_bfloat162 r0 = __floats2bfloat162_rn(__fmul_rn(__low2float(x0), s),
                                            __fmul_rn(__high2float(x0), s));
  __nv_bfloat162 r1 = __floats2bfloat162_rn(__fmul_rn(__low2float(x1), s),
                                            __fmul_rn(__high2float(x1), s));
  lo = *reinterpret_cast<uint32_t*>(&r0);
  hi = *reinterpret_cast<uint32_t*>(&r1);
}

// Four e4m3 bytes -> two bf16x2 words holding e * 2^-112 exactly (every e4m3 value, zero
// included, lands on a normal bf16 or zero): e4m3 -> f16 in hardware, then the f16's exponent
// and 3-bit mantissa moved into the bf16 fields (bias 15 read as bias 127).
__device__ __forceinline__ void exact4(uint32_t w, uint32_t& lo, uint32_t& hi) {
  uint32_t h0, h1;
  asm("{\n .reg .b16 a, b;\n mov.b32 {a, b}, %2;\n cvt.rn.f16x2.e4m3x2 %0, a;\n"
      " cvt.rn.f16x2.e4m3x2 %1, b;\n}\n"
      : "=r"(h0), "=r"(h1)
      : "r"(w));
  lo = ((h0 & 0x7fff7fffu) >> 3) | (h0 & 0x80008000u);
  hi = ((h1 & 0x7fff7fffu) >> 3) | (h1 & 0x80008000u);
}

// 2^x; with FTZ the hardware's approximation with denormal results flushed to zero (a weight
// below 2^-126 changes nothing), without the range checks exp2f adds when denormals are kept.
__device__ __forceinline__ float ex2(float x) {
#ifdef FTZ
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

__device__ __forceinline__ uint32_t trans(uint32_t x) {
  uint32_t y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

__device__ __forceinline__ void mma(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack(float a, float b) {
  __nv_bfloat162 r = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&r);
}

// bf16x2 * 2^112, exact for |x| < 2^16.
__device__ __forceinline__ uint32_t up112(uint32_t x) {
  __nv_bfloat162 v = *reinterpret_cast<__nv_bfloat162*>(&x);
  const __nv_bfloat162 k = __floats2bfloat162_rn(0x1p112f, 0x1p112f);
  __nv_bfloat162 r = __hmul2_rn(v, k);
  return *reinterpret_cast<uint32_t*>(&r);
}

__device__ __forceinline__ int load_idx(const int* row, int pos, int end) {
  return pos < end ? __ldg(row + pos) : -1;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(THREADS, MINB)
    reg16_decode(const __nv_bfloat16* __restrict__ q, long long stride_qt,
                 const uint8_t* __restrict__ cache, const int* __restrict__ indices,
                 long long stride_it, int width, int per_split, float scale_log2,
                 __nv_bfloat16* __restrict__ out, float* __restrict__ lse,
                 float* __restrict__ part, float* __restrict__ part_lse, int tokens) {
  extern __shared__ __align__(128) uint8_t smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
  const int tok = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, c = lane & 3;
  const int* idx_row = indices + tok * stride_it;
  const int start = split * per_split;
  const int end = min(start + per_split, width);

  // Loader role: warp w brings rows 8w .. 8w+7 of each block, one row per instruction (lane l:
  // latent bytes [16l, 16l+16)), lane 0 also the row's scales. Lanes 0-7 hold the index entries
  // of the warp's eight rows.
  auto issue = [&](int stage, int my_idx) {
    uint8_t* base = sm.rows[stage] + 8 * w * ROW;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int ri = __shfl_sync(0xffffffffu, my_idx, k);
      const bool v = ri >= 0;
      const uint8_t* src = cache + (v ? (long long)ri * ROW : 0);
      uint8_t* dst = base + k * ROW;
      cp16(dst + 16 * lane, src + 16 * lane, v);
#ifdef ROPE
      if (lane < 9) cp16(dst + SCALE_OFF + 16 * lane, src + SCALE_OFF + 16 * lane, v);
#else
      if (lane == 0) cp16(dst + SCALE_OFF, src + SCALE_OFF, v);
#endif
    }
#ifndef IDX_SMEM
    if (lane < 8) sm.idx[stage][8 * w + lane] = my_idx;
#endif
  };
  const int lr = 8 * w + (lane & 7);

  // The number of 32-entry blocks up to the last valid entry of [start, end).
  __shared__ int last_s[WARPS];
  int last = -1;
#pragma unroll 8
  for (int p = start + tid; p < end; p += THREADS)
  {
    const int v = __ldg(idx_row + p);
#ifdef IDX_SMEM
    sm.all[p - start] = v;
#endif
    if (v >= 0) last = p;
  }
#ifdef IDX_SMEM
  for (int p = end - start + tid; p < ((end - start + BN - 1) / BN) * BN; p += THREADS) sm.all[p] = -1;
#endif
#pragma unroll
  for (int o = 16; o; o >>= 1) last = max(last, __shfl_xor_sync(0xffffffffu, last, o));
  if (lane == 0) last_s[w] = last;

  // q fragments of warp w: logical k {2c, 2c+1} of k-step s is dim 128w + 32c + 4s + {0, 1},
  // {2c+8, 2c+9} is + {2, 3}.
#ifdef ROPE
  uint32_t qr[4];
#endif
#ifdef Q_SMEM
  {
#else
  uint32_t qa[8][4];
  {
#endif
#ifdef ROPE
    {
      const __nv_bfloat16* r0 = q + tok * stride_qt + g * QK + 512 + 16 * w + 2 * c;
      const __nv_bfloat16* r8 = r0 + 8 * QK;
      qr[0] = *reinterpret_cast<const uint32_t*>(r0);
      qr[1] = *reinterpret_cast<const uint32_t*>(r8);
      qr[2] = *reinterpret_cast<const uint32_t*>(r0 + 8);
      qr[3] = *reinterpret_cast<const uint32_t*>(r8 + 8);
    }
#endif
    const __nv_bfloat16* q0 = q + tok * stride_qt + g * QK + 128 * w + 32 * c;
    const __nv_bfloat16* q8 = q0 + 8 * QK;
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      uint2 a = *reinterpret_cast<const uint2*>(q0 + 4 * s);
      uint2 b = *reinterpret_cast<const uint2*>(q8 + 4 * s);
#ifdef FOLD
      a.x = up112(a.x); a.y = up112(a.y); b.x = up112(b.x); b.y = up112(b.y);
#endif
#ifdef Q_SMEM
      sm.qf[w][s][lane] = make_uint4(a.x, b.x, a.y, b.y);
#else
      qa[s][0] = a.x;
      qa[s][1] = b.x;
      qa[s][2] = a.y;
      qa[s][3] = b.y;
#endif
    }
  }
  __syncthreads();
  last = max(max(last_s[0], last_s[1]), max(last_s[2], last_s[3]));
  const int nblocks = last < 0 ? 0 : (last - start) / BN + 1;

#pragma unroll
#ifdef MERGE
  // All stages fill first; each block's refill follows its first barrier, and the wait for the
  // next block rides on its last one, so a block costs two barriers.
  for (int s = 0; s < STAGES; ++s) {
    if (s < nblocks) issue(s, sm.all[s * BN + lr]);
    commit();
  }
  wait_group<STAGES - 1>();
  __syncthreads();
#endif
#ifndef MERGE
  for (int s = 0; s < STAGES - 1; ++s) {
#ifdef IDX_SMEM
    if (s < nblocks) issue(s, sm.all[s * BN + lr]);
#else
    if (s < nblocks) issue(s, load_idx(idx_row, start + s * BN + lr, end));
#endif
    commit();
  }
#endif
#ifndef IDX_SMEM
  int idx_next = load_idx(idx_row, start + (STAGES - 1) * BN + lr, end);
#endif

  float o[8][2][4];
#pragma unroll
  for (int s = 0; s < 8; ++s)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[s][h][e] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

  for (int b = 0; b < nblocks; ++b) {
#ifndef MERGE
    wait_group<STAGES - 2>();
    __syncthreads();
#ifdef IDX_SMEM
    if (b + STAGES - 1 < nblocks) issue((b + STAGES - 1) % STAGES, sm.all[(b + STAGES - 1) * BN + lr]);
#else
    if (b + STAGES - 1 < nblocks) issue((b + STAGES - 1) % STAGES, idx_next);
#endif
    commit();
#endif
#ifndef IDX_SMEM
    idx_next = load_idx(idx_row, start + (b + STAGES) * BN + lr, end);
#endif
    const int st = b % STAGES;
    const uint8_t* rows = sm.rows[st];

    uint32_t kb[4][8][2];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint8_t* rp = rows + (8 * j + g) * ROW;
      const uint4 v0 = *reinterpret_cast<const uint4*>(rp + 128 * w + 32 * c);
      const uint4 v1 = *reinterpret_cast<const uint4*>(rp + 128 * w + 32 * c + 16);
      const float sc = *reinterpret_cast<const float*>(rp + SCALE_OFF + 4 * w);
      const uint32_t wd[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
#ifdef FOLD
      (void)sc;
      for (int s = 0; s < 8; ++s) exact4(wd[s], kb[j][s][0], kb[j][s][1]);
#elif defined(PROBE_NOCVT)
      for (int s = 0; s < 8; ++s) { kb[j][s][0] = wd[s] & 0x3f3f3f3fu; kb[j][s][1] = __float_as_uint(sc) & 0x3f3f3f3fu; }
#else
      for (int s = 0; s < 8; ++s) dequant4(wd[s], sc, kb[j][s][0], kb[j][s][1]);
#endif
    }
    float acc[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    }
#pragma unroll
    for (int s = 0; s < 8; ++s) {
#ifdef Q_SMEM
      const uint4 qv = sm.qf[w][s][lane];
      const uint32_t qs[4] = {qv.x, qv.y, qv.z, qv.w};
#else
      const uint32_t* qs = qa[s];
#endif
#pragma unroll
      for (int j = 0; j < 4; ++j) mma(acc[j], qs, kb[j][s][0], kb[j][s][1]);
    }
#ifdef ROPE
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint8_t* rr = rows + (8 * j + g) * ROW + ROPE_OFF + 2 * (16 * w + 2 * c);
      mma(acc[j], qr, *reinterpret_cast<const uint32_t*>(rr),
          *reinterpret_cast<const uint32_t*>(rr + 16));
    }
#endif
#ifdef FOLD
    float ks[4][2];  // scales of keys 8j + 2c + {0, 1} for tile w
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      ks[j][0] = *reinterpret_cast<const float*>(rows + (8 * j + 2 * c) * ROW + SCALE_OFF + 4 * w);
      ks[j][1] = *reinterpret_cast<const float*>(rows + (8 * j + 2 * c + 1) * ROW + SCALE_OFF + 4 * w);
      acc[j][0] *= ks[j][0];
      acc[j][1] *= ks[j][1];
      acc[j][2] *= ks[j][0];
      acc[j][3] *= ks[j][1];
    }
#endif
#pragma unroll
    for (int j = 0; j < 4; ++j)
      sm.red[w][j][lane] = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
#ifdef RS
    __syncthreads();
#ifdef MERGE
    if (b + STAGES < nblocks) issue(st, sm.all[(b + STAGES) * BN + lr]);
    commit();
#endif
    {
      // Warp w sums n-tile w (keys 8w .. 8w+7) over the four partials and runs its slice of the
      // softmax against a shared reference max, moved only when some score passes it by TAU.
      float4 t = sm.red[0][w][lane];
#pragma unroll
      for (int ww = 1; ww < WARPS; ++ww) {
        const float4 u = sm.red[ww][w][lane];
        t.x += u.x;
        t.y += u.y;
        t.z += u.z;
        t.w += u.w;
      }
#ifdef IDX_SMEM
      const int2 iv = *reinterpret_cast<const int2*>(&sm.all[b * BN + 8 * w + 2 * c]);
#else
      const int2 iv = *reinterpret_cast<const int2*>(&sm.idx[st][8 * w + 2 * c]);
#endif
      const float v0 = iv.x >= 0 ? t.x * scale_log2 : -INFINITY;
      const float v1 = iv.y >= 0 ? t.y * scale_log2 : -INFINITY;
      const float v2 = iv.x >= 0 ? t.z * scale_log2 : -INFINITY;
      const float v3 = iv.y >= 0 ? t.w * scale_log2 : -INFINITY;
      float x0 = fmaxf(v0, v1), x1 = fmaxf(v2, v3);
      x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 1));
      x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 2));
      x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 1));
      x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 2));
      if (c == 0) {
        sm.lmax[w][g] = x0;
        sm.lmax[w][g + 8] = x1;
      }
      const bool grow = x0 > m0 + TAU || x1 > m1 + TAU;
      float z0 = m0 == -INFINITY ? 0.f : m0, z1 = m1 == -INFINITY ? 0.f : m1;
      float p0 = ex2(v0 - z0), p1 = ex2(v1 - z0), p2 = ex2(v2 - z1), p3 = ex2(v3 - z1);
      sm.pbuf[w][lane] = make_uint2(pack(p0, p1), pack(p2, p3));
#ifdef MERGE
      wait_group<STAGES - 1>();
#endif
      if (__syncthreads_or(grow)) {
        float n0 = m0, n1 = m1;
#pragma unroll
        for (int ww = 0; ww < WARPS; ++ww) {
          n0 = fmaxf(n0, sm.lmax[ww][g]);
          n1 = fmaxf(n1, sm.lmax[ww][g + 8]);
        }
        const float y0 = n0 == -INFINITY ? 0.f : n0, y1 = n1 == -INFINITY ? 0.f : n1;
        const float a0 = ex2(m0 - y0), a1 = ex2(m1 - y1);
        m0 = n0;
        m1 = n1;
        l0 *= a0;
        l1 *= a1;
#pragma unroll
        for (int s2 = 0; s2 < 8; ++s2)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            o[s2][h][0] *= a0;
            o[s2][h][1] *= a0;
            o[s2][h][2] *= a1;
            o[s2][h][3] *= a1;
          }
        p0 = ex2(v0 - y0);
        p1 = ex2(v1 - y0);
        p2 = ex2(v2 - y1);
        p3 = ex2(v3 - y1);
        __syncthreads();
        sm.pbuf[w][lane] = make_uint2(pack(p0, p1), pack(p2, p3));
        __syncthreads();
      }
      l0 += p0 + p1;
      l1 += p2 + p3;
      uint32_t pa[2][4];
#pragma unroll
      for (int tt = 0; tt < 2; ++tt) {
        const uint2 e0 = sm.pbuf[2 * tt][lane], e1 = sm.pbuf[2 * tt + 1][lane];
        pa[tt][0] = e0.x;
        pa[tt][1] = e0.y;
        pa[tt][2] = e1.x;
        pa[tt][3] = e1.y;
      }
#pragma unroll
      for (int s2 = 0; s2 < 8; ++s2)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int tt = 0; tt < 2; ++tt)
            mma(o[s2][h], pa[tt], trans(kb[2 * tt][s2][h]), trans(kb[2 * tt + 1][s2][h]));
    }
#else
    __syncthreads();
    float sc4[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float4 t = sm.red[0][j][lane];
#pragma unroll
      for (int ww = 1; ww < WARPS; ++ww) {
        const float4 u = sm.red[ww][j][lane];
        t.x += u.x;
        t.y += u.y;
        t.z += u.z;
        t.w += u.w;
      }
#ifdef IDX_SMEM
      const int2 iv = *reinterpret_cast<const int2*>(&sm.all[b * BN + 8 * j + 2 * c]);
#else
      const int2 iv = *reinterpret_cast<const int2*>(&sm.idx[st][8 * j + 2 * c]);
#endif
#ifdef FOLD
      // every warp scales its own partial by its tile's scale before the sum
#endif
      sc4[j][0] = iv.x >= 0 ? t.x * scale_log2 : -INFINITY;
      sc4[j][1] = iv.y >= 0 ? t.y * scale_log2 : -INFINITY;
      sc4[j][2] = iv.x >= 0 ? t.z * scale_log2 : -INFINITY;
      sc4[j][3] = iv.y >= 0 ? t.w * scale_log2 : -INFINITY;
    }
    float x0 = fmaxf(fmaxf(sc4[0][0], sc4[0][1]), fmaxf(sc4[1][0], sc4[1][1]));
    x0 = fmaxf(x0, fmaxf(fmaxf(sc4[2][0], sc4[2][1]), fmaxf(sc4[3][0], sc4[3][1])));
    float x1 = fmaxf(fmaxf(sc4[0][2], sc4[0][3]), fmaxf(sc4[1][2], sc4[1][3]));
    x1 = fmaxf(x1, fmaxf(fmaxf(sc4[2][2], sc4[2][3]), fmaxf(sc4[3][2], sc4[3][3])));
    x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 1));
    x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 2));
    x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 1));
    x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 2));
    const float n0 = fmaxf(m0, x0), n1 = fmaxf(m1, x1);
    const float z0 = n0 == -INFINITY ? 0.f : n0, z1 = n1 == -INFINITY ? 0.f : n1;
    const float a0 = ex2(m0 - z0), a1 = ex2(m1 - z1);
    m0 = n0;
    m1 = n1;
    float p[4][4];
#ifdef FOLD
    float pw[4][4];
#endif
    float s0 = 0.f, s1 = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      p[j][0] = ex2(sc4[j][0] - z0);
      p[j][1] = ex2(sc4[j][1] - z0);
      p[j][2] = ex2(sc4[j][2] - z1);
      p[j][3] = ex2(sc4[j][3] - z1);
      s0 += p[j][0] + p[j][1];
      s1 += p[j][2] + p[j][3];
    }
    l0 = l0 * a0 + s0;
    l1 = l1 * a1 + s1;
    const bool rescale = __any_sync(0xffffffffu, a0 != 1.f || a1 != 1.f);
    uint32_t pa[2][4];
#ifdef FOLD
    // P' = P * s * 2^48 for this warp's tile; O then accumulates in units of 2^-64.
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float k0 = ks[j][0] * 0x1p48f, k1 = ks[j][1] * 0x1p48f;
      pw[j][0] = p[j][0] * k0;
      pw[j][1] = p[j][1] * k1;
      pw[j][2] = p[j][2] * k0;
      pw[j][3] = p[j][3] * k1;
    }
#define PV pw
#else
#define PV p
#endif
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      pa[t][0] = pack(PV[2 * t][0], PV[2 * t][1]);
      pa[t][1] = pack(PV[2 * t][2], PV[2 * t][3]);
      pa[t][2] = pack(PV[2 * t + 1][0], PV[2 * t + 1][1]);
      pa[t][3] = pack(PV[2 * t + 1][2], PV[2 * t + 1][3]);
    }
#pragma unroll
    for (int s = 0; s < 8; ++s)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (rescale) {
          o[s][h][0] *= a0;
          o[s][h][1] *= a0;
          o[s][h][2] *= a1;
          o[s][h][3] *= a1;
        }
#ifndef PROBE_NOPV
#pragma unroll
        for (int t = 0; t < 2; ++t)
          mma(o[s][h], pa[t], trans(kb[2 * t][s][h]), trans(kb[2 * t + 1][s][h]));
#else
        o[s][h][0] += __uint_as_float(kb[0][s][h] & 0x3f3f3f3fu) * pa[0][0];
#endif
      }
#endif
  }

  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
#ifdef RS
  if (c == 0) {
    sm.lsum[w][g] = l0;
    sm.lsum[w][g + 8] = l1;
  }
  __syncthreads();
  l0 = ((sm.lsum[0][g] + sm.lsum[1][g]) + sm.lsum[2][g]) + sm.lsum[3][g];
  l1 = ((sm.lsum[0][g + 8] + sm.lsum[1][g + 8]) + sm.lsum[2][g + 8]) + sm.lsum[3][g + 8];
#endif
#ifdef FOLD
  const float i0 = l0 > 0.f ? 0x1p64f / l0 : 0.f, i1 = l1 > 0.f ? 0x1p64f / l1 : 0.f;
#else
  const float i0 = l0 > 0.f ? 1.f / l0 : 0.f, i1 = l1 > 0.f ? 1.f / l1 : 0.f;
#endif
  const float LN2 = 0.6931471805599453f;
  const float e0 = l0 > 0.f ? (m0 + __log2f(l0)) * LN2 : -INFINITY;
  const float e1 = l1 > 0.f ? (m1 + __log2f(l1)) * LN2 : -INFINITY;
  const int dim0 = 128 * w + 32 * c;
  if (splits == 1) {
    __nv_bfloat16* r0 = out + ((long long)tok * HEADS + g) * 512 + dim0;  // out is 512 wide either way
    __nv_bfloat16* r1 = r0 + 8 * 512;
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
      lse[tok * HEADS + g] = e0;
      lse[tok * HEADS + g + 8] = e1;
    }
  } else {
    float* r0 = part + (((long long)split * tokens + tok) * HEADS + g) * 512 + dim0;
    float* r1 = r0 + 8 * 512;
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      *reinterpret_cast<float4*>(r0 + 4 * s) =
          make_float4(o[s][0][0] * i0, o[s][0][1] * i0, o[s][1][0] * i0, o[s][1][1] * i0);
      *reinterpret_cast<float4*>(r1 + 4 * s) =
          make_float4(o[s][0][2] * i1, o[s][0][3] * i1, o[s][1][2] * i1, o[s][1][3] * i1);
    }
    if (w == 0 && c == 0) {
      part_lse[((long long)split * tokens + tok) * HEADS + g] = e0;
      part_lse[((long long)split * tokens + tok) * HEADS + g + 8] = e1;
    }
  }
}

extern "C" int reg16_launch(const void* q, long long stride_qt, const void* cache,
                            const int* indices, long long stride_it, int width, int per_split,
                            int splits, float scale_log2, void* out, float* lse, float* part,
                            float* part_lse, int tokens, void* stream) {
  static bool attr = false;
  const int bytes = sizeof(Smem);
  if (!attr) {
    cudaError_t e = cudaFuncSetAttribute(reg16_decode,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e != cudaSuccess) return (int)e;
    attr = true;
  }
  dim3 grid(tokens, splits);
  reg16_decode<<<grid, THREADS, bytes, (cudaStream_t)stream>>>(
      (const __nv_bfloat16*)q, stride_qt, (const uint8_t*)cache, indices, stride_it, width,
      per_split, scale_log2, (__nv_bfloat16*)out, lse, part, part_lse, tokens);
  return (int)cudaGetLastError();
}

extern "C" int reg16_smem_bytes() { return (int)sizeof(Smem); }
