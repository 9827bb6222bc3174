// The CUDA launchers of the cache kernels (kernels in cache_kernels.cuh), as a plain C ABI.
//
// Each takes raw pointers, strides in elements, sizes, a device index and a cudaStream_t,
// and returns a cudaError_t; Python calls them through ctypes with tensor.data_ptr() and
// torch's current stream (nopebench/cache_kernels/library.py). No torch headers: the library
// builds on machines without a GPU or torch's CUDA headers.

#include <cuda_runtime.h>
#include <stdint.h>

#include "cache_kernels.cuh"

namespace {

// Make `device` this thread's current device in this library's runtime (it keeps its own,
// apart from torch's). Only calls cudaSetDevice when it changes, so a launch inside a CUDA
// graph capture makes no call beyond the launch itself in the usual single-GPU case.
cudaError_t use_device(int device) {
  int current = -1;
  cudaError_t err = cudaGetDevice(&current);
  if (err != cudaSuccess || current == device) return err;
  return cudaSetDevice(device);
}

}  // namespace

using namespace nopecache;

extern "C" {

int nopecache_abi_version(void) { return kAbiVersion; }

const char* nopecache_error_string(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

// concat_and_cache_ds_mla: write each token's packed row to its slot (slots < 0 skipped).
int nopecache_concat_and_cache_ds_mla(void* cache, int64_t num_slots, int row_bytes,
                                      const void* kv_c, int64_t kv_stride, const void* k_pe,
                                      int64_t pe_stride, int rope_dim, const void* slot_mapping,
                                      int slot_is_int64, int64_t tokens, int scale_format,
                                      int device, void* stream) {
  WriteParams p{static_cast<uint8_t*>(cache), num_slots, row_bytes,
                static_cast<const uint16_t*>(kv_c), kv_stride,
                static_cast<const uint16_t*>(k_pe), pe_stride, rope_dim, slot_mapping,
                slot_is_int64, tokens, scale_format, false, false};
  const int64_t blocks = plan_write(p);
  if (blocks <= 0) return blocks < 0 ? cudaErrorInvalidValue : cudaSuccess;
  cudaError_t err = use_device(device);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(blocks));
  auto s = static_cast<cudaStream_t>(stream);
  if (slot_is_int64)
    concat_and_cache_ds_mla_kernel<int64_t><<<grid, kThreads, 0, s>>>(p);
  else
    concat_and_cache_ds_mla_kernel<int32_t><<<grid, kThreads, 0, s>>>(p);
  return cudaGetLastError();
}

// cp_gather_and_upconvert_fp8_kv_cache: [total_rows, 576] bf16 from the rows the requests'
// block tables point at, every output element written.
int nopecache_gather_upconvert(const void* cache, int64_t num_blocks, int block_size,
                               int row_bytes, const void* block_table, int64_t bt_stride,
                               int max_blocks, const void* workspace_starts,
                               const void* seq_starts, int num_req, int64_t total_rows,
                               int rope_dim, void* out, int device, void* stream) {
  GatherParams p{static_cast<const uint8_t*>(cache), num_blocks, block_size, -1, row_bytes,
                 static_cast<const int32_t*>(block_table), bt_stride, max_blocks,
                 static_cast<const int32_t*>(workspace_starts),
                 static_cast<const int32_t*>(seq_starts), num_req, total_rows, rope_dim,
                 static_cast<uint16_t*>(out)};
  const int64_t blocks = plan_gather(p);
  if (blocks <= 0) return blocks < 0 ? cudaErrorInvalidValue : cudaSuccess;
  cudaError_t err = use_device(device);
  if (err != cudaSuccess) return err;
  gather_upconvert_kernel<<<dim3(static_cast<unsigned>(blocks)), kThreads, 0,
                            static_cast<cudaStream_t>(stream)>>>(p);
  return cudaGetLastError();
}

}  // extern "C"
