import sys, re
from nopebench import geometry as g
from nopebench.impls.native import build as b, cluster, hopper_wide_decode as wide
from nopebench.impls.native.plans import plan_hopper_wide
import triton; print(triton.__version__)
for heads, tokens, kw in [(128,512,dict(pair=True, helpers=16, q_regs=0)), (128,64,dict(pair=True, helpers=16, q_regs=0)), (64,512,dict(helpers=16,q_regs=0)), (128,512,{})]:
    plan = plan_hopper_wide(tokens, heads, 2176, **kw)
    rb = g.row_bytes_read(0)
    c, o = wide.launch_constants(plan, rb)
    comp, _, regs, stack = b._compile(wide.hopper_wide_decode_kernel, c, o)
    if plan.pair:
        offs = wide.pair_offsets(cluster.smem_offsets(comp, wide.PAIR_ALLOCATIONS))
        c, o = wide.launch_constants(plan, rb, offs)
        comp, _, regs, stack = b._compile(wide.hopper_wide_decode_kernel, c, o)
    print(heads, tokens, kw, f"pair={plan.pair} h={plan.helpers} q={plan.q_regs} P={c['P_REGS']} R={c['R_REGS']} stack={stack} shared={comp.metadata.shared}", flush=True)
