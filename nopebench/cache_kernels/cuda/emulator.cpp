// The cache kernels of cache_kernels.cuh run on the CPU, for tests on machines without a GPU.
//
// Compiled as plain C++ (g++, CUDA headers only for their types) with nopebench/cuda/emulator.h,
// which runs a CTA's threads as cooperative coroutines switched at every warp intrinsic
// (__shfl_xor_sync, __shfl_sync, __ballot_sync here), so each lane sees exactly what the others
// hold at that point, as on a GPU, and fails the launch on what a GPU leaves undefined. The
// numerics take their host branch (IEEE divide, software e4m3 conversion; checked against the
// reference by numerics_check.cu); the GPU tests cover the hardware's. Exports the library's C
// ABI, so nopebench's ctypes binding and every layout check run unchanged on CPU tensors
// (tests/test_cache_kernels_emulated.py).

#include "emulator.h"

#include "cache_kernels.cuh"

using namespace nopecache;

namespace {

template <typename Kernel>
int launch(int64_t blocks, Kernel kernel) {
  const bool ok = emu::launch({blocks}, kWarpsPerBlock * emu::kLanes, kernel);
  return ok ? cudaSuccess : cudaErrorLaunchFailure;
}

}  // namespace

extern "C" {

int nopecache_abi_version(void) { return kAbiVersion; }

const char* nopecache_error_string(int code) {
  if (code == cudaErrorInvalidValue) return "invalid argument";
  return emu::S.error.empty() ? "emulated launch failed" : emu::S.error.c_str();
}

int nopecache_concat_and_cache_ds_mla(void* cache, int64_t num_slots, int row_bytes,
                                      const void* kv_c, int64_t kv_stride, const void* k_pe,
                                      int64_t pe_stride, int rope_dim, const void* slot_mapping,
                                      int slot_is_int64, int64_t tokens, int scale_format,
                                      int device, void* stream) {
  (void)device;
  (void)stream;
  WriteParams p{static_cast<uint8_t*>(cache), num_slots, row_bytes,
                static_cast<const uint16_t*>(kv_c), kv_stride,
                static_cast<const uint16_t*>(k_pe), pe_stride, rope_dim, slot_mapping,
                slot_is_int64, tokens, scale_format, false, false};
  const int64_t blocks = plan_write(p);
  if (blocks <= 0) return blocks < 0 ? cudaErrorInvalidValue : cudaSuccess;
  if (slot_is_int64) return launch(blocks, [p] { concat_and_cache_ds_mla_kernel<int64_t>(p); });
  return launch(blocks, [p] { concat_and_cache_ds_mla_kernel<int32_t>(p); });
}

int nopecache_gather_upconvert(const void* cache, int64_t num_blocks, int block_size,
                               int row_bytes, const void* block_table, int64_t bt_stride,
                               int max_blocks, const void* workspace_starts,
                               const void* seq_starts, int num_req, int64_t total_rows,
                               int rope_dim, void* out, int device, void* stream) {
  (void)device;
  (void)stream;
  GatherParams p{static_cast<const uint8_t*>(cache), num_blocks, block_size, -1, row_bytes,
                 static_cast<const int32_t*>(block_table), bt_stride, max_blocks,
                 static_cast<const int32_t*>(workspace_starts),
                 static_cast<const int32_t*>(seq_starts), num_req, total_rows, rope_dim,
                 static_cast<uint16_t*>(out)};
  const int64_t blocks = plan_gather(p);
  if (blocks <= 0) return blocks < 0 ? cudaErrorInvalidValue : cudaSuccess;
  return launch(blocks, [p] { gather_upconvert_kernel(p); });
}

}  // extern "C"
