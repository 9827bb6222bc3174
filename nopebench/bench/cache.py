"""Throughput of the CUDA cache write and gather/upconvert kernels (`nopebench bench-cache`).

For each token count and row kind (NoPE in 528- and 656-byte rows, RoPE in 656-byte rows) the
runner first checks the kernels' output against the reference of record (rowformat on the
CPU) and only then times them, with timing.time_gpu (CUDA graphs, input sets rotated past L2),
next to the torch reference run on the same GPU (eager: it synchronises with the host).

Bytes are the fewest each operation must move (geometry.cache_write_bytes, gather_bytes):
the write reads bf16 latent (+ RoPE) and writes one packed row; the gather reads the part of
the row it needs (528 bytes for NoPE, 656 with RoPE) and writes 576 bf16. GB/s are set
against the device copy bandwidth measured in the same run.

The torch reference run on the GPU is compared with the CPU reference too (`check_passed` on
its rows): rowformat divides by a tensor so that CUDA torch does a true divide rather than a
multiply by 1/448, and this records that the two devices agree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from nopebench import geometry as g
from nopebench import rowformat

BLOCK_SIZE = 64
TOKENS_PER_REQUEST = 4096  # the gather reads requests of this many context tokens
SCALE_FORMAT = rowformat.ARBITRARY_FP32
BUDGET_S, QUICK_BUDGET_S = 0.4, 0.1
# The kernels' bar: at 65536 tokens and more, 60% of the copy bandwidth and 20x the torch path.
TARGET_MIN_TOKENS, TARGET_PCT_COPY, TARGET_SPEEDUP = 65536, 60.0, 20.0


@dataclass(frozen=True)
class Variant:
    name: str
    rope_dim: int
    row_bytes: int


VARIANTS = (
    Variant("nope528", 0, g.NOPE_ROW_BYTES),
    Variant("nope656", 0, g.FULL_ROW_BYTES),
    Variant("rope656", g.ROPE_DIM, g.FULL_ROW_BYTES),
)


@dataclass
class InputSet:
    """One call's worth of inputs and outputs; several are rotated so L2 stays cold."""

    kv_c: torch.Tensor
    k_pe: torch.Tensor | None
    slot_mapping: torch.Tensor
    cache: torch.Tensor
    block_table: torch.Tensor
    workspace_starts: torch.Tensor
    out: torch.Tensor


def op_bytes(op: str, tokens: int, v: Variant) -> int:
    if op == "write":
        return g.cache_write_bytes(tokens, v.rope_dim, v.row_bytes)
    return g.gather_bytes(tokens, g.row_bytes_read(v.rope_dim))


# ---------------------------------------------------------------- inputs


def make_set(tokens: int, v: Variant, gen: torch.Generator, dev: str = "cuda") -> InputSet:
    """Random latents (normal times a per-token magnitude over 1e-2..1e2: never zero), tokens
    written to randomly placed blocks as a serving engine's slot mapping does, and the block
    table of the requests that read them back."""
    buf = torch.randn(tokens, g.UPCONVERT_DIM, device=dev, generator=gen)
    buf *= torch.pow(10.0, torch.rand(tokens, 1, device=dev, generator=gen) * 4 - 2)
    buf = buf.to(torch.bfloat16)  # kv_c and k_pe are row slices of one projection output
    blocks = -(-tokens // BLOCK_SIZE)
    perm = torch.randperm(blocks, device=dev, generator=gen)
    pos = torch.arange(tokens, device=dev)
    slot_mapping = perm[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE
    per_req = TOKENS_PER_REQUEST // BLOCK_SIZE
    requests = -(-tokens // TOKENS_PER_REQUEST)
    padded = torch.full((requests * per_req,), -1, dtype=torch.int64, device=dev)
    padded[:blocks] = perm
    return InputSet(
        kv_c=buf[:, : g.LATENT_DIM],
        k_pe=buf[:, g.LATENT_DIM :] if v.rope_dim else None,
        slot_mapping=slot_mapping,
        cache=torch.zeros(blocks, BLOCK_SIZE, v.row_bytes, dtype=torch.uint8, device=dev),
        block_table=padded.view(requests, per_req).to(torch.int32),
        workspace_starts=torch.arange(requests, device=dev, dtype=torch.int32) * TOKENS_PER_REQUEST,
        out=torch.empty(tokens, g.UPCONVERT_DIM, dtype=torch.bfloat16, device=dev),
    )


# ---------------------------------------------------------------- checks


def check_against_cpu(
    s: InputSet, tokens: int, v: Variant
) -> tuple[dict[str, str | None], dict[str, bool]]:
    """Run the validated kernels and the GPU torch reference on one set, and compare both
    with rowformat on the CPU (the reference of record).

    Returns ({op: None or the kernel's mismatch}, {op: GPU reference == CPU reference}) and
    leaves the kernel-written cache in s.cache. Each gather is compared on the same cache
    bytes, so a write mismatch does not hide or cause a gather one.
    """
    from nopebench.cache_kernels import gather_upconvert, write_cache

    k_pe = s.k_pe.cpu() if s.k_pe is not None else None
    expected = torch.zeros(tuple(s.cache.shape), dtype=torch.uint8)
    rowformat.write_cache(expected, s.kv_c.cpu(), k_pe, s.slot_mapping.cpu(), SCALE_FORMAT)
    by_torch = torch.zeros_like(s.cache)
    rowformat.write_cache(by_torch, s.kv_c, s.k_pe, s.slot_mapping, SCALE_FORMAT)
    write_cache(s.cache, s.kv_c, s.k_pe, s.slot_mapping, SCALE_FORMAT)
    got = s.cache.cpu()
    expected_out = rowformat.gather_upconvert(
        got, s.block_table.cpu(), s.workspace_starts.cpu(), tokens, v.rope_dim
    ).view(torch.int16)
    out = gather_upconvert(s.cache, s.block_table, s.workspace_starts, tokens, v.rope_dim)
    torch_out = rowformat.gather_upconvert(
        s.cache, s.block_table, s.workspace_starts, tokens, v.rope_dim
    )
    errors = {
        "write": _diff("cache bytes", got, expected),
        "gather": _diff("gathered bf16", out.cpu().view(torch.int16), expected_out),
    }
    torch_exact = {
        "write": torch.equal(by_torch.cpu(), expected),
        "gather": torch.equal(torch_out.cpu().view(torch.int16), expected_out),
    }
    return errors, torch_exact


def _diff(what: str, got: torch.Tensor, expected: torch.Tensor) -> str | None:
    bad = (got != expected).reshape(-1, got.shape[-1]).any(dim=1)  # per cache slot / output row
    if not bool(bad.any()):
        return None
    return (
        f"{what} differ from the CPU reference in {int(bad.sum())} of {bad.numel()} rows, "
        f"first row {int(torch.nonzero(bad)[0])}"
    )


# ---------------------------------------------------------------- timing


def calls_for(
    op: str, impl: str, sets: list[InputSet], tokens: int, v: Variant
) -> list[Callable[[], object]]:
    from nopebench.cache_kernels import gather_upconvert_into, write_cache_unchecked

    def bind(s: InputSet) -> Callable[[], object]:
        if op == "write" and impl == "cuda":
            return lambda: write_cache_unchecked(
                s.cache, s.kv_c, s.k_pe, s.slot_mapping, SCALE_FORMAT
            )
        if op == "write":
            return lambda: rowformat.write_cache(
                s.cache, s.kv_c, s.k_pe, s.slot_mapping, SCALE_FORMAT
            )
        if impl == "cuda":
            return lambda: gather_upconvert_into(
                s.out, s.cache, s.block_table, s.workspace_starts, tokens, v.rope_dim
            )
        return lambda: rowformat.gather_upconvert(
            s.cache, s.block_table, s.workspace_starts, tokens, v.rope_dim
        )

    return [bind(s) for s in sets]


def measure(
    tokens: int,
    v: Variant,
    budget_s: float,
    copy_gbps: float,
    l2_bytes: int | None,
    device: str = "cuda",
) -> list[dict]:
    """Rows for one (tokens, variant): both ops, both implementations, checked first."""
    from nopebench.bench import timing

    gen = torch.Generator(device=device).manual_seed(tokens * 1000 + v.row_bytes + v.rope_dim)
    per_set = min(op_bytes("write", tokens, v), op_bytes("gather", tokens, v))
    sets = [
        make_set(tokens, v, gen, device) for _ in range(timing.rotation_count(per_set, l2_bytes))
    ]
    errors, torch_exact = check_against_cpu(sets[0], tokens, v)
    for s in sets[1:]:  # every set's cache holds written rows before a gather reads it
        fill_cache(s)
    rows = []
    for op in ("write", "gather"):
        timings = {}
        for impl in ("cuda", "torch"):
            base = {
                "op": op,
                "variant": v.name,
                "rope_dim": v.rope_dim,
                "row_bytes": v.row_bytes,
                "tokens": tokens,
                "impl": impl,
                "scale_format": SCALE_FORMAT,
                "bytes": op_bytes(op, tokens, v),
                "input_sets": len(sets),
                "copy_gbps": copy_gbps,
                "check_passed": errors[op] is None if impl == "cuda" else torch_exact[op],
                "error": errors[op] if impl == "cuda" else None,
            }
            if impl == "cuda" and errors[op] is not None:
                rows.append(base)
                continue
            # The reference synchronises with the host (no graph) and is slow: fewer samples.
            t = timing.time_gpu(
                calls_for(op, impl, sets, tokens, v),
                budget_s=budget_s,
                min_samples=10 if impl == "cuda" else 5,
                use_graph=impl == "cuda",
            )
            timings[impl] = t.median_ms
            gbps = base["bytes"] / (t.median_ms * 1e-3) / 1e9
            rows.append({**base, **t.as_row(), "gbps": gbps, "pct_copy": 100 * gbps / copy_gbps})
        for r in rows:
            if r["op"] == op and r["impl"] == "cuda" and {"cuda", "torch"} <= set(timings):
                r["speedup"] = timings["torch"] / timings["cuda"]
    return rows


def fill_cache(s: InputSet) -> None:
    """Write a set's rows with the kernel (the same code path was checked on set 0)."""
    from nopebench.cache_kernels import write_cache_unchecked

    write_cache_unchecked(s.cache, s.kv_c, s.k_pe, s.slot_mapping, SCALE_FORMAT)


# ---------------------------------------------------------------- the command


def run_bench(
    tokens: tuple[int, ...], budget_s: float, progress: Callable[[str], None] | None = None
) -> tuple[list[dict], dict]:
    from nopebench.bench.timing import measure_ceilings
    from nopebench.environment import gpu_info

    ceilings = measure_ceilings()
    l2 = gpu_info().get("l2_bytes")
    rows: list[dict] = []
    for t in tokens:
        for v in VARIANTS:
            if progress:
                progress(f"T={t} {v.name}")
            try:
                rows.extend(measure(t, v, budget_s, ceilings.copy_gbps, l2))
            except Exception as exc:  # noqa: BLE001 - a failed size is a row, not a crash
                message = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                rows.extend(
                    {
                        "op": op,
                        "variant": v.name,
                        "rope_dim": v.rope_dim,
                        "row_bytes": v.row_bytes,
                        "tokens": t,
                        "impl": impl,
                        "error": message,
                        "check_passed": False,
                    }
                    for op in ("write", "gather")
                    for impl in ("cuda", "torch")
                )
            finally:
                torch.cuda.empty_cache()
    return rows, summarize(rows, ceilings.as_row())


def summarize(rows: list[dict], ceilings: dict) -> dict:
    cuda = [r for r in rows if r["impl"] == "cuda"]
    at_target = [r for r in cuda if r["tokens"] >= TARGET_MIN_TOKENS]
    targets = {
        f"{r['op']}/{r['variant']}/T{r['tokens']}": bool(
            r.get("pct_copy", 0) >= TARGET_PCT_COPY and r.get("speedup", 0) >= TARGET_SPEEDUP
        )
        for r in at_target
    }
    return {
        **ceilings,
        "checks_passed": all(r.get("check_passed") and not r.get("error") for r in cuda),
        "errors": sum(bool(r.get("error")) for r in rows),
        "targets": {
            "min_tokens": TARGET_MIN_TOKENS,
            "pct_copy": TARGET_PCT_COPY,
            "speedup": TARGET_SPEEDUP,
        },
        "targets_met": targets,
        "all_targets_met": bool(targets) and all(targets.values()),
    }
