// Shared-memory wavefronts of a cp.async row gather, by where the rows land in shared memory.
// Rows of 528 bytes (the NoPE cache row) at random entries of a 1M-row cache; each CTA gathers
// blocks of 64 rows, 16 a warp, copying each row's 512 latent bytes in 16-byte cp.async pieces:
//   0 "tiles":   four 128-byte tiles a row, four rows a warp instruction, each tile into a buffer
//                of its own ([tile][row][128]), as the Gluon kernels' ring holds them;
//   1 "dense":   one row a warp instruction, into a dense [row][512] buffer;
//   2 "aligned": one row a warp instruction, into [row][640] at 16 x (entry mod 8) bytes, the
//                row's own offset within a 128-byte line of the cache.
// Usage: gather VARIANT (times it; under ncu, one launch is enough for the counters).
#include <cuda_runtime.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

constexpr int kRow = 528, kRowsPerBlock = 64, kCacheRows = 1 << 20;

__device__ __forceinline__ void cp16(void* dst, const void* src) {
  unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
}

__global__ void gather(const uint8_t* cache, const int* idx, int nblocks, int variant, int* sink) {
  extern __shared__ __align__(128) uint8_t sm[];
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  int acc = 0;
  for (int b = blockIdx.x; b < nblocks; b += gridDim.x) {
    const int* ib = idx + b * kRowsPerBlock;
    if (variant == 0) {
      for (int k = 0; k < 4; ++k) {
        const int r = w * 16 + k * 4 + lane / 8, piece = lane % 8;
        const uint8_t* src = cache + static_cast<long long>(ib[r]) * kRow + piece * 16;
        for (int t = 0; t < 4; ++t) cp16(sm + (t * kRowsPerBlock + r) * 128 + piece * 16, src + t * 128);
      }
    } else {
      for (int k = 0; k < 16; ++k) {
        const int r = w * 16 + k, e = ib[r];
        const int dst = variant == 1 ? r * 512 : r * 640 + 16 * (e & 7);
        cp16(sm + dst + lane * 16, cache + static_cast<long long>(e) * kRow + lane * 16);
      }
    }
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();
    acc += sm[(threadIdx.x * 97 + b) % (kRowsPerBlock * 512)];
    __syncthreads();
  }
  if (acc == 12345) sink[0] = acc;  // keeps the reads
}

int main(int argc, char** argv) {
  const int variant = argc > 1 ? atoi(argv[1]) : 0;
  const int nblocks = 132 * 64, grid = 132 * 2;
  uint8_t* cache;
  int *idx, *sink;
  cudaMalloc(&cache, static_cast<size_t>(kCacheRows) * kRow);
  cudaMalloc(&idx, sizeof(int) * nblocks * kRowsPerBlock);
  cudaMalloc(&sink, sizeof(int));
  cudaMemset(cache, 0x3c, static_cast<size_t>(kCacheRows) * kRow);
  int* h = static_cast<int*>(malloc(sizeof(int) * nblocks * kRowsPerBlock));
  srand(1);
  for (int i = 0; i < nblocks * kRowsPerBlock; ++i) h[i] = rand() % kCacheRows;
  cudaMemcpy(idx, h, sizeof(int) * nblocks * kRowsPerBlock, cudaMemcpyHostToDevice);
  const int smem = variant == 2 ? kRowsPerBlock * 640 : kRowsPerBlock * 512;
  cudaFuncSetAttribute(gather, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaEvent_t a, z;
  cudaEventCreate(&a);
  cudaEventCreate(&z);
  gather<<<grid, 128, smem>>>(cache, idx, nblocks, variant, sink);
  cudaEventRecord(a);
  for (int i = 0; i < 20; ++i) gather<<<grid, 128, smem>>>(cache, idx, nblocks, variant, sink);
  cudaEventRecord(z);
  cudaEventSynchronize(z);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, z);
  const cudaError_t err = cudaGetLastError();
  printf("variant %d rows %d us_per_launch %.2f %s\n", variant, nblocks * kRowsPerBlock,
         1000.f * ms / 20, cudaGetErrorString(err));
  return err == cudaSuccess ? 0 : 1;
}
