"""Compile the 128 x 512 pair and the 64 x 512 plan; count barriers and shuffles in the PTX."""
import re, sys
from nopebench import geometry as g
from nopebench.impls.native import build as b, cluster, hopper_wide_decode as wide
from nopebench.impls.native.plans import plan_hopper_wide
for heads in (128, 64):
    plan = plan_hopper_wide(512, heads, 2176)
    rb = g.row_bytes_read(0)
    c, o = wide.launch_constants(plan, rb)
    comp, _, regs, stack = b._compile(wide.hopper_wide_decode_kernel, c, o)
    if plan.pair:
        offs = wide.pair_offsets(cluster.smem_offsets(comp, wide.PAIR_ALLOCATIONS))
        c, o = wide.launch_constants(plan, rb, offs)
        comp, _, regs, stack = b._compile(wide.hopper_wide_decode_kernel, c, o)
    ptx = comp.asm["ptx"]
    open(f"/tmp/ptx{heads}{sys.argv[1]}.ptx", "w").write(ptx)
    print(heads, "stack", stack, "bar.sync", len(re.findall(r"bar\.sync|barrier\.sync", ptx)), "shfl", len(re.findall(r"shfl", ptx)), "st.shared", len(re.findall(r"st\.shared", ptx)))
