"""Compile-only build of the SM90 decode kernel, no GPU needed.

Triton compiles the Gluon source (`hopper_decode.py`) for sm_90 in every shape `plan_hopper`
launches, and ptxas's resource use is read back with the cuobjdump that ships with Triton. A
shape passes when it uses wgmma, spills nothing, and needs no more shared memory than the
planner assumed (the planner's model is what keeps launches inside the 227 KB an SM90 block
may have).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nopebench.decode.native import HOPPER_SMEM, hopper_smem_bytes, score_warps_m

# (heads per program, rows per block, ring slots, RoPE lanes): every shape plan_hopper emits.
PLAN_SHAPES = ((16, 128, 1, False), (16, 64, 2, False), (16, 64, 2, True), (32, 64, 2, False), (32, 64, 2, True),
               (64, 64, 2, False))
# Triton 3.6 (on the H200) asks 512 bytes more shared memory than the 3.9 this compiles with.
TRITON_36_EXTRA_SHARED = 512


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

    @property
    def shape(self) -> str:
        return f"{self.block_h} heads x {self.block_n} rows, {self.stages} slot(s){', RoPE' if self.rope else ''}"

    @property
    def problems(self) -> list[str]:
        found = []
        if not self.has_wgmma:
            found.append("no wgmma")
        if self.stack_bytes:
            found.append(f"{self.stack_bytes} B spilled")
        if self.shared_bytes + TRITON_36_EXTRA_SHARED > self.planned_bytes:
            found.append(f"{self.shared_bytes} B shared > planned {self.planned_bytes - TRITON_36_EXTRA_SHARED}")
        if self.planned_bytes > HOPPER_SMEM:
            found.append("planned over the SM90 limit")
        return found


def gluon_missing() -> str | None:
    """Why the kernel cannot be compiled here, or None."""
    try:
        from triton.experimental.gluon._runtime import GluonASTSource  # noqa: F401

        from nopebench.decode import hopper_decode  # noqa: F401
    except ImportError as exc:
        return f"needs a Triton with Gluon ({exc})"
    return None


def compile_shape(block_h: int, block_n: int, stages: int, rope: bool) -> KernelBuild:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from nopebench.decode import hopper_decode

    kernel = hopper_decode.hopper_decode_kernel
    scalars = {"heads", "width", "entries_per_split", "stride_qt", "stride_qh", "stride_it", "stride_ot", "stride_oh",
               "stride_os", "stride_lt", "stride_ls"}
    pointers = {"q_ptr": "*bf16", "cache_ptr": "*u8", "idx_ptr": "*i32", "out_ptr": "*fp32", "lse_ptr": "*fp32"}
    signature = {n: pointers.get(n) or ("i32" if n in scalars else "fp32" if n == "qk_scale_log2" else "constexpr")
                 for n in kernel.arg_names}
    constants = dict(BLOCK_H=block_h, BLOCK_N=block_n, ROW_BYTES=656 if rope else 528, ROPE=rope, HEAD_BLOCKS=1,
                     NUM_STAGES=stages, S_WARPS_M=score_warps_m(block_n))
    aligned = {(i,): [["tt.divisibility", 16]] for i in range(len(pointers))}  # the launcher's 16-byte pointers
    start = time.perf_counter()
    compiled = triton.compile(GluonASTSource(kernel, signature, constants, aligned),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
    registers, stack = _resource_usage(Path(triton.__file__).parent, compiled.asm["cubin"])
    return KernelBuild(block_h, block_n, stages, rope, time.perf_counter() - start,
                       "wgmma.mma_async" in compiled.asm["ptx"], int(compiled.metadata.shared),
                       hopper_smem_bytes(block_h, stages, rope, block_n), registers, stack)


def _resource_usage(triton_dir: Path, cubin: bytes) -> tuple[int | None, int | None]:
    cuobjdump = triton_dir / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not cuobjdump.exists():
        return None, None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        usage = subprocess.run([str(cuobjdump), "--dump-resource-usage", str(path)], capture_output=True, text=True)
    found = re.search(r"REG:(\d+) STACK:(\d+)", usage.stdout)
    return (int(found.group(1)), int(found.group(2))) if found else (None, None)


def build_hopper(on_done: Callable[[], None] | None = None) -> list[KernelBuild]:
    builds = []
    for shape in PLAN_SHAPES:
        builds.append(compile_shape(*shape))
        if on_done:
            on_done()
    return builds
