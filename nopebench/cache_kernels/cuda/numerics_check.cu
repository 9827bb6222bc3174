// Host-only driver for ds_mla_numerics.cuh: runs the kernels' per-value functions on the CPU
// so tests/test_cache_kernels.py can compare them with nopebench/rowformat.py on a machine
// without a GPU. It mirrors the kernels' grouping (amax over groups of 8 values, values in
// pairs) but not their lane layout; the GPU tests cover that.
//
//   numerics_check quantize <fmt 0|1> <in: T x 512 bf16> <out: T x 528 bytes>
//   numerics_check dequantize <in: N x 528 bytes> <out: N x 512 bf16>
//   numerics_check scale <fmt 0|1> <in: uint16 bf16 magnitudes> <out: fp32 scales>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "ds_mla_numerics.cuh"

using namespace nopecache;

static std::vector<unsigned char> read_file(const char* path) {
  std::vector<unsigned char> data;
  FILE* f = fopen(path, "rb");
  if (!f) return data;
  unsigned char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) data.insert(data.end(), buf, buf + n);
  fclose(f);
  return data;
}

static int write_file(const char* path, const std::vector<unsigned char>& data) {
  FILE* f = fopen(path, "wb");
  if (!f) return 1;
  const size_t n = fwrite(data.data(), 1, data.size(), f);
  fclose(f);
  return n == data.size() ? 0 : 1;
}

static uint32_t word_at(const unsigned char* p) {
  uint32_t w;
  memcpy(&w, p, 4);
  return w;
}

static void quantize_row(const unsigned char* in, unsigned char* out, int fmt) {
  for (int t = 0; t < 4; ++t) {
    const unsigned char* tile = in + t * 256;  // 128 bf16
    uint32_t amax = 0;
    for (int g = 0; g < 16; ++g) {
      const uint4 w = make_uint4(word_at(tile + g * 16), word_at(tile + g * 16 + 4),
                                 word_at(tile + g * 16 + 8), word_at(tile + g * 16 + 12));
      const uint32_t m = abs_max8(w);
      amax = m > amax ? m : amax;
    }
    const float scale = tile_scale(amax, fmt);
    for (int p = 0; p < 64; ++p) {
      const uint32_t bytes = quantize_pair(word_at(tile + p * 4), scale);
      out[t * 128 + 2 * p] = static_cast<unsigned char>(bytes & 0xffu);
      out[t * 128 + 2 * p + 1] = static_cast<unsigned char>(bytes >> 8);
    }
    memcpy(out + 512 + 4 * t, &scale, 4);
  }
}

static void dequantize_row(const unsigned char* in, unsigned char* out) {
  for (int t = 0; t < 4; ++t) {
    float scale;
    memcpy(&scale, in + 512 + 4 * t, 4);
    for (int p = 0; p < 64; ++p) {
      const uint32_t bytes = in[t * 128 + 2 * p] | (static_cast<uint32_t>(in[t * 128 + 2 * p + 1]) << 8);
      const uint32_t w = dequantize_pair(bytes, scale);
      memcpy(out + (t * 128 + 2 * p) * 2, &w, 4);
    }
  }
}

int main(int argc, char** argv) {
  if (argc >= 5 && strcmp(argv[1], "quantize") == 0) {
    const int fmt = atoi(argv[2]);
    const std::vector<unsigned char> in = read_file(argv[3]);
    if (in.size() % 1024) return 2;
    const size_t rows = in.size() / 1024;
    std::vector<unsigned char> out(rows * 528);
    for (size_t r = 0; r < rows; ++r) quantize_row(in.data() + r * 1024, out.data() + r * 528, fmt);
    return write_file(argv[4], out);
  }
  if (argc >= 4 && strcmp(argv[1], "dequantize") == 0) {
    const std::vector<unsigned char> in = read_file(argv[2]);
    if (in.size() % 528) return 2;
    const size_t rows = in.size() / 528;
    std::vector<unsigned char> out(rows * 1024);
    for (size_t r = 0; r < rows; ++r) dequantize_row(in.data() + r * 528, out.data() + r * 1024);
    return write_file(argv[3], out);
  }
  if (argc >= 5 && strcmp(argv[1], "scale") == 0) {
    const int fmt = atoi(argv[2]);
    const std::vector<unsigned char> in = read_file(argv[3]);
    if (in.size() % 2) return 2;
    std::vector<unsigned char> out(in.size() * 2);
    for (size_t i = 0; i < in.size() / 2; ++i) {
      const uint32_t bits = in[2 * i] | (static_cast<uint32_t>(in[2 * i + 1]) << 8);
      const float s = tile_scale(bits, fmt);
      memcpy(out.data() + 4 * i, &s, 4);
    }
    return write_file(argv[4], out);
  }
  fprintf(stderr, "usage: numerics_check quantize|dequantize|scale ...\n");
  return 2;
}
