"""Every constant the native decode kernels, their planners and their build share.

Row offsets come from `geometry` (the one description of the fp8_ds_mla row); the kernels take
them as compile-time constants from here, never as literals of their own.
"""

from __future__ import annotations

from nopebench import geometry as g

# The row, as the kernels address it.
SCALE_OFFSET = g.SCALE_OFFSET  # bytes 512:528: four fp32 tile scales
ROPE_OFFSET = g.ROPE_OFFSET  # bytes 528:656: 64 bf16 RoPE lanes (zero for NoPE)
TILE = g.TILE  # fp8 latent values per scale (the kernels unroll the row's four tiles)
LATENT_DIM = g.LATENT_DIM  # q's RoPE lanes, when present, start here
INDEX_BYTES = 4  # the int32 top-k entry a gather ring stages beside its row
# Shared-memory bytes one gathered NoPE row takes in a ring slot: latent, scales, index entry.
RING_ROW_BYTES = g.LATENT_DIM + 4 * g.N_TILES + INDEX_BYTES
RING_ROPE_BYTES = 2 * g.ROPE_DIM  # and the RoPE lanes, when the kernel reads them

# The machine the SM90 planners plan for.
DEFAULT_SMS = 132  # H200/H100 SXM; the real count is read from the device when there is one
HOPPER_SMEM = 232448  # opt-in shared memory per block on H100/H200 (227 KB)

# The warp-specialised kernel (hopper_ws_decode).
WS_RING_ROWS = 32  # rows per gather-ring slot (4 per producer warp)
WS_MAX_BLOCK_H = 32  # one consumer warpgroup holds O^T (512 x heads, fp32) in registers
# Ring slots with separate scorer and accumulator: two were fastest on the H200 at 16 heads
# (results/reference/decode-tuning/hopper-ws/); one consumer takes all that fit.
WS_SPLIT_SLOTS = 2
# At 32 heads per program the role split too, from this many query tokens (its persistent grid
# then holds two items a program or more): on the H200 1-5% faster than one consumer at 256
# and 512 tokens (the shim 0-2% slower), mixed at 128 (2% faster at width 2176, 2% slower at
# 2048), slower at 8-64.
WS_SPLIT_32_MIN_TOKENS = 256
# Its register budgets (producer, scorer; the accumulator gets the rest), by Triton (major,
# minor): (NoPE rows, RoPE rows). Under Triton 3.6 both compile spill-free. Under 3.9 the NoPE
# form does at (96, 120) but the RoPE form spills at every budget, so there, and under
# unmeasured versions, 32 heads keep one consumer (NoPE and the shim run the same form).
WS_SPLIT_32_REGS = {(3, 6): ((96, 120), (88, 120))}
# At this many heads per program (both forms) each thread keeps its own share of the softmax
# sums and they are summed once, after the item's last block, instead of in every block (a sum
# across the four warps, through shared memory): on the H200 4-8% faster for NoPE rows at 64-512
# tokens and 5-6% for the shim at 256-512 (within 2% below that); at 16 heads 1-4% slower.
WS_PARTIAL_SUM_BLOCK_H = 32
# The role split's producer at this many heads per program, NoPE rows, one split: the split count
# the constexpr 1, so its per-sub-block item arithmetic folds away. On the H200 3-6% faster at
# 256-512 tokens; at 16 heads 1-6% slower (and Triton 3.9 spills 8 bytes there), with RoPE lanes
# Triton 3.6 spills 8 bytes.
WS_CONST_SPLIT_BLOCK_H = 32
# Where the role split is asked for under another Triton: the NoPE budgets (3.9 compiles them
# spill-free too).
WS_SPLIT_32_DEFAULT_REGS = WS_SPLIT_32_REGS[(3, 6)][0]

# The 64-head kernel (hopper_wide_decode).
WIDE_BLOCK_H = 64  # one wgmma M of heads, the output split across two warpgroups
WIDE_BLOCK_N = 64  # rows per block (32-row blocks with three tiles measured slower)
# Rows per block with RoPE lanes: two 64-row tiles and their RoPE tiles beside q and q's RoPE
# lanes leave no shared memory for even one ring slot, two 32-row tiles leave room for several.
WIDE_ROPE_BLOCK_N = 32
# Ring slots with RoPE lanes: seven fit, but two were 2-3% faster on the H200 at 64 and 128 heads
# (results/reference/decode-tuning/hopper-wide/); NoPE rows take all that fit (three).
WIDE_ROPE_SLOTS = 2
WIDE_KV_BUFS = 2  # dequantized tiles: the producer fills one while the consumers read the other
WIDE_P_BUFS = 1  # P tiles handed from the scorer to the right warpgroup
WIDE_RING_ROWS = 16  # its producer's ring slot: 4 rows per warp, one warpgroup
# q's 128-lane latent tiles the scorer holds in registers as the score product's A operand (the
# rest stays in shared memory), by Triton (major, minor): (NoPE rows, RoPE rows). Under Triton
# 3.6 on the H200 one tile made NoPE rows up to 3% faster, two made RoPE rows 2-5% faster; one
# more spills. Triton 3.9's scorer spills with even one; it and unmeasured versions take none.
WIDE_Q_REG_TILES = {(3, 6): (1, 2)}
# NoPE rows: both output halves can run in warpgroups of their own, each dequantizing
# WIDE_HELP_ROWS rows of every 64-row block beside the producer (which fills the rest), loaded
# into registers two blocks ahead while they wait for P; 16 rows each spills. On the H200,
# unpaired programs are 1-3% faster with the scorer running the left half instead (64 heads,
# 64-512 tokens, both widths; 128 heads unpaired no slower), so
# the plan splits the output off only for the 2-CTA pair, which needs it, and only from
# WIDE_PV_SPLIT_MIN_BLOCKS blocks a program (programs of 3-5 blocks were 1-4% slower split).
# RoPE rows (32-row blocks) were slower split and never take it.
WIDE_HELP_ROWS = 8
WIDE_PV_SPLIT_MIN_BLOCKS = 8
# At 128 heads (two head blocks, NoPE rows, one split, the output split off) the head blocks run
# as 2-CTA clusters, each CTA dequantizing half of every block into both CTAs' tiles
# (`cluster`), in WIDE_PAIR_SLOTS ring slots: on the H200 2-4% faster than unpaired programs
# with helpers at 64-512 tokens, three slots 2-5% slower than two.
WIDE_PAIR_SLOTS = 2

# The register kernel (cuda/register_decode.cu, CUDA C++): 16 heads a CTA, 4 warps, one a scale
# tile, the dequantized rows kept in registers as mma.sync fragments. Its other forms (32 heads
# a CTA, 8 warps, other loaders) measured slower: results/reference/decode-tuning/README.md.
# The build passes these five to the source as -DNOPEDECODE_* flags (register_library).
REG_BLOCK_H = 16  # the mma's M
REG_BLOCK_N = 32  # keys a block
REG_INDEX_CAP = 2208  # index entries a split stages in shared memory
REG_CTAS_PER_SM = 2  # 255 registers a thread, spill-free
REG_STAGES = 4  # cp.async ring slots (3 and 5 were slower on the H200)
# Where it is planned: 16 heads, one split, and at least this share of the CTA slots of its last
# wave filled (REG_CTAS_PER_SM an SM): a partly filled wave costs a whole one, and below this
# fill NoPE rows ran faster in the warp-specialised kernel on the H200
# (results/reference/decode-tuning/register/).
REG_MIN_FILL = 0.75
