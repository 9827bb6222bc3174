// The register decode kernel of register_decode.cuh run on the CPU, for tests on machines without
// a GPU.
//
// Compiled as plain C++ (g++, the CUDA headers only for their types) with nopebench/cuda/
// emulator.h, which runs a CTA's threads as cooperative coroutines switched at every warp
// intrinsic and barrier. The kernel's own algorithm runs unchanged; what is emulated here are
// its device primitives, each as the PTX ISA defines it:
//   - cp.async: a thread's copies land when it waits for their group (wait_group), not before,
//     and the CTA's shared memory starts NaN-poisoned, so a read of a slot that has not landed
//     shows up in the output;
//   - mma.sync m16n8k16 and movmatrix: the warp's fragments exchanged, each lane computing its
//     own outputs from the documented fragment layouts (fp32 sums in k order);
//   - the e4m3 conversion and the bf16 rounding: exact decoding, round-to-nearest-even.
// The hardware's own arithmetic (its sum order, ex2.approx) is left to the GPU tests. Exports
// the library's C ABI, so nopebench's ctypes binding runs unchanged on CPU tensors
// (tests/test_register_decode_emulated.py).

#include "emulator.h"

#include <math.h>

#include <deque>

namespace nopedecode {

namespace host {

struct Copy {
  void* dst;
  const void* src;
  bool valid;
};

// Each thread's cp.async groups: the open one, and those committed but not yet waited for.
struct Pending {
  std::vector<Copy> open;
  std::deque<std::vector<Copy>> committed;
};
inline std::vector<Pending> pending;

inline float bf16_to_float(uint32_t bits) {
  const uint32_t w = bits << 16;
  float f;
  memcpy(&f, &w, 4);
  return f;
}

inline uint32_t float_to_bf16(float f) {  // round to nearest even, NaN kept quiet
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

inline float e4m3_to_float(uint32_t b) {  // float8_e4m3fn: no infinities, S.1111.111 is NaN
  const int sign = (b >> 7) & 1, exp = (b >> 3) & 0xf, man = b & 7;
  float v;
  if (exp == 0xf && man == 7)
    v = NAN;
  else if (exp == 0)
    v = ldexpf(static_cast<float>(man), -9);  // subnormal: man / 8 * 2^-6
  else
    v = ldexpf(1.f + man / 8.f, exp - 7);
  return sign ? -v : v;
}

// An element of a bf16 pair: `hi` picks the upper half (the higher index).
inline float half_of(uint32_t pair, int hi) { return bf16_to_float((pair >> (16 * hi)) & 0xffffu); }

}  // namespace host

inline void cp16(void* dst, const void* src, bool valid) {
  host::pending[emu::S.current].open.push_back({dst, src, valid});
}

inline void commit() {
  host::Pending& p = host::pending[emu::S.current];
  p.committed.push_back(std::move(p.open));
  p.open.clear();
}

template <int N>
void wait_group() {
  host::Pending& p = host::pending[emu::S.current];
  while (static_cast<int>(p.committed.size()) > N) {
    for (const host::Copy& c : p.committed.front()) {
      if (c.valid)
        memcpy(c.dst, c.src, 16);
      else
        memset(c.dst, 0, 16);
    }
    p.committed.pop_front();
  }
}

// Four e4m3 bytes (byte 0 lowest) -> bf16(f32(e) * s) pairs: bytes 0, 1 into lo, 2, 3 into hi.
inline void dequant4(uint32_t w, float s, uint32_t& lo, uint32_t& hi) {
  uint32_t v[4];
  for (int i = 0; i < 4; ++i) v[i] = host::float_to_bf16(host::e4m3_to_float((w >> (8 * i)) & 0xff) * s);
  lo = v[0] | (v[1] << 16);
  hi = v[2] | (v[3] << 16);
}

inline uint32_t pack(float a, float b) {
  return host::float_to_bf16(a) | (host::float_to_bf16(b) << 16);
}

// movmatrix.m8n8.trans.b16: lane l holds row l / 4, columns 2(l % 4) and 2(l % 4) + 1 (the lower
// column in the lower half), before and after; the matrix is transposed.
inline uint32_t transpose(uint32_t x) {
  const uint32_t* all = emu::exchange(&x, 1);
  const int l = emu::lane(), row = l / 4, col = 2 * (l % 4);
  uint32_t out = 0;
  for (int h = 0; h < 2; ++h) {  // element (row, col + h) of the transpose = (col + h, row)
    const int src_row = col + h, src_col = row;
    const uint32_t word = all[(4 * src_row + src_col / 2) * emu::kWords];
    out |= ((word >> (16 * (src_col % 2))) & 0xffffu) << (16 * h);
  }
  return out;
}

// mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32, d += a b, lane l = 4g + c:
//   a[0] = A[g][2c, 2c+1], a[1] = A[g+8][2c, 2c+1], a[2] = A[g][2c+8, 2c+9], a[3] = A[g+8][2c+8, 2c+9]
//   b0 = B[2c, 2c+1][g], b1 = B[2c+8, 2c+9][g]
//   d[0], d[1] = D[g][2c, 2c+1], d[2], d[3] = D[g+8][2c, 2c+1]
inline void mma(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
  const uint32_t mine[6] = {a[0], a[1], a[2], a[3], b0, b1};
  const uint32_t* all = emu::exchange(mine, 6);
  auto A = [&](int row, int k) {  // the lane holding it: g = row % 8, c = (k % 8) / 2
    const int lane = 4 * (row % 8) + (k % 8) / 2, reg = (row >= 8) + 2 * (k >= 8);
    return host::half_of(all[lane * emu::kWords + reg], k % 2);
  };
  auto B = [&](int k, int n) {
    const int lane = 4 * n + (k % 8) / 2, reg = 4 + (k >= 8);
    return host::half_of(all[lane * emu::kWords + reg], k % 2);
  };
  const int l = emu::lane(), g = l / 4, c = l % 4;
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i / 2), col = 2 * c + i % 2;
    float sum = d[i];
    for (int k = 0; k < 16; ++k) sum += A(row, k) * B(k, col);
    d[i] = sum;
  }
}

}  // namespace nopedecode

template <typename T>
T __ldg(const T* p) {
  return *p;
}

inline float __log2f(float x) { return log2f(x); }

#include "register_decode.cuh"

namespace {

template <bool kRope>
int launch(const nopedecode::Params& a) {
  const size_t bytes = sizeof(nopedecode::Smem<kRope>);
  std::vector<uint8_t> smem(bytes + 128);
  uint8_t* base = smem.data() + (128 - reinterpret_cast<uintptr_t>(smem.data()) % 128) % 128;
  auto before_cta = [&] {
    memset(base, 0xff, bytes);  // NaN e4m3 rows and scales, NaN partials
    nopedecode::host::pending.assign(nopedecode::kThreads, {});
  };
  const emu::Grid grid{a.tokens, a.splits, a.heads / nopedecode::kHeads};  // as the GPU launch
  const bool ok = emu::launch(
      grid, nopedecode::kThreads, [&] { nopedecode::decode<kRope>(a, base); }, before_cta);
  return ok ? cudaSuccess : cudaErrorLaunchFailure;
}

}  // namespace

extern "C" {

const char* nopedecode_error_string(int code) {
  if (code == cudaErrorInvalidValue) return "invalid argument";
  return emu::S.error.empty() ? "emulated launch failed" : emu::S.error.c_str();
}

int nopedecode_register_decode(const nopedecode::Params* a, int rope, void* stream) {
  (void)stream;
  if (a == nullptr) return cudaErrorInvalidValue;
  if (int e = nopedecode::check(*a, rope)) return e;
  if (a->tokens == 0) return 0;
  return rope ? launch<true>(*a) : launch<false>(*a);
}

}  // extern "C"
