// CUDA's thread model on the CPU, for the kernels' tests on machines without a GPU.
//
// A kernel's own source, compiled as plain C++ (g++, the CUDA headers only for their types),
// runs one CTA at a time: its threads are cooperative coroutines (ucontext) on one host
// thread, switched at every warp intrinsic (shuffles, ballots, and the warp-wide exchanges an
// emulated mma.sync or movmatrix needs) and at every __syncthreads, so each thread sees exactly
// what the others hold at that point, as on a GPU. What a GPU leaves undefined fails the launch
// with a message: a thread that leaves the kernel while others wait, lanes of one warp at
// different intrinsics, a barrier that not every thread of the CTA reaches, a partial mask.
//
// Include it first in an emulator translation unit (it defines threadIdx and blockIdx), then
// the kernel's header, then call emu::launch with a body that runs one thread of the kernel.
#pragma once

#define __STORAGE__  // threadIdx and blockIdx become plain globals here, set per thread
#include <device_launch_parameters.h>
#include <stdint.h>
#include <string.h>
#include <ucontext.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

using std::max;
using std::min;

#ifndef __launch_bounds__
#define __launch_bounds__(...)  // an occupancy hint for nvcc only
#endif

namespace emu {

constexpr int kLanes = 32;
constexpr int kWords = 8;  // words a lane can contribute to one warp exchange
constexpr size_t kStackBytes = 1 << 16;

enum class Wait { kNone, kWarp, kBlock };

struct Thread {
  ucontext_t context;
  std::vector<char> stack;
  bool done = false;
  Wait wait = Wait::kNone;
  int warp_arrivals = 0;   // warp intrinsics this thread has reached
  int block_arrivals = 0;  // barriers this thread has reached
};

struct Scheduler {
  ucontext_t main;
  std::vector<Thread> threads;
  // What each thread contributed, double-buffered by arrival parity: one switch an intrinsic.
  std::vector<uint32_t> words[2];  // [thread * kWords + i]
  std::vector<int> flags[2];       // [thread], for __syncthreads_or
  int current = 0;
  std::function<void()> body;
  std::string error;
};

inline Scheduler S;

inline void fail(const std::string& why) {
  if (S.error.empty()) S.error = why;
}

inline void thread_entry() {
  S.body();
  S.threads[S.current].done = true;  // returning resumes S.main through uc_link
}

inline void suspend(Wait kind) {
  Thread& t = S.threads[S.current];
  t.wait = kind;
  swapcontext(&t.context, &S.main);
}

// Contribute `n` words at a warp intrinsic and wait for the other lanes; returns the warp's
// contributions, lane l's at [l * kWords].
inline const uint32_t* exchange(const uint32_t* v, int n, unsigned mask = 0xffffffffu) {
  if (mask != 0xffffffffu) fail("warp intrinsic with a partial mask");
  Thread& t = S.threads[S.current];
  const int parity = t.warp_arrivals++ & 1;
  memcpy(&S.words[parity][S.current * kWords], v, sizeof(uint32_t) * n);
  suspend(Wait::kWarp);
  return &S.words[parity][(S.current & ~(kLanes - 1)) * kWords];
}

inline int lane() { return S.current & (kLanes - 1); }

// Release the threads a complete intrinsic or barrier waits on; false when none can go on.
inline bool release(int cta) {
  const int n = static_cast<int>(S.threads.size());
  bool any = false;
  for (int base = 0; base < n; base += kLanes) {
    Thread* w = &S.threads[base];
    const bool at_warp = std::all_of(w, w + kLanes, [&](const Thread& t) {
      return t.wait == Wait::kWarp && t.warp_arrivals == w[0].warp_arrivals;
    });
    if (at_warp) {
      for (int l = 0; l < kLanes; ++l) w[l].wait = Wait::kNone;
      any = true;
    } else if (std::any_of(w, w + kLanes, [](const Thread& t) { return t.wait == Wait::kWarp; })) {
      fail("CTA " + std::to_string(cta) + " warp " + std::to_string(base / kLanes) +
           ": lanes of one warp at different intrinsics, or some left the kernel");
      return false;
    }
  }
  if (any) return true;
  const bool at_block = std::all_of(S.threads.begin(), S.threads.end(), [&](const Thread& t) {
    return t.wait == Wait::kBlock && t.block_arrivals == S.threads[0].block_arrivals;
  });
  if (at_block) {
    for (Thread& t : S.threads) t.wait = Wait::kNone;
    return true;
  }
  fail("CTA " + std::to_string(cta) + ": a barrier that not every thread reaches");
  return false;
}

// Run one CTA of `threads` threads (a multiple of 32); false (with S.error) on a failure.
inline bool run_cta(unsigned x, unsigned y, unsigned z, int threads, int cta) {
  S.threads.resize(threads);
  for (auto& w : S.words) w.assign(static_cast<size_t>(threads) * kWords, 0);
  for (auto& f : S.flags) f.assign(threads, 0);
  for (Thread& t : S.threads) {
    t.stack.resize(kStackBytes);
    t.done = false;
    t.wait = Wait::kNone;
    t.warp_arrivals = t.block_arrivals = 0;
    getcontext(&t.context);
    t.context.uc_stack.ss_sp = t.stack.data();
    t.context.uc_stack.ss_size = kStackBytes;
    t.context.uc_link = &S.main;
    makecontext(&t.context, thread_entry, 0);
  }
  blockIdx.x = x;
  blockIdx.y = y;
  blockIdx.z = z;
  for (;;) {
    for (int i = 0; i < threads; ++i) {
      Thread& t = S.threads[i];
      if (t.done || t.wait != Wait::kNone) continue;
      S.current = i;
      threadIdx.x = static_cast<unsigned>(i);
      swapcontext(&S.main, &t.context);
    }
    if (!S.error.empty()) return false;
    if (std::all_of(S.threads.begin(), S.threads.end(), [](const Thread& t) { return t.done; }))
      return true;
    if (!release(cta)) return false;
  }
}

// A launch's grid, in CTAs.
struct Grid {
  long long x = 1, y = 1, z = 1;
};

// A launch of `grid` CTAs of `threads` threads, each thread running `body`, `before_cta` (if
// any) before each CTA; false (with S.error) at the first CTA that fails.
inline bool launch(Grid grid, int threads, std::function<void()> body,
                   const std::function<void()>& before_cta = {}) {
  S.error.clear();
  S.body = std::move(body);
  int cta = 0;
  for (long long z = 0; z < grid.z; ++z)
    for (long long y = 0; y < grid.y; ++y)
      for (long long x = 0; x < grid.x; ++x, ++cta) {
        if (before_cta) before_cta();
        const auto u = [](long long v) { return static_cast<unsigned>(v); };
        if (!run_cta(u(x), u(y), u(z), threads, cta)) return false;
      }
  return true;
}

}  // namespace emu

// The warp intrinsics the kernels use, on 4-byte values.
template <typename T>
T __shfl_sync(unsigned mask, T v, int src_lane) {
  static_assert(sizeof(T) == 4, "4-byte shuffles");
  uint32_t bits;
  memcpy(&bits, &v, 4);
  const uint32_t* all = emu::exchange(&bits, 1, mask);
  T out;
  memcpy(&out, &all[(src_lane & 31) * emu::kWords], 4);
  return out;
}

template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  return __shfl_sync(mask, v, emu::lane() ^ lane_mask);
}

inline unsigned __ballot_sync(unsigned mask, int predicate) {
  const uint32_t mine = predicate != 0;
  const uint32_t* all = emu::exchange(&mine, 1, mask);
  unsigned ballot = 0;
  for (int l = 0; l < emu::kLanes; ++l)
    if (all[l * emu::kWords]) ballot |= 1u << l;
  return ballot;
}

inline int __any_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }

inline void __syncthreads() {
  ++emu::S.threads[emu::S.current].block_arrivals;
  emu::suspend(emu::Wait::kBlock);
}

inline int __syncthreads_or(int predicate) {
  emu::Thread& t = emu::S.threads[emu::S.current];
  const int parity = t.block_arrivals & 1;
  emu::S.flags[parity][emu::S.current] = predicate != 0;
  __syncthreads();
  const std::vector<int>& f = emu::S.flags[parity];
  return std::any_of(f.begin(), f.end(), [](int v) { return v != 0; });
}

inline int __clz(unsigned x) { return x ? __builtin_clz(x) : 32; }
