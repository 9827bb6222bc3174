// fp8_ds_mla KV-cache kernels: the NoPE-aware cache write and the gather/upconvert.
//
// Row layout (nopebench/cuda/row_layout.h), row_bytes = 656 or 528 (compact NoPE rows):
//   0:512    512 float8_e4m3fn latent values, 4 tiles of 128
//   512:528  4 float32 scales, one per tile
//   528:656  64 bf16 RoPE values; all zero for NoPE (absent in 528-byte rows)
//
// Both kernels must be bit-exact with nopebench/rowformat.py; the per-value numerics that
// decide it live in ds_mla_numerics.cuh. This header is the memory side: which lane moves
// which bytes, with 16-byte accesses contiguous across each warp. It also holds the launch
// plans (argument checks, grid sizes, load paths) as plain host functions, so that
// cache_kernels.cu (the CUDA launchers) and emulator.cpp (the same kernels run on the CPU
// for tests, one warp at a time) cannot disagree about them.

#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "ds_mla_numerics.cuh"
#include "row_layout.h"

namespace nopecache {

constexpr int kAbiVersion = 2;
constexpr int kLatent = nope_row::kLatent;
constexpr int kScaleOffset = nope_row::kScaleOffset;
constexpr int kRopeOffset = nope_row::kRopeOffset;
constexpr int kFullRow = nope_row::kFullRow;
constexpr int kNopeRow = nope_row::kNopeRow;
constexpr int kRopeDim = nope_row::kRopeDim;
constexpr int kOutDim = nope_row::kUpconvert;
constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = 32 * kWarpsPerBlock;
// Blocks per SM asked of the compiler: full occupancy (2048 or 1536 threads per SM) for the
// write kernel, which caps it at 32 registers; the gather holds two rows and gets 40.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 800 || __CUDA_ARCH__ == 900 || \
                               __CUDA_ARCH__ == 1000 || __CUDA_ARCH__ == 1030)
constexpr int kWriteMinBlocks = 8;
#else
constexpr int kWriteMinBlocks = 6;
#endif
constexpr int kGatherMinBlocks = 6;
constexpr int kGatherRowsPerWarp = 2;  // two rows' loads in flight per warp
constexpr int64_t kMaxGrid = 0x7fffffff;  // gridDim.x limit
constexpr unsigned kFull = 0xffffffffu;
constexpr uint32_t kBf16NanPair = 0x7fc07fc0u;

// ------------------------------------------------------------------ launch parameters

struct WriteParams {
  uint8_t* cache;            // num_slots rows of row_bytes, 16-byte aligned
  int64_t num_slots;
  int row_bytes;             // 528 or 656
  const uint16_t* kv_c;      // [tokens, 512] bf16, rows kv_stride elements apart
  int64_t kv_stride;
  const uint16_t* k_pe;      // [tokens, 64] bf16, rows pe_stride apart; null for NoPE
  int64_t pe_stride;
  int rope_dim;              // 0 or 64
  const void* slot_mapping;  // [tokens] int32 or int64
  int slot_is_int64;
  int64_t tokens;
  int scale_format;          // ScaleFormat
  bool kv_vec;               // set by plan_write: 16-byte loads are aligned
  bool pe_vec;
};

struct GatherParams {
  const uint8_t* cache;        // [num_blocks, block_size] rows of row_bytes, 16-byte aligned
  int64_t num_blocks;
  int block_size;
  int block_shift;             // set by plan_gather: log2(block_size), or -1
  int row_bytes;
  const int32_t* block_table;  // [num_req, max_blocks], rows bt_stride apart
  int64_t bt_stride;
  int max_blocks;
  const int32_t* starts;       // workspace_starts [num_req]
  const int32_t* seq_starts;   // [num_req] or null (all zero)
  int num_req;
  int64_t total_rows;
  int rope_dim;
  uint16_t* out;               // [total_rows, 576] bf16, contiguous, 16-byte aligned
};

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0u; }

// Checks the arguments (enough for memory safety; the messages live on the Python side),
// chooses the load paths and returns the grid size: > 0 launch, 0 nothing to do, -1 invalid.
inline int64_t plan_write(WriteParams& p) {
  if (p.tokens < 0 || p.num_slots < 0 || (p.row_bytes != kFullRow && p.row_bytes != kNopeRow) ||
      (p.rope_dim != 0 && p.rope_dim != kRopeDim) || (p.rope_dim && p.row_bytes != kFullRow) ||
      (p.scale_format != kArbitraryFp32 && p.scale_format != kPow2Fp32) || !aligned16(p.cache) ||
      (reinterpret_cast<uintptr_t>(p.kv_c) & 1u) || (reinterpret_cast<uintptr_t>(p.k_pe) & 1u))
    return -1;
  if (p.tokens == 0) return 0;
  if (p.kv_c == nullptr || p.slot_mapping == nullptr || (p.rope_dim && p.k_pe == nullptr)) return -1;
  if (!p.rope_dim) p.k_pe = nullptr;
  p.kv_vec = aligned16(p.kv_c) && (p.kv_stride % 8) == 0;
  p.pe_vec = p.k_pe != nullptr && aligned16(p.k_pe) && (p.pe_stride % 8) == 0;
  const int64_t blocks = (p.tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return blocks > kMaxGrid ? -1 : blocks;
}

inline int64_t plan_gather(GatherParams& p) {
  if (p.total_rows < 0 || p.num_blocks < 0 || p.block_size <= 0 || p.max_blocks < 0 ||
      (p.row_bytes != kFullRow && p.row_bytes != kNopeRow) ||
      (p.rope_dim != 0 && p.rope_dim != kRopeDim) || (p.rope_dim && p.row_bytes != kFullRow) ||
      !aligned16(p.cache) || !aligned16(p.out))
    return -1;
  if (p.total_rows == 0) return 0;
  if (p.num_req <= 0 || p.starts == nullptr || p.block_table == nullptr) return -1;
  p.block_shift = -1;
  for (int b = 0; b < 31; ++b)
    if (p.block_size == (1 << b)) p.block_shift = b;
  constexpr int64_t rows_per_block = static_cast<int64_t>(kWarpsPerBlock) * kGatherRowsPerWarp;
  const int64_t blocks = (p.total_rows + rows_per_block - 1) / rows_per_block;
  return blocks > kMaxGrid ? -1 : blocks;
}

// ------------------------------------------------------------------ cache write

// 8 consecutive bf16 as 4 words: one 16-byte load when aligned, else 8 two-byte loads.
__device__ __forceinline__ uint4 load8_bf16(const uint16_t* p, bool vec) {
  if (vec) return *reinterpret_cast<const uint4*>(p);
  uint4 w;
  w.x = p[0] | (static_cast<uint32_t>(p[1]) << 16);
  w.y = p[2] | (static_cast<uint32_t>(p[3]) << 16);
  w.z = p[4] | (static_cast<uint32_t>(p[5]) << 16);
  w.w = p[6] | (static_cast<uint32_t>(p[7]) << 16);
  return w;
}

// One warp per token. Lane l holds latent elements [i*256 + 8l, +8) for i = 0, 1, so each
// load instruction reads 512 contiguous bytes and lanes 0-15 / 16-31 hold tiles 2i / 2i+1.
// All loads (slot, latent, RoPE) are issued before the slot is tested, so the slot's latency
// overlaps the data's; tokens with a negative or out-of-range slot write nothing.
template <typename SlotT>
__global__ void __launch_bounds__(kThreads, kWriteMinBlocks) concat_and_cache_ds_mla_kernel(const WriteParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t token = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (token >= p.tokens) return;

  const int64_t slot = static_cast<int64_t>(static_cast<const SlotT*>(p.slot_mapping)[token]);
  const uint16_t* src = p.kv_c + token * p.kv_stride;
  uint4 v[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) v[i] = load8_bf16(src + i * 256 + lane * 8, p.kv_vec);
  const bool write_tail = p.row_bytes == kFullRow;
  uint4 pe = make_uint4(0u, 0u, 0u, 0u);  // 16 RoPE bytes (lanes 0-7), or 4 in .x (all lanes)
  if (write_tail && p.rope_dim) {
    const uint16_t* pe_src = p.k_pe + token * p.pe_stride;
    if (p.pe_vec) {
      if (lane < 8) pe = *reinterpret_cast<const uint4*>(pe_src + lane * 8);
    } else {
      pe.x = pe_src[2 * lane] | (static_cast<uint32_t>(pe_src[2 * lane + 1]) << 16);
    }
  }
  if (slot < 0 || slot >= p.num_slots) return;  // warp-uniform: skipped token
  uint8_t* row = p.cache + slot * p.row_bytes;

  float scale[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    uint32_t amax = abs_max8(v[i]);
#pragma unroll
    for (int offset = 8; offset > 0; offset >>= 1)  // stays within each 16-lane half
      amax = max(amax, __shfl_xor_sync(kFull, amax, offset));
    scale[i] = tile_scale(amax, p.scale_format);
    uint2 q;
    q.x = quantize_pair(v[i].x, scale[i]) | (quantize_pair(v[i].y, scale[i]) << 16);
    q.y = quantize_pair(v[i].z, scale[i]) | (quantize_pair(v[i].w, scale[i]) << 16);
    *reinterpret_cast<uint2*>(row + i * 256 + lane * 8) = q;
  }
  // Lane 0 holds tiles 0 and 2, lane 16 tiles 1 and 3.
  const float s1 = __shfl_sync(kFull, scale[0], 16);
  const float s3 = __shfl_sync(kFull, scale[1], 16);
  if (lane == 0)
    *reinterpret_cast<float4*>(row + kScaleOffset) = make_float4(scale[0], s1, scale[1], s3);

  if (!write_tail) return;
  if (p.rope_dim && !p.pe_vec) {
    *reinterpret_cast<uint32_t*>(row + kRopeOffset + lane * 4) = pe.x;
  } else if (lane < 8) {  // RoPE bytes, or 128 zero bytes for NoPE
    *reinterpret_cast<uint4*>(row + kRopeOffset + lane * 16) = pe;
  }
}

// ------------------------------------------------------------------ gather / upconvert

// Request owning output row `row`: the last r with workspace_starts[r] <= row. A 32-way
// search: each round every lane probes one candidate and a ballot keeps the last prefix
// (starts are non-decreasing), so up to 32 requests cost one round, 1024 two.
__device__ __forceinline__ int find_request(const int32_t* __restrict__ starts, int num_req,
                                            int64_t row, int lane) {
  int lo = 0, n = num_req;
  while (n > 1) {
    const int step = (n + 31) / 32;
    const int idx = lo + lane * step;
    const bool le = idx < lo + n && starts[idx] <= row;
    const unsigned ball = __ballot_sync(kFull, le);
    const int k = ball ? 31 - __clz(ball) : 0;
    const int next = lo + k * step;
    n = min(step, lo + n - next);
    lo = next;
  }
  return lo;
}

// Requests of the warp's consecutive rows first, first + 1, ...: with up to 32 requests one
// probe per lane serves every row (one ballot each); with more, the general search finds the
// first row's request and the next rows step forward from it (rarely more than a step).
__device__ __forceinline__ void find_requests(const GatherParams& p, int64_t first, int lane,
                                              int (&req)[kGatherRowsPerWarp]) {
  if (p.num_req > 32) {
    int r = find_request(p.starts, p.num_req, first, lane);
    req[0] = r;
#pragma unroll
    for (int k = 1; k < kGatherRowsPerWarp; ++k) {
      while (r + 1 < p.num_req && p.starts[r + 1] <= first + k) ++r;
      req[k] = r;
    }
    return;
  }
  const bool probe = lane < p.num_req;
  const int64_t start = probe ? p.starts[lane] : 0;
#pragma unroll
  for (int k = 0; k < kGatherRowsPerWarp; ++k) {
    const unsigned ball = __ballot_sync(kFull, probe && start <= first + k);
    req[k] = ball ? 31 - __clz(ball) : 0;
  }
}

// Physical slot of output row `row` of request r, or -1 when the tables point outside the
// cache (the validated Python entry point rejects such calls before launch; this keeps the
// kernel safe). Positions are split into (block column, offset) in 32 bits, with a shift for
// the usual power-of-two block sizes: a 64-bit division would be a slow library call.
__device__ __forceinline__ int64_t slot_of(const GatherParams& p, int r, int64_t row) {
  const int64_t pos = (p.seq_starts ? static_cast<int64_t>(p.seq_starts[r]) : 0) + (row - p.starts[r]);
  if (pos < 0 || pos > 0x7fffffff) return -1;
  const uint32_t u = static_cast<uint32_t>(pos);
  const uint32_t col = p.block_shift >= 0 ? u >> p.block_shift : u / static_cast<uint32_t>(p.block_size);
  if (col >= static_cast<uint32_t>(p.max_blocks)) return -1;
  const int64_t block = p.block_table[r * p.bt_stride + col];
  if (block < 0 || block >= p.num_blocks) return -1;
  return block * p.block_size + (u - col * static_cast<uint32_t>(p.block_size));
}

// One warp per kGatherRowsPerWarp output rows: slots first, then every row's loads, then the
// conversions and stores. Lane l covers latent elements [j*256 + 8l, +8) for j = 0, 1 (tile
// 2j + l/16): 8-byte loads and 16-byte stores, each contiguous across the warp; lanes 0-7
// move the 128 RoPE bytes (or store zeros for NoPE, whatever the row's tail holds).
__global__ void __launch_bounds__(kThreads, kGatherMinBlocks) gather_upconvert_kernel(const GatherParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int64_t first = warp * kGatherRowsPerWarp;
  if (first >= p.total_rows) return;

  int req[kGatherRowsPerWarp];
  find_requests(p, first, lane, req);
  int64_t slot[kGatherRowsPerWarp];
#pragma unroll
  for (int k = 0; k < kGatherRowsPerWarp; ++k)
    slot[k] = first + k < p.total_rows ? slot_of(p, req[k], first + k) : -1;

  uint2 q[kGatherRowsPerWarp][2];
  float scale[kGatherRowsPerWarp][2];  // this lane's tiles: 2j + lane/16
  uint4 tail[kGatherRowsPerWarp];
#pragma unroll
  for (int k = 0; k < kGatherRowsPerWarp; ++k) {
    tail[k] = make_uint4(0u, 0u, 0u, 0u);
    q[k][0] = q[k][1] = make_uint2(0u, 0u);
    scale[k][0] = scale[k][1] = 0.0f;
    if (slot[k] < 0) continue;
    const uint8_t* row = p.cache + slot[k] * p.row_bytes;
    const float* scales = reinterpret_cast<const float*>(row + kScaleOffset) + (lane >> 4);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      q[k][j] = *reinterpret_cast<const uint2*>(row + j * 256 + lane * 8);
      scale[k][j] = scales[2 * j];
    }
    if (p.rope_dim && lane < 8) tail[k] = *reinterpret_cast<const uint4*>(row + kRopeOffset + lane * 16);
  }
#pragma unroll
  for (int k = 0; k < kGatherRowsPerWarp; ++k) {
    if (first + k >= p.total_rows) break;
    uint16_t* dst = p.out + (first + k) * kOutDim;
    if (slot[k] < 0) {  // unvalidated call with a bad table entry: a visibly wrong row
      const uint4 nan4 = make_uint4(kBf16NanPair, kBf16NanPair, kBf16NanPair, kBf16NanPair);
#pragma unroll
      for (int j = 0; j < 2; ++j) *reinterpret_cast<uint4*>(dst + j * 256 + lane * 8) = nan4;
      if (lane < 8) *reinterpret_cast<uint4*>(dst + kLatent + lane * 8) = nan4;
      continue;
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      uint4 o;
      o.x = dequantize_pair(q[k][j].x, scale[k][j]);
      o.y = dequantize_pair(q[k][j].x >> 16, scale[k][j]);
      o.z = dequantize_pair(q[k][j].y, scale[k][j]);
      o.w = dequantize_pair(q[k][j].y >> 16, scale[k][j]);
      *reinterpret_cast<uint4*>(dst + j * 256 + lane * 8) = o;
    }
    if (lane < 8) *reinterpret_cast<uint4*>(dst + kLatent + lane * 8) = tail[k];
  }
}

}  // namespace nopecache
