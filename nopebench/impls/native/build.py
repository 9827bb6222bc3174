"""Compile-only build of the SM90 decode kernels, no GPU needed.

Triton compiles the Gluon sources (`hopper_decode.py`, `hopper_ws_decode.py`,
`hopper_wide_decode.py`) for sm_90 in every shape `plan_hopper`, `plan_hopper_ws` and
`plan_hopper_wide` launch, and ptxas's resource use is read back with the
cuobjdump that ships with Triton. A shape passes when it uses wgmma, spills nothing, and needs no
more shared memory than the planner assumed (the planner's model is what keeps launches inside
the 227 KB an SM90 block may have).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nopebench import environment
from nopebench import geometry as g
from nopebench.geometry import ROPE_DIM
from nopebench.impls.native.constants import HOPPER_SMEM
from nopebench.impls.native.plans import (
    hopper_smem_bytes,
    plan_hopper_wide,
    plan_hopper_ws,
    score_warps_m,
    wide_smem_bytes,
    ws_smem_bytes,
)

# (heads per program, rows per block, ring slots, RoPE lanes): every shape plan_hopper emits.
PLAN_SHAPES = (
    (16, 128, 1, False),
    (16, 64, 2, False),
    (16, 64, 2, True),
    (32, 64, 2, False),
    (32, 64, 2, True),
    (64, 64, 2, False),
)
# The warp-specialised kernel: (heads, query tokens, role split, RoPE lanes) of each shape
# plan_hopper_ws emits (None: its default; at 32 heads the role split from 256 tokens where this
# Triton takes it, one consumer below), and its one-consumer form at 16 heads, which tuning
# compares; each for NoPE rows and for the rows with RoPE lanes (the shim's), whose plans differ.
WS_PLAN_CASES = tuple(
    (heads, tokens, split, rope)
    for rope in (False, True)
    for heads, tokens, split in (
        (16, 512, None),
        (32, 512, None),
        (32, 128, None),
        (16, 512, False),
    )
)
# The 64-head kernel: (heads, query tokens, RoPE lanes) of plans without splits, at one and two
# head blocks, and one with splits, for both row kinds. (With the split count a runtime value
# rather than a constexpr, Triton 3.9 spills 8 bytes at two head blocks.)
WIDE_PLAN_CASES = tuple(
    (heads, tokens, rope)
    for rope in (False, True)
    for heads, tokens in ((64, 512), (128, 512), (64, 8))
)
# Triton 3.6 and 3.7 ask 512 bytes more shared memory of the single-role kernel than 3.8 and 3.9;
# its model covers the larger figure, so a build with 3.8 or later adds the difference.
TRITON_36_EXTRA_SHARED = 512


def older_triton_extra(version: str | None) -> int:
    """Shared bytes a Triton before 3.8 would take beyond what `version` reports (an unknown
    version counts as a recent one: the stricter check)."""
    if version is None:
        return TRITON_36_EXTRA_SHARED
    return TRITON_36_EXTRA_SHARED if environment.version_numbers(version, 2) >= (3, 8) else 0


@dataclass(frozen=True)
class KernelBuild:
    block_h: int
    block_n: int
    stages: int
    rope: bool
    seconds: float
    has_wgmma: bool
    shared_bytes: int
    planned_bytes: int
    registers: int | None  # None: no cuobjdump to read them with
    stack_bytes: int | None
    kernel: str = "hopper"
    role_split: bool = False
    splits: int = 1  # of the top-k range, where a shape is built for a split plan
    head_blocks: int = 1  # programs per query token and split, where a shape is built for more

    @property
    def shape(self) -> str:
        name = (
            "warp-specialised (scorer + accumulator), "
            if self.role_split
            else "warp-specialised, "
            if self.kernel == "hopper_ws"
            else "64-head (split output), "
            if self.kernel == "hopper_wide"
            else ""
        )
        splits = f", {self.splits} splits" if self.splits > 1 else ""
        blocks = f", {self.head_blocks} head blocks" if self.head_blocks > 1 else ""
        rope = ", RoPE" if self.rope else ""
        shape = f"{self.block_h} heads x {self.block_n} rows, {self.stages} slot(s)"
        return f"{name}{shape}{rope}{blocks}{splits}"

    @property
    def problems(self) -> list[str]:
        found = []
        if not self.has_wgmma:
            found.append("no wgmma")
        if self.stack_bytes:
            found.append(f"{self.stack_bytes} B spilled")
        # The single-role kernel's model is exact for Triton 3.6 and 3.7; the warp-specialised
        # models' margins cover every version.
        triton = environment.package_version("triton")
        extra = older_triton_extra(triton) if self.kernel == "hopper" else 0
        if self.shared_bytes + extra > self.planned_bytes:
            found.append(f"{self.shared_bytes} B shared > planned {self.planned_bytes - extra}")
        if self.planned_bytes > HOPPER_SMEM:
            found.append("planned over the SM90 limit")
        return found


def gluon_missing() -> str | None:
    """Why the kernel cannot be compiled here, or None."""
    try:
        from triton.experimental.gluon._runtime import GluonASTSource  # noqa: F401

        from nopebench.impls.native import hopper_decode  # noqa: F401
    except ImportError as exc:
        return f"needs a Triton with Gluon ({exc})"
    return None


_SCALARS = {
    "heads",
    "width",
    "entries_per_split",
    "tokens",
    "stride_qt",
    "stride_qh",
    "stride_it",
    "stride_ot",
    "stride_oh",
    "stride_os",
    "stride_lt",
    "stride_ls",
}
_POINTERS = {
    "q_ptr": "*bf16",
    "cache_ptr": "*u8",
    "idx_ptr": "*i32",
    "out_ptr": "*fp32",
    "lse_ptr": "*fp32",
}


def _compile(
    kernel, constants: dict, options: dict
) -> tuple[object, float, int | None, int | None]:
    """Compile one Gluon kernel for sm_90 as the launcher calls it in the planned shapes: 16-byte
    aligned pointers and strides that are multiples of 16 elements, which Triton's launcher
    specialises on (without that hint q's loads are not vectorised and Triton 3.9 spills)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    signature = {
        n: _POINTERS.get(n)
        or ("i32" if n in _SCALARS else "fp32" if n == "qk_scale_log2" else "constexpr")
        for n in kernel.arg_names
    }
    aligned = {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(kernel.arg_names)
        if name in _POINTERS or name.startswith("stride_")
    }
    start = time.perf_counter()
    compiled = triton.compile(
        GluonASTSource(kernel, signature, constants, aligned),
        target=GPUTarget("cuda", 90, 32),
        options=options,
    )
    registers, stack = _resource_usage(Path(triton.__file__).parent, compiled.asm["cubin"])
    return compiled, time.perf_counter() - start, registers, stack


def compile_shape(block_h: int, block_n: int, stages: int, rope: bool) -> KernelBuild:
    """The single-role kernel in one shape."""
    from nopebench.impls.native import hopper_decode

    constants = dict(
        BLOCK_H=block_h,
        BLOCK_N=block_n,
        ROW_BYTES=g.row_bytes_read(ROPE_DIM if rope else 0),
        ROPE=rope,
        HEAD_BLOCKS=1,
        NUM_STAGES=stages,
        S_WARPS_M=score_warps_m(block_n),
    )
    compiled, seconds, registers, stack = _compile(
        hopper_decode.hopper_decode_kernel, constants, {"num_warps": 8}
    )
    return KernelBuild(
        block_h,
        block_n,
        stages,
        rope,
        seconds,
        "wgmma.mma_async" in compiled.asm["ptx"],
        int(compiled.metadata.shared),
        hopper_smem_bytes(block_h, stages, rope, block_n),
        registers,
        stack,
    )


def compile_ws_shape(
    heads: int, tokens: int, role_split: bool | None = None, rope: bool = False
) -> KernelBuild:
    """The warp-specialised kernel as `plan_hopper_ws` launches it for `heads` x `tokens`."""
    from nopebench.impls.native import hopper_ws_decode as ws

    plan = plan_hopper_ws(tokens, heads, 2176, role_split=role_split, rope=rope)
    constants, options = ws.launch_constants(plan, g.row_bytes_read(ROPE_DIM if rope else 0))
    compiled, seconds, registers, stack = _compile(ws.hopper_ws_decode_kernel, constants, options)
    return KernelBuild(
        plan.block_h,
        plan.block_n,
        plan.num_stages,
        rope,
        seconds,
        "wgmma.mma_async" in compiled.asm["ptx"],
        int(compiled.metadata.shared),
        ws_smem_bytes(plan.block_h, plan.num_stages, plan.block_n, plan.role_split, rope),
        registers,
        stack,
        kernel="hopper_ws",
        role_split=plan.role_split,
    )


def compile_wide_shape(heads: int, tokens: int, rope: bool = False) -> KernelBuild:
    """The 64-head kernel as `plan_hopper_wide` launches it for `heads` x `tokens`."""
    from nopebench.impls.native import hopper_wide_decode as wide

    plan = plan_hopper_wide(tokens, heads, 2176, rope=rope)
    row_bytes = g.row_bytes_read(ROPE_DIM if rope else 0)
    constants, options = wide.launch_constants(plan, row_bytes)
    compiled, seconds, registers, stack = _compile(
        wide.hopper_wide_decode_kernel, constants, options
    )
    if plan.pair:  # as the launcher does: the partner's offsets from this build, then the kernel
        from nopebench.impls.native import cluster

        offsets = wide.pair_offsets(cluster.smem_offsets(compiled, wide.PAIR_ALLOCATIONS))
        constants, options = wide.launch_constants(plan, row_bytes, offsets)
        compiled, more, registers, stack = _compile(
            wide.hopper_wide_decode_kernel, constants, options
        )
        seconds += more
    return KernelBuild(
        plan.block_h,
        plan.block_n,
        plan.num_stages,
        rope,
        seconds,
        "wgmma.mma_async" in compiled.asm["ptx"],
        int(compiled.metadata.shared),
        wide_smem_bytes(plan.num_stages, rope, plan.kv_bufs, plan.p_bufs),
        registers,
        stack,
        kernel="hopper_wide",
        splits=plan.splits,
        head_blocks=plan.head_blocks,
    )


def _resource_usage(triton_dir: Path, cubin: bytes) -> tuple[int | None, int | None]:
    cuobjdump = triton_dir / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not cuobjdump.exists():
        return None, None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        usage = subprocess.run(
            [str(cuobjdump), "--dump-resource-usage", str(path)], capture_output=True, text=True
        )
    found = re.search(r"REG:(\d+) STACK:(\d+)", usage.stdout)
    return (int(found.group(1)), int(found.group(2))) if found else (None, None)


def build_hopper(on_done: Callable[[], None] | None = None) -> list[KernelBuild]:
    jobs = [lambda shape=shape: compile_shape(*shape) for shape in PLAN_SHAPES]
    jobs += [lambda case=case: compile_ws_shape(*case) for case in WS_PLAN_CASES]
    jobs += [lambda case=case: compile_wide_shape(*case) for case in WIDE_PLAN_CASES]
    builds = []
    for job in jobs:
        builds.append(job())
        if on_done:
            on_done()
    return builds


BUILD_COUNT = len(PLAN_SHAPES) + len(WS_PLAN_CASES) + len(WIDE_PLAN_CASES)
