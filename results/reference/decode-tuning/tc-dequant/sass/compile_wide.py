"""Compile the 64-head kernel as planned, with or without tc_dequant; print SASS op counts of the producer-relevant ops and spills."""
import sys, subprocess, tempfile, re, collections, dataclasses
from pathlib import Path
import triton
from nopebench import geometry as g
from nopebench.geometry import ROPE_DIM
from nopebench.impls.native import hopper_wide_decode as wide, build, cluster
from nopebench.impls.native.plans import plan_hopper_wide
heads, tokens, width, rope, tc = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "rope", sys.argv[5] == "tc"
extra = dict(kw.split("=") for kw in sys.argv[6:])
extra = {k: int(v) for k, v in extra.items()}
plan = plan_hopper_wide(tokens, heads, width, rope=rope, tc_dequant=tc, **extra)
c, o = wide.launch_constants(plan, g.row_bytes_read(ROPE_DIM if rope else 0))
comp, secs, regs, stack = build._compile(wide.hopper_wide_decode_kernel, c, o)
tool = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
with tempfile.TemporaryDirectory() as t:
    p = Path(t) / "k.cubin"; p.write_bytes(comp.asm["cubin"])
    out = subprocess.run([str(tool), "-sass", str(p)], capture_output=True, text=True).stdout
tag = f"/tmp/wide_h{heads}_t{tokens}_{'rope' if rope else 'nope'}_{'tc' if tc else 'base'}"
Path(tag + ".sass").write_text(out); Path(tag + ".ptx").write_text(comp.asm["ptx"])
ops = collections.Counter(re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", out, re.M))
spill = "local" if re.search(r"\b(STL|LDL)\b", out) else "no local"
print(plan.pair, plan.helpers, plan.pv_split, "regs", regs, "stack", stack, spill, f"{secs:.0f}s", "total instr", sum(ops.values()))
print({k: v for k, v in sorted(ops.items()) if any(x in k for x in ("GMMA", "STS", "LDS", "F2FP", "FMUL", "BAR", "LDGSTS", "HADD2", "STL", "LDL"))})
