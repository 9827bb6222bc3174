// The cache kernels of cache_kernels.cuh run on the CPU, for tests on machines without a GPU.
//
// Compiled as plain C++ (g++, CUDA headers only for their types): the kernels' own source
// runs one warp at a time, its 32 lanes as cooperative coroutines (ucontext) on one thread,
// switched at every warp-wide intrinsic (__shfl_xor_sync, __shfl_sync, __ballot_sync), so
// each lane sees exactly what the others hold at that point, as on a GPU. A lane that leaves
// the kernel while others wait at an intrinsic, or lanes at different intrinsics (undefined
// behaviour on a GPU), fail the launch. The numerics take their host branch (IEEE divide,
// software e4m3 conversion; checked against the reference by numerics_check.cu); the GPU
// tests cover the hardware's. Exports the library's C ABI, so nopebench's ctypes binding
// and every layout check run unchanged on CPU tensors (tests/test_cache_kernels_emulated.py).

#define __STORAGE__  // threadIdx and blockIdx become plain globals here, set per lane
#include <device_launch_parameters.h>
#include <ucontext.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

using std::max;
using std::min;

namespace emu {

constexpr int kLanes = 32;
constexpr size_t kStackBytes = 1 << 16;

struct Scheduler {
  ucontext_t main;
  ucontext_t lanes[kLanes];
  std::vector<char> stacks[kLanes];
  bool done[kLanes];
  int arrivals[kLanes];       // warp intrinsics each lane has reached
  uint32_t value[2][kLanes];  // what each lane contributed, double-buffered by arrival parity
  int current = 0;
  int warp_base = 0;
  unsigned block = 0;
  std::function<void()> body;
  std::string error;
};

Scheduler S;

void enter(int lane) {
  S.current = lane;
  threadIdx.x = static_cast<unsigned>(S.warp_base + lane);
  blockIdx.x = S.block;
  swapcontext(&S.main, &S.lanes[lane]);
}

void lane_entry() {
  S.body();
  S.done[S.current] = true;  // returning resumes S.main through uc_link
}

// Contribute `v` at a warp intrinsic, wait for the other lanes; returns the buffer to read.
int exchange(uint32_t v, unsigned mask) {
  const int lane = S.current;
  if (mask != 0xffffffffu && S.error.empty()) S.error = "warp intrinsic with a partial mask";
  const int g = S.arrivals[lane]++ & 1;
  S.value[g][lane] = v;
  swapcontext(&S.lanes[lane], &S.main);
  return g;
}

// Run one warp of the current launch; false (with S.error) when its lanes diverged.
bool run_warp(unsigned block, int warp) {
  S.block = block;
  S.warp_base = warp * kLanes;
  for (int lane = 0; lane < kLanes; ++lane) {
    S.stacks[lane].resize(kStackBytes);
    S.done[lane] = false;
    S.arrivals[lane] = 0;
    getcontext(&S.lanes[lane]);
    S.lanes[lane].uc_stack.ss_sp = S.stacks[lane].data();
    S.lanes[lane].uc_stack.ss_size = kStackBytes;
    S.lanes[lane].uc_link = &S.main;
    makecontext(&S.lanes[lane], lane_entry, 0);
  }
  for (;;) {
    for (int lane = 0; lane < kLanes; ++lane)
      if (!S.done[lane]) enter(lane);
    const int finished = static_cast<int>(std::count(S.done, S.done + kLanes, true));
    if (finished == kLanes) return S.error.empty();
    if (finished > 0) {
      S.error = "block " + std::to_string(block) + " warp " + std::to_string(warp) +
                ": lanes left the kernel while others wait at a warp intrinsic";
      return false;
    }
    if (!std::all_of(S.arrivals, S.arrivals + kLanes, [](int a) { return a == S.arrivals[0]; })) {
      S.error = "lanes of one warp at different warp intrinsics";
      return false;
    }
  }
}

}  // namespace emu

unsigned __shfl_xor_sync(unsigned mask, unsigned v, int lane_mask) {
  const int g = emu::exchange(v, mask);
  return emu::S.value[g][(emu::S.current ^ lane_mask) & 31];
}

float __shfl_sync(unsigned mask, float v, int src_lane) {
  uint32_t bits;
  memcpy(&bits, &v, 4);
  const int g = emu::exchange(bits, mask);
  float out;
  memcpy(&out, &emu::S.value[g][src_lane & 31], 4);
  return out;
}

unsigned __ballot_sync(unsigned mask, int predicate) {
  const int g = emu::exchange(predicate != 0, mask);
  unsigned ballot = 0;
  for (int lane = 0; lane < emu::kLanes; ++lane)
    if (emu::S.value[g][lane]) ballot |= 1u << lane;
  return ballot;
}

int __clz(unsigned x) { return x ? __builtin_clz(x) : 32; }

#ifndef __launch_bounds__
#define __launch_bounds__(...)  // an occupancy hint for nvcc only
#endif

#include "cache_kernels.cuh"

using namespace nopecache;

namespace {

template <typename Kernel>
int launch(int64_t blocks, Kernel kernel) {
  emu::S.error.clear();
  emu::S.body = kernel;
  for (int64_t b = 0; b < blocks; ++b)
    for (int w = 0; w < kWarpsPerBlock; ++w)
      if (!emu::run_warp(static_cast<unsigned>(b), w)) return cudaErrorLaunchFailure;
  return cudaSuccess;
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
