// Sparse MLA decode over packed fp8_ds_mla rows, 16 heads a CTA, the dequantized rows kept in
// registers (SM89+: mma.sync, cp.async, movmatrix and the e4m3x2 conversion; planned on SM90).
//
// Row layout (nopebench/cuda/row_layout.h): bytes 0:512 hold 512 e4m3 latent values in four
// tiles of 128, bytes 512:528 four fp32 scales (one a tile), bytes 528:656 64 bf16 RoPE lanes
// (absent in 528-byte rows). One source, two kernels: `register_decode_qk512` scores the latent
// only (NoPE), `register_decode_qk576` adds the RoPE lanes (RoPE or the zero-padded shim), so the
// two differ in one k-step and in the bytes a row brings, nothing else.
//
// One CTA is one (query token, split, head block of 16): 4 warps, 2 CTAs an SM. Warp w owns
// latent dims [128w, 128w + 128), which is scale tile w. Per 32-key block:
//   1. the block's raw rows arrive in a cp.async ring (kStages slots; warp w brings rows
//      8w .. 8w + 7, one row per instruction);
//   2. each warp converts its 128 dims of the 32 rows straight into mma.sync B fragments,
//      rounding as the reference does (e4m3 -> f16 -> f32 * scale -> bf16), and computes its
//      partial scores S_w = Q_w K_w^T (the k order permuted so that one 16-byte shared load
//      feeds four k-steps);
//   3. the partials are reduce-scattered through shared memory: warp w sums keys 8w .. 8w + 7
//      over the four partials and runs their softmax against a reference max shared by every
//      warp, which moves only when a score passes it by 2^kTau (one __syncthreads_or a block
//      tells every warp; the rare move rescales O and l and rewrites P);
//   4. P goes back through shared memory, and the same K registers, transposed with movmatrix,
//      are the V fragments of O_w += P V_w.
// A split writes its normalized partial output and log-sum-exp; the combine kernel merges them.
// The algorithm is in register_decode.cuh; this file gives its device primitives as PTX, the
// kernels and their launch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace nopedecode {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; an invalid source copies nothing and zero-fills.
__device__ __forceinline__ void cp16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Four e4m3 bytes -> two bf16x2 words of bf16(f32(e) * s), as the reference rounds.
__device__ __forceinline__ void dequant4(uint32_t w, float s, uint32_t& lo, uint32_t& hi) {
  uint32_t h0, h1;
  asm("{\n .reg .b16 a, b;\n mov.b32 {a, b}, %2;\n cvt.rn.f16x2.e4m3x2 %0, a;\n"
      " cvt.rn.f16x2.e4m3x2 %1, b;\n}\n"
      : "=r"(h0), "=r"(h1)
      : "r"(w));
  const __half2 x0 = *reinterpret_cast<__half2*>(&h0);
  const __half2 x1 = *reinterpret_cast<__half2*>(&h1);
  __nv_bfloat162 r0 = __floats2bfloat162_rn(__fmul_rn(__low2float(x0), s),
                                            __fmul_rn(__high2float(x0), s));
  __nv_bfloat162 r1 = __floats2bfloat162_rn(__fmul_rn(__low2float(x1), s),
                                            __fmul_rn(__high2float(x1), s));
  lo = *reinterpret_cast<uint32_t*>(&r0);
  hi = *reinterpret_cast<uint32_t*>(&r1);
}

__device__ __forceinline__ uint32_t transpose(uint32_t x) {
  uint32_t y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// d += a b: 16 x 16 bf16 A, 16 x 8 bf16 B, fp32 accumulators.
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

}  // namespace nopedecode

#include "register_decode.cuh"

extern "C" __global__ void __launch_bounds__(nopedecode::kThreads, nopedecode::kMinBlocks)
    register_decode_qk512(const nopedecode::Params a) {
  extern __shared__ __align__(128) uint8_t smem[];
  nopedecode::decode<false>(a, smem);
}

extern "C" __global__ void __launch_bounds__(nopedecode::kThreads, nopedecode::kMinBlocks)
    register_decode_qk576(const nopedecode::Params a) {
  extern __shared__ __align__(128) uint8_t smem[];
  nopedecode::decode<true>(a, smem);
}

namespace nopedecode {

constexpr int kMaxDevices = 64;  // devices whose shared-memory opt-in is remembered

template <bool kRope>
int launch(const Params& a, cudaStream_t stream) {
  const int bytes = smem_bytes(kRope);
  auto kernel = kRope ? register_decode_qk576 : register_decode_qk512;
  // The shared-memory opt-in, once per device (outside any graph capture: the binding's first
  // launch on a device is an eager one).
  static bool opted_in[kMaxDevices] = {};
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return static_cast<int>(e);
  if (device >= kMaxDevices) return static_cast<int>(cudaErrorInvalidDevice);
  if (!opted_in[device]) {
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e != cudaSuccess) return static_cast<int>(e);
    opted_in[device] = true;
  }
  const dim3 grid(a.tokens, a.splits, a.heads / kHeads);
  kernel<<<grid, kThreads, bytes, stream>>>(a);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace nopedecode

extern "C" {

const char* nopedecode_error_string(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

// Sparse decode of `a.tokens` query tokens on `stream`; 0 or a cudaError_t code.
int nopedecode_register_decode(const nopedecode::Params* a, int rope, void* stream) {
  if (a == nullptr) return static_cast<int>(cudaErrorInvalidValue);
  if (int e = nopedecode::check(*a, rope)) return e;
  if (a->tokens == 0) return 0;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  return rope ? nopedecode::launch<true>(*a, s) : nopedecode::launch<false>(*a, s);
}

}  // extern "C"
