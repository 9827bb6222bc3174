"""Launch plans of the native decode kernels: pure functions of the shape and the GPU's SM
count (and, for one register choice of the 64-head kernel, the Triton version), tested on CPU.
`plan_launch` (portable Triton), `plan_hopper` (single-role SM90), `plan_hopper_ws`
(warp-specialised), `plan_hopper_wide` (64 heads) and `plan_register` (the CUDA C++ register
kernel); the measurements behind each heuristic are under results/reference/decode-tuning/.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from nopebench import environment
from nopebench.impls.native.constants import (
    DEFAULT_SMS,
    HOPPER_SMEM,
    REG_BLOCK_H,
    REG_BLOCK_N,
    REG_CTAS_PER_SM,
    REG_INDEX_CAP,
    REG_MIN_FILL,
    REG_STAGES,
    RING_ROPE_BYTES,
    RING_ROW_BYTES,
    WIDE_BLOCK_H,
    WIDE_BLOCK_N,
    WIDE_HELP_ROWS,
    WIDE_KV_BUFS,
    WIDE_P_BUFS,
    WIDE_PAIR_SLOTS,
    WIDE_PV_SPLIT_MIN_BLOCKS,
    WIDE_Q_REG_TILES,
    WIDE_RING_ROWS,
    WIDE_ROPE_BLOCK_N,
    WIDE_ROPE_SLOTS,
    WS_MAX_BLOCK_H,
    WS_PARTIAL_SUM_BLOCK_H,
    WS_RING_ROWS,
    WS_SPLIT_32_MIN_TOKENS,
    WS_SPLIT_32_REGS,
    WS_SPLIT_SLOTS,
)


@dataclass(frozen=True)
class LaunchPlan:
    """How one decode call is cut into programs."""

    block_h: int
    head_blocks: int
    block_n: int
    splits: int
    entries_per_split: int
    num_warps: int
    num_stages: int = 1
    prefetch: bool = True
    factored: bool = False
    # "triton": portable SM80+; "hopper", "hopper_ws", "hopper_wide": SM90 Gluon; "register":
    # CUDA C++, 16 heads a CTA
    kernel: str = "triton"
    role_split: bool = (
        False  # hopper_ws: separate scorer and accumulator warpgroups, persistent grid
    )
    max_programs: int = (
        0  # hopper_ws: programs of its persistent grid (one per SM); 0: one per work item
    )
    rope: bool = False  # SM90 plans: shared memory planned for the RoPE lanes (576-wide QK)
    kv_bufs: int = WIDE_KV_BUFS  # hopper_wide: dequantized tiles the producer cycles through
    p_bufs: int = WIDE_P_BUFS  # hopper_wide: P tiles handed from the scorer to the right warpgroup
    q_regs: int = 0  # hopper_wide: q's 128-lane latent tiles the scorer holds in registers
    pv_split: bool = False  # hopper_wide: both output halves in warpgroups of their own
    helpers: int = 0  # hopper_wide with pv_split: rows of every block each output warpgroup fills
    pair: bool = False  # hopper_wide: head blocks in 2-CTA clusters sharing each block's rows
    l_partial: bool = False  # hopper_ws: softmax sums kept per thread, summed after the last block

    @property
    def programs(self) -> int:
        return self.head_blocks * self.splits

    def describe(self) -> str:
        """The kernel and its launch shape in one line, for result rows: e.g. '64-head Gluon
        (wgmma), output halves apart from the scorer, 2-CTA pairs: 64 heads x 64 rows a block,
        2 head blocks'."""
        name = _KERNEL_NAMES.get(self.kernel, self.kernel)
        form = []
        if self.kernel == "hopper_ws" and self.role_split:
            form.append("scorer and accumulator apart")
        if self.kernel == "hopper_wide" and self.pv_split:
            form.append("output halves apart from the scorer")
        if self.pair:
            form.append("2-CTA pairs")
        if self.max_programs:
            form.append(f"persistent, at most {self.max_programs} programs")
        shape = [f"{self.block_h} heads x {self.block_n} rows a block"]
        if self.head_blocks > 1:
            shape.append(f"{self.head_blocks} head blocks")
        if self.splits > 1:
            shape.append(f"{self.splits} splits")
        return ", ".join([name, *form]) + ": " + ", ".join(shape)

    def grid(self, tokens: int) -> tuple[int, ...]:
        if self.kernel not in ("hopper_ws", "hopper_wide"):
            return (tokens * self.head_blocks, self.splits)
        items = tokens * self.programs  # these walk (token, head block, split) items on one axis
        return (min(items, self.max_programs) if self.max_programs else items,)


_KERNEL_NAMES = {
    "triton": "portable Triton",
    "hopper": "single-role Gluon (wgmma)",
    "hopper_ws": "warp-specialised Gluon (wgmma)",
    "hopper_wide": "64-head Gluon (wgmma)",
    "register": "register kernel (CUDA C++, mma.sync)",
}


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def plan_launch(
    tokens: int,
    heads: int,
    width: int,
    sms: int = DEFAULT_SMS,
    block_n: int | None = None,
    num_warps: int | None = None,
    splits: int | None = None,
    max_block_h: int = 64,
) -> LaunchPlan:
    """The launch shape, from the H200 sweep in results/reference/decode-tuning/.

    Heads per program go up to 64 (the fp32 accumulator must fit in registers); more heads
    take more head blocks. With 16-32 heads the kernel is bound by how many row gathers are in
    flight, so the top-k range is split until there are ~6 programs per SM; with 64 heads it
    is bound by registers, and splitting pays only when tokens alone cannot fill the SMs.
    """
    block_h = min(max_block_h, max(16, next_pow2(heads)))
    head_blocks = -(-heads // block_h)
    rows = tokens * head_blocks
    few = rows < sms
    prefetch, stages = True, 1
    if block_h >= 64:
        block_n = block_n or 32
        warps = num_warps or (8 if few or head_blocks > 1 else 4)
        if not few and head_blocks == 1 and num_warps is None:
            prefetch, stages = False, 2  # 4 warps, Triton's cp.async pipeline: best at T >= 128
        target = 2 * sms if few else rows
    else:
        block_n = block_n or (64 if few else 32)
        warps = num_warps or (8 if few else 4)
        target = 6 * sms
    blocks = -(-width // block_n)
    if splits is None:
        splits = max(1, min(blocks, -(-target // max(1, rows))))
    per_split = -(-blocks // splits) * block_n
    splits = -(-width // per_split)  # no empty splits
    return LaunchPlan(block_h, head_blocks, block_n, splits, per_split, warps, stages, prefetch)


def hopper_smem_bytes(block_h: int, stages: int, rope: bool, block_n: int = 64) -> int:
    """Shared memory of the Hopper kernel: the gather ring (fp8 tiles, scales, index, RoPE lanes),
    the dequantized tile, q, P, and compiler scratch (Triton 3.6 takes 512 bytes more than 3.9)."""
    ring = stages * block_n * (RING_ROW_BYTES + (RING_ROPE_BYTES if rope else 0))
    fixed = (
        block_n * 512 * 2
        + 4 * block_h * 128 * 2
        + block_n * block_h * 2
        + (block_h * 128 if rope else 0)
    )
    return ring + fixed + 1024


def ws_smem_bytes(
    block_h: int, slots: int, block_n: int = 64, role_split: bool = False, rope: bool = False
) -> int:
    """Shared memory of the warp-specialised kernel: the gather ring (fp8 tiles, scales, index
    entries), two dequantized tiles, q, two P tiles, with the role split the rescale factors and
    final softmax state handed over, and mbarriers and compiler scratch. With `rope` every row of
    the ring, of the two tiles and of q also holds 64 bf16 RoPE lanes."""
    rope_row = RING_ROPE_BYTES if rope else 0
    ring = slots * WS_RING_ROWS * (RING_ROW_BYTES + rope_row)
    handover = 6 * block_h * 4 if role_split else 0
    return (
        ring
        + 2 * block_n * (512 * 2 + rope_row)
        + block_h * (4 * 128 * 2 + rope_row)
        + 2 * block_n * block_h * 2
        + handover
        + 1536
    )


def score_warps_m(block_n: int) -> int:
    """Warps along the keys in the Hopper kernel's score product: 8 (the two warpgroups split a
    128-row block by key) or 4 (they split a 64-row block by head)."""
    return 8 if block_n == 128 else 4


def plan_hopper(
    tokens: int,
    heads: int,
    width: int,
    rope: bool,
    sms: int = DEFAULT_SMS,
    stages: int | None = None,
    splits: int | None = None,
    block_n: int | None = None,
    block_h: int | None = None,
) -> LaunchPlan:
    """Launch shape for the SM90 kernel, from the H200 sweeps in
    results/reference/decode-tuning/hopper/.

    One program per SM, so as many heads per program as shared memory allows (every head block
    re-gathers the rows), as long as the (token, head block) programs, cut into splits of one
    block at least, can still fill the SMs (64 heads at 8 tokens; 32 of 128 heads at 1 token).
    The top-k range is split only while
    those programs fill fewer than half the SMs (`_split_one_per_sm`). At 16 heads with many
    programs, 128-row blocks whose scores split by key across the two warpgroups (no operand
    read twice) with a one-slot ring.
    """
    if block_n is None:
        few = tokens * -(-heads // 16) < sms
        wide = (
            heads <= 16
            and not few
            and stages in (None, 1)
            and hopper_smem_bytes(16, 1, rope, 128) <= HOPPER_SMEM
        )
        block_n = 128 if wide else 64
    stages = stages or (1 if block_n == 128 else 2)
    cands = (
        (block_h,)
        if block_h
        else tuple(bh for bh in (64, 32, 16) if bh <= max(16, next_pow2(heads)))
    )
    fits = [bh for bh in cands if hopper_smem_bytes(bh, stages, rope, block_n) <= HOPPER_SMEM]
    if not fits:
        raise ValueError(
            f"{stages} gather stages of {block_n} rows need more shared memory than SM90 has"
        )
    blocks = -(-width // block_n)
    filling = [bh for bh in fits if tokens * -(-heads // bh) * blocks >= sms]
    block_h = (filling or fits[-1:])[0]
    head_blocks, splits, per_split = _split_one_per_sm(
        tokens, heads, width, block_h, block_n, sms, splits, fill=-(-sms // 2)
    )
    return LaunchPlan(
        block_h,
        head_blocks,
        block_n,
        splits,
        per_split,
        num_warps=8,
        num_stages=stages,
        prefetch=False,
        kernel="hopper",
        rope=rope,
    )


def _split_one_per_sm(
    tokens: int,
    heads: int,
    width: int,
    block_h: int,
    block_n: int,
    sms: int,
    splits: int | None,
    fill: int | None = None,
) -> tuple[int, int, int]:
    """Head blocks, splits and entries per split for kernels that run one program per SM: the
    top-k range is split only when there are fewer (token, head block) programs than `fill`
    (default: the SMs), then into as many splits as keep the programs within one wave of the
    SMs: a second wave of a few programs costs as much as the first (the H200 sweep in
    results/reference/decode-tuning/few-tokens/). (The single-role kernel is faster unsplit from
    half the SMs on.)"""
    head_blocks = -(-heads // block_h)
    rows = tokens * head_blocks
    blocks = -(-width // block_n)
    if splits is None:
        splits = 1 if rows >= (fill or sms) else min(blocks, max(1, sms // rows))
    per_split = -(-blocks // splits) * block_n
    return head_blocks, -(-width // per_split), per_split


def _measured_under(table: dict, triton_version: str | None):
    """`table`'s entry for this Triton's (major, minor), None for an unmeasured or unknown one."""
    return table.get(environment.version_numbers(triton_version, 2))


def ws_split_32_regs(rope: bool, triton_version: str | None) -> tuple[int, int] | None:
    """The (producer, scorer) register budgets of the role split at 32 heads per program under
    this Triton, None where the planner does not take it (both row forms must compile
    spill-free)."""
    forms = _measured_under(WS_SPLIT_32_REGS, triton_version)
    return forms[int(rope)] if forms else None


def plan_hopper_ws(
    tokens: int,
    heads: int,
    width: int,
    sms: int = DEFAULT_SMS,
    slots: int | None = None,
    splits: int | None = None,
    block_h: int | None = None,
    role_split: bool | None = None,
    rope: bool = False,
    l_partial: bool | None = None,
) -> LaunchPlan:
    """Launch shape for the warp-specialised SM90 kernel (at most 32 heads per program): 64-row
    blocks, two dequantized tiles, as many heads per program as it takes. With 16 heads per
    program the scorer and the accumulator are separate warpgroups (faster on the H200), and
    with 32 from WS_SPLIT_32_MIN_TOKENS tokens on where this Triton compiles both row forms
    spill-free (`ws_split_32_regs`; below that one consumer was faster, also at 8 and 64
    tokens where 16 heads per program would fill more SMs), with WS_SPLIT_SLOTS ring slots (as
    many as fit, if fewer) and one persistent program per SM; one consumer takes as many 32-row
    slots as shared memory holds and one program per work item (the H200 sweeps:
    results/reference/decode-tuning/). `rope`: the rows' RoPE lanes are read too (576-wide QK),
    which takes shared memory in the ring, the tiles and q, so fewer slots fit. `l_partial`:
    the softmax sums kept per thread until the item's last block, by default at
    WS_PARTIAL_SUM_BLOCK_H heads per program."""
    block_n = 64
    if block_h is None:
        block_h = min(WS_MAX_BLOCK_H, max(16, next_pow2(heads)))
    if block_h > WS_MAX_BLOCK_H:
        raise ValueError(
            f"the warp-specialised kernel takes at most {WS_MAX_BLOCK_H} heads per program"
        )
    if role_split is None:
        role_split = block_h == 16 or (
            block_h == 32
            and tokens >= WS_SPLIT_32_MIN_TOKENS
            and ws_split_32_regs(rope, installed_triton()) is not None
        )
    if role_split and block_h not in (16, 32):
        raise ValueError(
            "the warp-specialised kernel splits its consumer at 16 or 32 heads per program only"
        )
    if slots is None and role_split:
        # WS_SPLIT_SLOTS, or as many as fit (one, with RoPE lanes at 32 heads)
        slots = WS_SPLIT_SLOTS
        while slots > 1 and ws_smem_bytes(block_h, slots, block_n, True, rope) > HOPPER_SMEM:
            slots -= 1
    if slots is None:
        slots = 1
        while ws_smem_bytes(block_h, slots + 1, block_n, rope=rope) <= HOPPER_SMEM:
            slots += 1
    if ws_smem_bytes(block_h, slots, block_n, role_split, rope) > HOPPER_SMEM:
        raise ValueError(
            f"{slots} ring slots at {block_h} heads need more shared memory than SM90 has"
        )
    head_blocks, splits, per_split = _split_one_per_sm(
        tokens, heads, width, block_h, block_n, sms, splits
    )
    return LaunchPlan(
        block_h,
        head_blocks,
        block_n,
        splits,
        per_split,
        num_warps=4,
        num_stages=slots,
        prefetch=False,
        kernel="hopper_ws",
        role_split=role_split,
        max_programs=sms if role_split else 0,
        rope=rope,
        l_partial=block_h == WS_PARTIAL_SUM_BLOCK_H if l_partial is None else l_partial,
    )


def wide_block_n(rope: bool) -> int:
    """Rows per block of the 64-head kernel: fewer with RoPE lanes, for shared memory."""
    return WIDE_ROPE_BLOCK_N if rope else WIDE_BLOCK_N


def wide_smem_bytes(
    slots: int, rope: bool = False, kv_bufs: int = WIDE_KV_BUFS, p_bufs: int = WIDE_P_BUFS
) -> int:
    """Shared memory of the 64-head kernel: the producer's ring (fp8 tiles, scales, index
    entries), the `kv_bufs` dequantized tiles, q, the `p_bufs` P tiles and their rescale
    factors, 1/l, mbarriers and compiler scratch. With `rope` every row of the ring, of the
    tiles and of q also holds 64 bf16 RoPE lanes, and the blocks are `wide_block_n(True)` rows."""
    rope_row = RING_ROPE_BYTES if rope else 0
    block_n = wide_block_n(rope)
    ring = slots * WIDE_RING_ROWS * (RING_ROW_BYTES + rope_row)
    tiles = (kv_bufs * block_n + WIDE_BLOCK_H) * (512 * 2 + rope_row)
    p_tiles = p_bufs * WIDE_BLOCK_H * block_n * 2
    return ring + tiles + p_tiles + (p_bufs + 1) * WIDE_BLOCK_H * 4 + 1024


@functools.cache
def installed_triton() -> str | None:
    """The installed Triton's version, read once (plans are made on every uncached decode)."""
    return environment.package_version("triton")


def wide_q_reg_tiles(rope: bool, triton_version: str | None) -> int:
    """q's latent tiles the 64-head kernel's scorer holds in registers under this Triton (none
    for an unmeasured or unknown version: the rest of the kernel is the same)."""
    return (_measured_under(WIDE_Q_REG_TILES, triton_version) or (0, 0))[int(rope)]


def plan_hopper_wide(
    tokens: int,
    heads: int,
    width: int,
    sms: int = DEFAULT_SMS,
    slots: int | None = None,
    splits: int | None = None,
    rope: bool = False,
    kv_bufs: int = WIDE_KV_BUFS,
    p_bufs: int = WIDE_P_BUFS,
    q_regs: int | None = None,
    pv_split: bool | None = None,
    helpers: int | None = None,
    pair: bool | None = None,
) -> LaunchPlan:
    """Launch shape for the 64-head SM90 kernel: as many producer ring slots as shared memory
    holds beside `kv_bufs` tiles and `p_bufs` P tiles (three for NoPE rows; WIDE_ROPE_SLOTS with
    RoPE lanes, faster than the seven that fit), one program per (token, head block, split),
    split as `_split_one_per_sm` does. `rope`: the rows' RoPE lanes are read too (576-wide QK),
    in `wide_block_n(True)`-row blocks, since 64-row ones leave no room for the ring. `q_regs`:
    q's latent tiles the scorer keeps in registers, by default `wide_q_reg_tiles` for the
    installed Triton. `pv_split`: both halves of the output product in warpgroups of their own
    (the scorer only scores), by default for NoPE rows in programs of WIDE_PV_SPLIT_MIN_BLOCKS
    blocks or more that run as a pair or are given `helpers`; elsewhere the scorer runs the
    left half, as for RoPE rows; `helpers`: rows of every block each of them dequantizes beside
    the producer (0, 8 or 16; by default WIDE_HELP_ROWS with `pv_split` unpaired). `pair`: the
    two head blocks of a token in a 2-CTA cluster, each CTA dequantizing half of every block
    for both (`cluster`; NoPE rows, two head blocks, one split, the output split off, no
    helper rows), by default wherever that holds and `helpers` is not given, in
    WIDE_PAIR_SLOTS ring slots."""
    if q_regs is None:
        q_regs = wide_q_reg_tiles(rope, installed_triton())
    if not 0 <= q_regs <= 3:
        raise ValueError(f"the scorer holds 0 to 3 of q's latent tiles in registers, not {q_regs}")
    block_n = wide_block_n(rope)
    head_blocks, splits, per_split = _split_one_per_sm(
        tokens, heads, width, WIDE_BLOCK_H, block_n, sms, splits, fill=-(-sms // 2)
    )
    pairable = not rope and head_blocks == 2 and splits == 1
    if pv_split is None:  # where the pair runs (it needs the split), or helper rows are asked for
        pv_split = (
            not rope
            and per_split // block_n >= WIDE_PV_SPLIT_MIN_BLOCKS
            and (pairable or helpers is not None)
        )
    if pair is None:
        pair = helpers is None and pairable and pv_split
    if slots is None and rope:
        slots = WIDE_ROPE_SLOTS
    if slots is None and pair:
        slots = WIDE_PAIR_SLOTS
    if slots is None:
        slots = 1
        while wide_smem_bytes(slots + 1, rope, kv_bufs, p_bufs) <= HOPPER_SMEM:
            slots += 1
    if wide_smem_bytes(slots, rope, kv_bufs, p_bufs) > HOPPER_SMEM:
        raise ValueError(
            f"{slots} ring slots, {kv_bufs} tiles and {p_bufs} P tiles need more shared memory "
            "than SM90 has"
        )
    if helpers is None:
        helpers = WIDE_HELP_ROWS if pv_split and not rope and not pair else 0
    if helpers not in (0, 8, 16):
        raise ValueError(
            f"each output warpgroup dequantizes 0, 8 or 16 rows a block, not {helpers}"
        )
    if helpers and (rope or not pv_split):
        raise ValueError("the output warpgroups dequantize NoPE rows, with pv_split only")
    if pair and (rope or head_blocks != 2 or splits != 1 or not pv_split or helpers):
        raise ValueError(
            "2-CTA pairs take NoPE rows at two head blocks (128 heads) in one split, with the "
            "output split off and no helper rows"
        )
    return LaunchPlan(
        WIDE_BLOCK_H,
        head_blocks,
        block_n,
        splits,
        per_split,
        num_warps=4,
        num_stages=slots,
        prefetch=False,
        kernel="hopper_wide",
        rope=rope,
        kv_bufs=kv_bufs,
        p_bufs=p_bufs,
        q_regs=q_regs,
        pv_split=pv_split,
        helpers=helpers,
        pair=pair,
    )


def plan_register(
    heads: int, width: int, rope: bool = False, splits: int | None = None
) -> LaunchPlan:
    """Launch shape for the register kernel: one CTA per (token, head block of 16, split),
    REG_CTAS_PER_SM an SM, so the shape decides it without the token count. A split stages its
    index entries in shared memory, so a width of more than REG_INDEX_CAP entries takes several;
    by default no more than that (the kernel is planned where the tokens alone fill the SMs,
    `register_fills`)."""
    if heads % REG_BLOCK_H:
        raise ValueError(f"the register kernel takes heads in blocks of {REG_BLOCK_H}, not {heads}")
    fewest = -(-width // REG_INDEX_CAP)
    splits = max(fewest, splits or fewest)
    blocks = -(-width // REG_BLOCK_N)
    per_split = -(-blocks // splits) * REG_BLOCK_N
    splits = -(-width // per_split)  # no empty splits
    if per_split > REG_INDEX_CAP:
        raise ValueError(f"a split of the register kernel takes at most {REG_INDEX_CAP} entries")
    return LaunchPlan(
        REG_BLOCK_H,
        heads // REG_BLOCK_H,
        REG_BLOCK_N,
        splits,
        per_split,
        num_warps=4,
        num_stages=REG_STAGES,
        prefetch=False,
        kernel="register",
        rope=rope,
    )


def register_fills(tokens: int, heads: int, width: int, sms: int = DEFAULT_SMS) -> bool:
    """Where the register kernel is planned, for NoPE and shim rows alike: 16 heads, the width
    in one split, and the CTAs filling at least REG_MIN_FILL of the slots of their last wave
    (REG_CTAS_PER_SM an SM), since a partly filled wave costs as much as a full one."""
    if heads != REG_BLOCK_H or width > REG_INDEX_CAP or tokens <= 0:
        return False
    slots = REG_CTAS_PER_SM * sms
    waves = -(-tokens // slots)
    return tokens >= REG_MIN_FILL * waves * slots
