"""Two CTAs of a cluster sharing each block's rows, for the 64-head kernel at 128 heads.

At 128 heads the two head blocks of a query token read the same rows, and each program would
gather and dequantize all of them. Launched as a cluster of two CTAs (the two head blocks), each
CTA dequantizes half of every block into its own tile and then copies those rows into its
partner's tile, over the cluster's shared-memory network (distributed shared memory): each does
half the producer's work.

Triton's Gluon on the H200 (3.6) has no operations on another CTA's shared memory, so the few
that are needed are inline PTX here:
- `_cluster_sync`: a barrier across both CTAs (every thread of both); it also publishes the
  mbarrier initialisations to the partner;
- `_partner_window` and `_send_partner`: where the partner's shared memory lies in the
  cluster's window (`mapa`), and bulk copies from this CTA's shared memory into it
  (`cp.async.bulk`, one thread issuing them) that complete their bytes on one of the partner's
  mbarriers;
- `_arrive_partner`: an arrive on one of the partner's mbarriers.
They address shared memory by byte offset from the CTA's shared window (`global_smem`, where
Triton places every allocation). The offsets Triton gives the kernel's allocations come from its
own allocation pass, replayed here on the compiled kernel (`smem_offsets`) and checked against
the compiled kernel's total. The copies move whole 128-byte rows of a tile's 64-lane halves,
which Triton's 128-byte swizzle keeps together (a CPU test checks that against Triton's own
layout).

The kernel is compiled as for one CTA (program ids stay per CTA, so the pair is ranks
pid % 2); `launch_in_pairs` makes Triton's launcher start it in clusters of two.
"""

from __future__ import annotations

import re

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# A barrier across the calling partition's warps (a named barrier inside a warp-specialised
# partition): `thread_barrier` in Triton 3.6, `barrier` from 3.7 on.
_partition_barrier = getattr(gl, "barrier", None) or gl.thread_barrier

# Each inline statement runs once per thread: the tensors passed hold one element a thread.
_SYNC = gl.constexpr("""
fence.mbarrier_init.release.cluster;
barrier.cluster.arrive.release.aligned;
barrier.cluster.wait.acquire.aligned;
mov.u32 $0, 0;
""")
_ARRIVE = gl.constexpr("""{
.reg .pred p;
.reg .b32 b, rb;
setp.eq.u32 p, $1, 0;
mov.u32 b, global_smem;
add.u32 b, b, $2;
mapa.shared::cluster.u32 rb, b, $3;
@p mbarrier.arrive.release.cluster.shared::cluster.b64 _, [rb];
mov.u32 $0, 0;
}""")


@gluon.jit
def _lanes(WARPS: gl.constexpr):
    """Each thread's index in its partition: one element a thread, so the inline PTX below runs
    once per thread."""
    return gl.arange(0, 32 * WARPS, layout=gl.BlockedLayout([1], [32], [WARPS], [0]))


@gluon.jit
def _cluster_sync(WARPS: gl.constexpr):
    """Every thread of both CTAs: at the start, after the mbarriers are initialised (before any
    is touched from the partner), and at the end (no CTA leaves while its partner may still
    copy from or arrive into it). Each partition of both CTAs calls it once at each."""
    lanes = _lanes(WARPS)
    gl.inline_asm_elementwise(_SYNC, "=r,r", [lanes], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _arrive_partner(lanes, bar, partner):
    """The partition's first thread arrives (release, cluster scope) on CTA `partner`'s mbarrier
    at byte offset `bar`."""
    zero = lanes * 0
    gl.inline_asm_elementwise(
        _ARRIVE,
        "=r,r,r,r",
        [lanes, zero + bar, zero + partner],
        dtype=gl.int32,
        is_pure=False,
        pack=1,
    )


def _replay_allocation(ttgir: str, capability: int) -> str:
    """The compiled kernel's TTGIR after Triton's shared-memory allocation: the passes its
    backend runs before allocating (make_llir's first steps), replayed on a parsed copy."""
    import tempfile

    from triton._C.libtriton import ir, nvidia, passes
    from triton.backends.nvidia.compiler import get_ptx_version_from_options

    ctx = ir.context()
    ir.load_dialects(ctx)
    nvidia.load_dialects(ctx)
    with tempfile.NamedTemporaryFile("w", suffix=".ttgir") as f:
        f.write(ttgir)
        f.flush()
        mod = ir.parse_mlir_module(f.name, ctx)
    mod.context = ctx
    pm = ir.pass_manager(ctx)
    passes.ttgpuir.add_combine_tensor_select_and_if(pm)
    try:
        passes.ttgpuir.add_allocate_warp_groups(pm)
    except TypeError:  # newer Triton: a second argument (the concurrency sanitizer, off)
        passes.ttgpuir.add_allocate_warp_groups(pm, False)
    passes.convert.add_scf_to_cf(pm)
    passes.gluon.add_inliner(pm)

    class _Options:
        ptx_version = None

    ptx = get_ptx_version_from_options(_Options(), capability)
    nvidia.passes.ttgpuir.add_allocate_shared_memory_nv(pm, capability, ptx)
    pm.run(mod, "nopebench_smem_offsets")
    return str(mod)


_ALLOC = re.compile(r"%(\w+?)(?:_\d+)? = ttg\.local_alloc \{allocation\.offset = (\d+) : i32\}")
_TOTAL = re.compile(r'"?ttg\.shared"? = (\d+) : i32')


def smem_offsets(compiled, names: tuple[str, ...]) -> dict[str, list[int]]:
    """Byte offsets of the shared allocations of a compiled kernel that Gluon variables of these
    names hold, each name's in the kernel's order (a helper returning four buffers gives four).
    RuntimeError if a name is missing or the replayed allocation's total is not the compiled
    kernel's."""
    text = _replay_allocation(compiled.asm["ttgir"], 90)
    found: dict[str, list[int]] = {}
    for name, offset in _ALLOC.findall(text):
        found.setdefault(name, []).append(int(offset))
    total = _TOTAL.search(text)
    if total is None or int(total.group(1)) != compiled.metadata.shared:
        raise RuntimeError(
            "replaying Triton's shared-memory allocation gave another layout than the compiled "
            f"kernel's ({total.group(1) if total else 'no total'} bytes against "
            f"{compiled.metadata.shared}); this Triton cannot run the 2-CTA kernel"
        )
    missing = [n for n in names if n not in found]
    if missing:
        raise RuntimeError(f"no shared allocation named {missing} in the compiled kernel")
    return {n: found[n] for n in names}


def launch_in_pairs(compiled) -> None:
    """Make Triton's launcher start this compiled kernel in clusters of two CTAs (it launches
    grid x 2 CTAs). Pass half the programs as the grid."""
    num_warps, _, shared = compiled.packed_metadata
    compiled.packed_metadata = (num_warps, 2, shared)


_WINDOW = gl.constexpr("""{
.reg .b32 a;
mov.u32 a, global_smem;
mapa.shared::cluster.u32 $0, a, $1;
}""")
# Eight bulk copies (the async proxy's, issued by the partition's first thread) of $5 bytes
# each, from this CTA's shared memory at byte offset $2 to the same offset in the partner's
# (window $3), each completing its bytes on the partner's mbarrier at cluster address $4; the
# offsets go up by $6, then by $7, in turn.
_COPY = (
    "@p cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes"
    " [d], [s], $5, [$4];\n"
)
_NEXT = "add.u32 s, s, {0};\nadd.u32 d, d, {0};\n"
_SEND = gl.constexpr(
    "{\n.reg .pred p;\n.reg .b32 s, d;\nsetp.eq.u32 p, $1, 0;\n"
    "mov.u32 s, global_smem;\nadd.u32 s, s, $2;\nadd.u32 d, $3, $2;\n"
    + _COPY
    + "".join(_NEXT.format("$6" if k % 2 == 0 else "$7") + _COPY for k in range(7))
    + "mov.u32 $0, 0;\n}"
)


@gluon.jit
def _partner_window(partner):
    """The address of CTA `partner`'s shared memory in the cluster's window (where its byte
    offset 0 is), in `partner`'s shape and layout: each CTA's shared memory is one contiguous
    range there, so its byte offset o is at this + o."""
    return gl.inline_asm_elementwise(
        _WINDOW, "=r,r", [partner], dtype=gl.int32, is_pure=True, pack=1
    )


@gluon.jit
def _send_partner(
    lanes, offset, window, bar, SIZE: gl.constexpr, STEP: gl.constexpr, HALF: gl.constexpr
):
    """The partition's first thread copies SIZE bytes at each of the eight byte offsets
    `offset` + t * STEP + h * HALF (t = 0..3, h = 0, 1) of this CTA's shared memory to the same
    offsets in the partner's (`window`, `_partner_window`), completing them on the partner's
    mbarrier at cluster-window address `bar`. The copies read through the async proxy: every
    thread that stored those bytes fences (`fence_async_shared`) and the partition passes a
    barrier before this."""
    zero = lanes * 0
    gl.inline_asm_elementwise(
        _SEND,
        "=r,r,r,r,r,r,r,r",
        [
            lanes,
            zero + offset,
            zero + window,
            zero + bar,
            zero + SIZE,
            zero + HALF,
            zero + (STEP - HALF),
        ],
        dtype=gl.int32,
        is_pure=False,
        pack=1,
    )
