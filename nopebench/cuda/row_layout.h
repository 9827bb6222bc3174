// The fp8_ds_mla cache row as every CUDA source of the package addresses it (one token, one KV
// head):
//   [0, kLatent)                 float8_e4m3fn latent values, kTiles tiles of kTile
//   [kScaleOffset, kRopeOffset)  one float32 scale a tile
//   [kRopeOffset, kFullRow)      kRopeDim bf16 RoPE values, zero for NoPE (absent in compact
//                                kNopeRow-byte rows)
// The numbers are nopebench/geometry.py's: the package's build (nopebench/cuda_build.py) passes
// them as -D flags, so the kernels, their emulators and the Python side read one description.
// This header names them, refuses a build that lacks them, and checks what the kernels' lane
// maps assume of them.
#pragma once

#if !defined(NOPE_ROW_LATENT) || !defined(NOPE_ROW_TILE) || !defined(NOPE_ROW_SCALE_OFFSET) || \
    !defined(NOPE_ROW_ROPE_OFFSET) || !defined(NOPE_ROW_ROPE_DIM) || !defined(NOPE_ROW_FULL_BYTES)
#error "the row layout comes from nopebench/geometry.py as -DNOPE_ROW_* flags: build through nopebench.cuda_build"
#endif

namespace nope_row {

constexpr int kLatent = NOPE_ROW_LATENT;
constexpr int kTile = NOPE_ROW_TILE;
constexpr int kTiles = kLatent / kTile;
constexpr int kScaleOffset = NOPE_ROW_SCALE_OFFSET;
constexpr int kRopeOffset = NOPE_ROW_ROPE_OFFSET;
constexpr int kRopeDim = NOPE_ROW_ROPE_DIM;
constexpr int kFullRow = NOPE_ROW_FULL_BYTES;
constexpr int kNopeRow = kRopeOffset;         // a compact NoPE row ends before the RoPE lanes
constexpr int kUpconvert = kLatent + kRopeDim;  // bf16 values of a gathered (upconverted) row

static_assert(kScaleOffset == kLatent && kRopeOffset == kScaleOffset + 4 * kTiles &&
                  kFullRow == kRopeOffset + 2 * kRopeDim,
              "the row is latent bytes, then one fp32 scale a tile, then bf16 RoPE lanes");
static_assert(kLatent == 512 && kTile == 128 && kRopeDim == 64,
              "the kernels' lane maps are written for 512 latent values in tiles of 128 and 64 "
              "RoPE lanes");

}  // namespace nope_row
