"""verify-layout: write random rows with an implementation, check every byte independently.

A case fills a sentinel-filled cache (with guard rows before and after it) through a writer,
then checks row by row against constructions that share no code with the writer: numpy scales,
the bit-level e4m3 encoder in `e4m3`, numpy bf16 rounding for the gathered output.
Writers and gatherers are plain functions with the reference's signatures, so the same checks
serve the torch reference, the CUDA kernels and the deliberately broken writers of the tests.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch

from nopebench import e4m3, rowformat
from nopebench import geometry as g
from nopebench.config import ModelConfig

SENTINEL = 0xA5  # finite as fp8 (-0.203), fp32 and bf16, so sentinel rows decode without NaN
GUARD_ROWS = 4  # rows of sentinel before and after the cache: catches writes at slot -1

Writer = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, str], None]
Gatherer = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class LayoutCase:
    """One write-and-check case. Its seed derives from its id, so a case is reproducible alone."""

    tokens: int
    block_size: int
    row_bytes: int
    rope_dim: int
    scale_format: str
    requests: int = 4
    skip_fraction: float = 0.1
    strided_inputs: bool = True
    base_seed: int = 0

    @property
    def case_id(self) -> str:
        rope = f"rope{self.rope_dim}" if self.rope_dim else "nope"
        stride = "strided" if self.strided_inputs else "contig"
        return (
            f"T{self.tokens}-bs{self.block_size}-row{self.row_bytes}-{rope}-{self.scale_format}"
            f"-{stride}"
        )

    @property
    def seed(self) -> int:
        return zlib.crc32(f"{self.case_id}/{self.base_seed}".encode())


@dataclass(frozen=True)
class CheckResult:
    check: str
    rows: int
    passed: bool
    worst: float | None = None
    detail: str = ""


@dataclass
class LayoutInputs:
    """Everything a writer and a gatherer are called with, plus the request structure."""

    kv_c: torch.Tensor
    k_pe: torch.Tensor | None
    slot_mapping: torch.Tensor
    block_table: torch.Tensor
    workspace_starts: torch.Tensor
    seq_starts: torch.Tensor
    total_rows: int
    num_blocks: int


def model_case(model: ModelConfig, tokens: int, seed: int = 0) -> LayoutCase:
    """The case a model config implies: its block size, row size, RoPE width and scale format."""
    return LayoutCase(
        tokens=tokens,
        block_size=model.block_size,
        row_bytes=model.row_bytes,
        rope_dim=model.qk_rope_head_dim,
        scale_format=model.kv_scale_format,
        base_seed=seed,
    )


def sweep_cases(
    model: ModelConfig, seed: int = 0, tokens: tuple[int, ...] = (1, 63, 64, 65, 4096, 65536)
) -> list[LayoutCase]:
    """Token counts x block sizes {64, 16} x the row sizes the model's RoPE allows x both scale
    formats, contiguous and strided inputs in a checkerboard (the grid kernels are held to).

    The checkerboard (parity of the sum of the grid indices) gives every (block size, row size,
    scale format) both input layouts across token counts; alternating on the running case count
    would tie the layout to the innermost loop, the scale format.
    """
    row_sizes = (g.FULL_ROW_BYTES, g.NOPE_ROW_BYTES) if model.nope else (g.FULL_ROW_BYTES,)
    base = model_case(model, tokens[0], seed)
    cases = []
    for i, t in enumerate(tokens):
        for j, bs in enumerate((64, 16)):
            for k, rb in enumerate(row_sizes):
                for m, fmt in enumerate(rowformat.SCALE_FORMATS):
                    strided = (i + j + k + m) % 2 == 0
                    cases.append(
                        replace(
                            base,
                            tokens=t,
                            block_size=bs,
                            row_bytes=rb,
                            scale_format=fmt,
                            strided_inputs=strided,
                        )
                    )
    return cases


# ---------------------------------------------------------------- inputs


GEN_CHUNK = 1 << 16  # tokens of latent drawn at a time (bounds generation's working memory)
CHECK_CHUNK = 1 << 14  # written tokens, or gathered rows, checked at a time
MAX_TOKENS = 1 << 20  # the documented maximum of --tokens, measured in results/reference/cpu-limits
# Host memory a case takes beyond its per-token buffers: the process itself and the working
# set of one generation chunk and one check chunk. Set from measured peaks (peak RSS 1.96 GiB
# at 65536 tokens, 2.17 GiB at 262144, 4.06 GiB at 1048576), so the estimate stays above them.
MEMORY_FIXED_BYTES = int(1.9 * (1 << 30))


def memory_per_token(case: LayoutCase) -> int:
    """Host bytes a case holds per token while it is checked: the writer's input buffer, the
    cache rows and the gathered bf16 output, all alive at once."""
    width = g.LATENT_DIM + (g.ROPE_DIM if case.rope_dim else 0)
    inputs = (width + 64) * 2 if case.strided_inputs else width * 2
    return inputs + case.row_bytes + g.UPCONVERT_DIM * 2


def memory_bytes(case: LayoutCase) -> int:
    """About the most host memory one case takes (what `verify_layout` checks before work)."""
    return MEMORY_FIXED_BYTES + case.tokens * memory_per_token(case)


def tokens_that_fit(case: LayoutCase, available: int) -> int:
    """The largest token count of `case`'s shape whose `memory_bytes` is within `available`."""
    return max(0, min(MAX_TOKENS, (available - MEMORY_FIXED_BYTES) // memory_per_token(case)))


def adversarial_latent_into(out: torch.Tensor, gen: torch.Generator) -> None:
    """Fill `out` ([T, 512] bf16, may be a strided view) with `adversarial_latent`, GEN_CHUNK
    tokens at a time from the same generator: a case of up to GEN_CHUNK tokens draws exactly
    what one call would, and a larger one needs only one chunk's working memory."""
    for start in range(0, out.shape[0], GEN_CHUNK):
        stop = min(out.shape[0], start + GEN_CHUNK)
        out[start:stop] = adversarial_latent(stop - start, gen)


def adversarial_latent(tokens: int, gen: torch.Generator) -> torch.Tensor:
    """[T, 512] bf16 latent values that exercise every corner of the quantizer.

    Per tile: a log-uniform magnitude over 1e-3..1e3; some tiles all zero, some all bf16
    subnormals, some near the bf16 maximum, some with exact e4m3 ties under the arbitrary scale.
    Per element: +-0, lone subnormals, and values within 3% of the tile's amax (so x / scale
    lands just under 448) plus exactly +-amax (exactly 448).
    """
    shape = (tokens, g.N_TILES, g.TILE)
    u = lambda: torch.rand(shape[:2], generator=gen)  # noqa: E731
    magnitude = torch.pow(10.0, torch.rand(shape[:2], generator=gen) * 6 - 3)
    x = torch.randn(shape, generator=gen) * magnitude.unsqueeze(-1)
    x = torch.where((u() < 0.04).unsqueeze(-1), torch.zeros_like(x), x)
    x = torch.where((u() < 0.03).unsqueeze(-1), torch.randn(shape, generator=gen) * 2e-39, x)
    x = torch.where(
        (u() < 0.02).unsqueeze(-1), torch.randn(shape, generator=gen).clamp(-3, 3) * 1e38, x
    )
    r = torch.rand(shape, generator=gen)
    x = torch.where(r < 0.01, torch.zeros_like(x), x)
    x = torch.where((r >= 0.01) & (r < 0.02), -torch.zeros_like(x), x)
    x = torch.where((r >= 0.02) & (r < 0.03), torch.randn(shape, generator=gen) * 1e-39, x)
    # Tie tiles: amax = 448 * 7 * 2**k, so the arbitrary scale is exactly 7 * 2**k, and 1 in 8
    # elements at (odd / 16) * 2**e * scale, halfway between two e4m3 values, where
    # round-to-nearest-even decides. fl(1/7) is 4e-8 high, so x * (1 / scale) lands past some
    # of these ties: a writer that multiplies by 1/scale instead of dividing fails reliably.
    tie = (torch.rand(shape[:2], generator=gen) < 0.125).unsqueeze(-1)
    scale = 7.0 * torch.pow(2.0, torch.randint(-40, 41, (*shape[:2], 1), generator=gen).double())
    odd = (2 * torch.randint(8, 16, shape, generator=gen) + 1).double() / 16  # 17/16 .. 31/16
    ties = odd * torch.pow(2.0, torch.randint(-6, 8, shape, generator=gen).double()) * scale
    ties = ties * torch.sign(torch.randn(shape, generator=gen)).double()
    body = (torch.randn(shape, generator=gen).double() * 100 * scale).clamp(
        -448 * scale, 448 * scale
    )
    tile = torch.where(torch.rand(shape, generator=gen) < 0.125, ties, body)
    tile[..., :1] = 448 * scale  # pins the amax, so the scale is exactly 7 * 2**k
    x = torch.where(tie, tile.float(), x)
    amax = x.abs().amax(-1, keepdim=True)
    near = (
        amax
        * (0.97 + 0.03 * torch.rand(shape, generator=gen))
        * torch.sign(torch.randn(shape, generator=gen))
    )
    x = torch.where((r >= 0.03) & (r < 0.05), near, x)
    pick = torch.randint(0, g.TILE, shape[:2], generator=gen)
    x.scatter_(-1, pick.unsqueeze(-1), -amax)  # one exact -amax per tile: x / scale == -448
    return x.reshape(tokens, g.LATENT_DIM).to(torch.bfloat16)


def make_inputs(case: LayoutCase, device: torch.device | str = "cpu") -> LayoutInputs:
    """Requests laid out in random blocks; their tokens' slots (some -1) form the slot mapping.

    Requests' gather windows start at random seq_starts, so the gather reads written rows,
    skipped rows (sentinel) and rows of other blocks alike. Inputs are strided views of one
    [T, 576] buffer when `strided_inputs`, as a serving engine passes kv_c and k_pe.
    """
    gen = torch.Generator().manual_seed(case.seed)
    t, bs = case.tokens, case.block_size
    reqs = max(1, min(case.requests, t))
    cuts = (
        torch.sort(torch.randperm(max(t - 1, 1), generator=gen)[: reqs - 1] + 1).values
        if reqs > 1
        else torch.tensor([], dtype=torch.long)
    )
    bounds = torch.cat([torch.tensor([0]), cuts, torch.tensor([t])])
    lengths = (bounds[1:] - bounds[:-1]).tolist()
    blocks_per_req = [-(-n // bs) + 1 for n in lengths]  # one spare block each
    num_blocks = sum(blocks_per_req) + 2  # two blocks nobody owns
    perm = torch.randperm(num_blocks, generator=gen)
    max_blocks = max(blocks_per_req)
    block_table = torch.full((reqs, max_blocks), -1, dtype=torch.int32)
    slots = []
    at = 0
    for r, (n, nb) in enumerate(zip(lengths, blocks_per_req, strict=True)):
        block_table[r, :nb] = perm[at : at + nb].to(torch.int32)
        at += nb
        pos = torch.arange(n)
        slots.append(block_table[r, pos // bs].long() * bs + pos % bs)
    slot_mapping = torch.cat(slots)
    skip = torch.rand(t, generator=gen) < case.skip_fraction
    slot_mapping = torch.where(skip, torch.full_like(slot_mapping, -1), slot_mapping)
    # Gather windows: request r reads n_r positions starting at seq_starts[r] (within its blocks).
    seq_starts = torch.tensor([int(torch.randint(0, bs, (1,), generator=gen)) for _ in range(reqs)])
    spans = [
        min(n, nb * bs - int(s))
        for n, nb, s in zip(lengths, blocks_per_req, seq_starts.tolist(), strict=True)
    ]
    workspace_starts = torch.tensor([0, *np.cumsum(spans)[:-1].tolist()], dtype=torch.int32)

    width = g.LATENT_DIM + (g.ROPE_DIM if case.rope_dim else 0)
    # The latent is drawn straight into the buffer the writer reads (no second copy of it).
    buf = torch.empty(t, width + 64 if case.strided_inputs else g.LATENT_DIM, dtype=torch.bfloat16)
    adversarial_latent_into(buf[:, : g.LATENT_DIM], gen)
    rope = (
        torch.randn(t, g.ROPE_DIM, generator=gen)
        * torch.pow(10.0, torch.rand(t, 1, generator=gen) * 4 - 2)
    ).to(torch.bfloat16)
    if case.strided_inputs:
        if case.rope_dim:
            buf[:, g.LATENT_DIM : width] = rope
        buf = buf.to(device)  # once: kv_c and k_pe are views of one device buffer
        kv_c = buf[:, : g.LATENT_DIM]
        k_pe = buf[:, g.LATENT_DIM : width] if case.rope_dim else None
    else:
        kv_c = buf.to(device)
        k_pe = rope.to(device) if case.rope_dim else None
    return LayoutInputs(
        kv_c=kv_c,
        k_pe=k_pe,
        slot_mapping=slot_mapping.to(device),
        block_table=block_table.to(device),
        workspace_starts=workspace_starts.to(device),
        seq_starts=seq_starts.to(torch.int32).to(device),
        total_rows=int(sum(spans)),
        num_blocks=num_blocks,
    )


def guarded_cache(
    num_blocks: int, block_size: int, row_bytes: int, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(storage, cache): a sentinel-filled cache view with GUARD_ROWS rows of margin each side."""
    rows = num_blocks * block_size
    storage = torch.full(
        ((rows + 2 * GUARD_ROWS) * row_bytes,), SENTINEL, dtype=torch.uint8, device=device
    )
    cache = storage[GUARD_ROWS * row_bytes : (GUARD_ROWS + rows) * row_bytes].view(
        num_blocks, block_size, row_bytes
    )
    return storage, cache


# ---------------------------------------------------------------- independent constructions


def independent_scales(latent: np.ndarray, scale_format: str) -> np.ndarray:
    """[T, 512] float32 -> [T, 4] float32 scales, computed in numpy."""
    amax = np.abs(latent.reshape(-1, g.N_TILES, g.TILE)).max(axis=-1).astype(np.float32)
    ratio = (amax / np.float32(g.FP8_MAX)).astype(np.float32)
    if scale_format == "arbitrary_fp32":
        return np.maximum(ratio, np.finfo(np.float32).tiny).astype(np.float32)
    m, e = np.frexp(np.maximum(ratio, np.float32(rowformat.POW2_FLOOR)).astype(np.float64))
    return np.ldexp(1.0, np.where(m == 0.5, e - 1, e)).astype(np.float32)


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns, round to nearest even (NaN stays a quiet NaN)."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0) | (rounded & 0x8000), rounded)


def decode_e4m3(codes: np.ndarray) -> np.ndarray:
    """e4m3fn bytes -> float32 values (NaN for 0x7F / 0xFF)."""
    c = codes.astype(np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    exp = (c >> 3) & 0xF
    mant = c & 0x7
    val = np.where(exp == 0, mant * 2.0**-9, (1 + mant / 8) * np.ldexp(1.0, exp - 7))
    return np.where((c & 0x7F) == 0x7F, np.nan, sign * val).astype(np.float32)


def independent_gather(rows: np.ndarray, rope_dim: int) -> np.ndarray:
    """Packed rows [N, row_bytes] uint8 -> expected gather output bits [N, 576] uint16."""
    vals = decode_e4m3(rows[:, : g.SCALE_OFFSET]).reshape(-1, g.N_TILES, g.TILE)
    scales = rows[:, g.SCALE_OFFSET : g.ROPE_OFFSET].copy().view(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        latent = (vals * scales[:, :, None]).astype(np.float32).reshape(-1, g.LATENT_DIM)
    out = np.zeros((rows.shape[0], g.UPCONVERT_DIM), dtype=np.uint16)
    out[:, : g.LATENT_DIM] = bf16_bits(latent)
    if rope_dim:
        out[:, g.LATENT_DIM :] = rows[:, g.ROPE_OFFSET :].copy().view(np.uint16)
    return out


# ---------------------------------------------------------------- checks


def run_case(
    case: LayoutCase, writer: Writer, gatherer: Gatherer, device="cpu"
) -> list[CheckResult]:
    """Write the case's rows with `writer`, gather with `gatherer`, run every check."""
    inputs = make_inputs(case, device)
    storage, cache = guarded_cache(inputs.num_blocks, case.block_size, case.row_bytes, device)
    writer(cache, inputs.kv_c, inputs.k_pe, inputs.slot_mapping, case.scale_format)
    gathered = gatherer(
        cache,
        inputs.block_table,
        inputs.workspace_starts,
        inputs.total_rows,
        case.rope_dim,
        inputs.seq_starts,
    )
    return check_written(case, inputs, storage, gathered)


def check_written(
    case: LayoutCase, inputs: LayoutInputs, storage: torch.Tensor, gathered: torch.Tensor
) -> list[CheckResult]:
    """Every check of one case, given the cache storage after the write and the gather output.

    The per-row checks run CHECK_CHUNK written tokens (and gathered rows) at a time and add up:
    the same verdicts, counts, worst values and first failures as one pass over everything,
    in a working memory that does not grow with the case (numpy widens each element to 8 bytes
    or more, which at the documented maximum of 2**20 tokens would need tens of GB at once).
    """
    rb = case.row_bytes
    flat = storage.cpu().numpy().reshape(-1, rb)
    guard = np.concatenate([flat[:GUARD_ROWS], flat[-GUARD_ROWS:]])
    cache_rows = flat[GUARD_ROWS:-GUARD_ROWS]
    slots = inputs.slot_mapping.cpu().numpy().astype(np.int64)
    tokens = slots.shape[0]
    finite = np.empty(tokens, dtype=bool)
    scales_ok = _Tally("scales exact")
    latent_ok = _Tally("latent bytes = independent e4m3")
    tail_ok = _Tally("RoPE tail bit-exact bf16" if case.rope_dim else "NoPE tail zero")
    dequant = _DequantTally()
    for start in range(0, tokens, CHECK_CHUNK):
        stop = min(tokens, start + CHECK_CHUNK)
        latent = inputs.kv_c[start:stop].float().cpu().numpy()
        part_finite = np.isfinite(latent).all(axis=1)
        rope = None
        if inputs.k_pe is not None:
            k_pe = inputs.k_pe[start:stop]
            part_finite &= np.isfinite(k_pe.float().cpu().numpy()).all(axis=1)
            rope = k_pe.cpu().contiguous().view(torch.int16).numpy().view(np.uint16)
        finite[start:stop] = part_finite
        local = np.nonzero((slots[start:stop] >= 0) & part_finite)[0]
        tok = local + start
        rows = cache_rows[slots[tok]]
        scales = independent_scales(latent[local], case.scale_format)
        scales_ok.add(
            tok,
            rows[:, g.SCALE_OFFSET : g.ROPE_OFFSET],
            scales.view(np.uint8).reshape(-1, 16),
        )
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            scaled = (latent[local].reshape(-1, g.N_TILES, g.TILE) / scales[:, :, None]).astype(
                np.float32
            )
        latent_ok.add(tok, rows[:, : g.SCALE_OFFSET], e4m3.encode(scaled).reshape(-1, g.LATENT_DIM))
        if rb != g.NOPE_ROW_BYTES:
            tail = rows[:, g.ROPE_OFFSET :]
            if case.rope_dim:
                tail_ok.add(tok, tail.copy().view(np.uint16), rope[local])
            else:
                tail_ok.add(tok, tail, np.zeros_like(tail))
        dequant.add(tok, rows, latent[local], scales, scaled)
    if rb == g.NOPE_ROW_BYTES:
        written = int(np.count_nonzero((slots >= 0) & finite))
        tail_result = CheckResult(
            "RoPE tail (528-byte rows: none)", written, True, None, "no tail bytes in compact rows"
        )
    else:
        tail_result = tail_ok.result()
    return [
        _finite_check(finite),
        scales_ok.result(),
        latent_ok.result(),
        tail_result,
        _untouched_check(cache_rows, slots[slots >= 0], guard),
        dequant.result(),
        _gather_check(case, inputs, cache_rows, gathered),
    ]


def _finite_check(finite: np.ndarray) -> CheckResult:
    bad = np.nonzero(~finite)[0]
    detail = (
        ""
        if not bad.size
        else f"non-finite input in rows {bad[:5].tolist()}{' ...' if bad.size > 5 else ''}"
    )
    return CheckResult("input finite", int(finite.size), not bad.size, None, detail)


class _Tally:
    """A byte-for-byte row comparison added up over chunks: rows compared, rows that differ,
    and where the first one differs."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.rows = 0
        self.bad = 0
        self.first = ""

    def add(self, tok: np.ndarray, got: np.ndarray, expected: np.ndarray) -> None:
        self.rows += int(tok.size)
        bad = np.nonzero((got != expected).any(axis=1))[0]
        if bad.size and not self.bad:
            first = bad[0]
            col = int(np.nonzero(got[first] != expected[first])[0][0])
            self.first = (
                f"first token {int(tok[first])} at byte/lane {col}: "
                f"got {got[first, col]:#x}, expected {expected[first, col]:#x}"
            )
        self.bad += int(bad.size)

    def result(self) -> CheckResult:
        if not self.bad:
            return CheckResult(self.name, self.rows, True, 0.0)
        return CheckResult(
            self.name, self.rows, False, float(self.bad), f"{self.bad} rows differ; {self.first}"
        )


def _rows_equal(name: str, tok: np.ndarray, got: np.ndarray, expected: np.ndarray) -> CheckResult:
    tally = _Tally(name)
    tally.add(tok, got, expected)
    return tally.result()


def _untouched_check(
    cache_rows: np.ndarray, valid_slots: np.ndarray, guard: np.ndarray
) -> CheckResult:
    untouched = np.ones(cache_rows.shape[0], dtype=bool)
    untouched[valid_slots] = False
    changed = np.nonzero((cache_rows[untouched] != SENTINEL).any(axis=1))[0]
    guard_hit = bool((guard != SENTINEL).any())
    passed = not changed.size and not guard_hit
    detail = ""
    if changed.size:
        detail = (
            f"{changed.size} skipped/untouched slots were written, "
            f"first slot {int(np.nonzero(untouched)[0][changed[0]])}"
        )
    if guard_hit:
        detail += ("; " if detail else "") + "bytes outside the cache (guard rows) were written"
    return CheckResult(
        "skipped and untouched slots keep sentinel",
        int(untouched.sum()),
        passed,
        float(changed.size),
        detail,
    )


class _DequantTally:
    """|dequant(row) - x| <= scale * e4m3 half-ulp(x / scale) + bf16 half-ulp(result), per
    element, added up over chunks.

    Reported worst value is the largest error / bound ratio (<= 1 passes). A NaN ratio (a NaN
    or infinite dequantized value) counts as infinitely out of bound: `NaN > 1` is False, so
    testing `ratio > 1` alone would pass a row whose scale is NaN.
    """

    name = "dequant error within e4m3 bound"

    def __init__(self) -> None:
        self.rows = 0
        self.bad = 0
        self.first: int | None = None
        self.worst = 0.0

    def add(
        self,
        tok: np.ndarray,
        rows: np.ndarray,
        latent: np.ndarray,
        scales: np.ndarray,
        scaled: np.ndarray,
    ) -> None:
        if not tok.size:
            return
        deq, _ = rowformat.dequantize_rows(torch.from_numpy(np.ascontiguousarray(rows)))
        deq = deq.float().numpy().reshape(-1, g.N_TILES, g.TILE).astype(np.float64)
        x = latent.reshape(-1, g.N_TILES, g.TILE).astype(np.float64)
        # bf16 rounding: half an ulp relative (2**-9, doubled for the fp32 product's own
        # rounding), and half the bf16 subnormal spacing (2**-134) where the result is subnormal.
        bound = (
            scales[:, :, None].astype(np.float64) * e4m3.rounding_bound(scaled)
            + np.abs(deq) * 2.0**-8
            + 2.0**-134
        )
        with np.errstate(invalid="ignore"):
            ratio = np.abs(deq - x) / bound
        ratio = np.where(np.isnan(ratio), np.inf, ratio)
        self.rows += int(tok.size)
        self.worst = max(self.worst, float(ratio.max()))
        bad = np.nonzero((~(ratio <= 1)).any(axis=(1, 2)))[0]
        if bad.size and self.first is None:
            self.first = int(tok[bad[0]])
        self.bad += int(bad.size)

    def result(self) -> CheckResult:
        detail = f"{self.bad} rows exceed the bound; first token {self.first}" if self.bad else ""
        return CheckResult(self.name, self.rows, not self.bad, self.worst, detail)


def _gather_check(
    case: LayoutCase, inputs: LayoutInputs, cache_rows: np.ndarray, gathered: torch.Tensor
) -> CheckResult:
    name = "gather/upconvert bit-exact" + (", NoPE lanes zero" if not case.rope_dim else "")
    expected_shape = (inputs.total_rows, g.UPCONVERT_DIM)
    if tuple(gathered.shape) != expected_shape or gathered.dtype != torch.bfloat16:
        return CheckResult(
            name,
            inputs.total_rows,
            False,
            None,
            f"output {gathered.dtype} {tuple(gathered.shape)}, expected bf16 {expected_shape}",
        )
    plan = rowformat.gather_plan(
        torch.from_numpy(cache_rows).view(inputs.num_blocks, case.block_size, case.row_bytes),
        inputs.block_table.cpu(),
        inputs.workspace_starts.cpu(),
        inputs.total_rows,
        case.rope_dim,
        inputs.seq_starts.cpu(),
    ).numpy()
    tally = _Tally(name)
    for start in range(0, inputs.total_rows, CHECK_CHUNK):
        stop = min(inputs.total_rows, start + CHECK_CHUNK)
        expected = independent_gather(cache_rows[plan[start:stop]], case.rope_dim)
        got = gathered[start:stop].cpu().contiguous().view(torch.int16).numpy().view(np.uint16)
        both_nan = _bf16_nan(got) & _bf16_nan(expected)
        tally.add(
            np.arange(start, stop), np.where(both_nan, 0, got), np.where(both_nan, 0, expected)
        )
    return tally.result()


def _bf16_nan(bits: np.ndarray) -> np.ndarray:
    return ((bits & 0x7F80) == 0x7F80) & ((bits & 0x7F) != 0)


def summarize(case: LayoutCase, impl: str, results: list[CheckResult]) -> list[dict]:
    """Long-format record rows: one per (case, implementation, check)."""
    return [{"case": case.case_id, "impl": impl, **asdict(case), **asdict(r)} for r in results]


# ---------------------------------------------------------------- implementations and the command


@dataclass(frozen=True)
class LayoutImpl:
    """A writer/gatherer pair under test. `load` returns (writer, gatherer) or raises
    UnsupportedError naming what this machine lacks."""

    name: str
    needs_gpu: bool
    load: Callable[[], tuple[Writer, Gatherer]]


def _load_reference() -> tuple[Writer, Gatherer]:
    return rowformat.write_cache, rowformat.gather_upconvert


def _load_cuda() -> tuple[Writer, Gatherer]:
    from nopebench import cache_kernels  # imported lazily: builds or loads the CUDA library

    return cache_kernels.write_cache, cache_kernels.gather_upconvert


IMPLEMENTATIONS: dict[str, LayoutImpl] = {
    "reference": LayoutImpl("reference", needs_gpu=False, load=_load_reference),
    "cuda": LayoutImpl("cuda", needs_gpu=True, load=_load_cuda),
}


@dataclass
class LayoutReport:
    rows: list[dict]
    skipped: dict[str, str]

    @property
    def passed(self) -> bool:
        return all(r["passed"] for r in self.rows)


def verify_layout(
    cases: list[LayoutCase], impl_names: list[str], progress: Callable[[str], None] | None = None
) -> LayoutReport:
    """Run every case through every requested implementation that this machine can run."""
    from nopebench.errors import UnsupportedError

    rows: list[dict] = []
    skipped: dict[str, str] = {}
    for name in impl_names:
        impl = IMPLEMENTATIONS[name]
        if impl.needs_gpu and not torch.cuda.is_available():
            skipped[name] = "needs a CUDA GPU; none is visible"
            continue
        try:
            writer, gatherer = impl.load()
        except UnsupportedError as exc:
            skipped[name] = str(exc)
            continue
        device = "cuda" if impl.needs_gpu else "cpu"
        for case in cases:
            if progress:
                progress(f"{name} {case.case_id}")
            rows.extend(summarize(case, name, run_case(case, writer, gatherer, device)))
    return LayoutReport(rows, skipped)
