import sys, subprocess, tempfile, re, collections
from pathlib import Path
import triton
from nopebench import geometry as g
from nopebench.geometry import ROPE_DIM
from nopebench.impls.native import hopper_ws_decode as ws, build
from nopebench.impls.native.plans import plan_hopper_ws
heads, tokens, width, rope, tc = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "rope", sys.argv[5] == "tc"
plan = plan_hopper_ws(tokens, heads, width, rope=rope, tc_dequant=tc)
c, o = ws.launch_constants(plan, g.row_bytes_read(ROPE_DIM if rope else 0))
comp, secs, regs, stack = build._compile(ws.hopper_ws_decode_kernel, c, o)
tool = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
with tempfile.TemporaryDirectory() as t:
    p = Path(t) / "k.cubin"; p.write_bytes(comp.asm["cubin"])
    out = subprocess.run([str(tool), "-sass", str(p)], capture_output=True, text=True).stdout
tag = f"/tmp/ws_h{heads}_t{tokens}_{'rope' if rope else 'nope'}_{'tc' if tc else 'base'}"
Path(tag + ".sass").write_text(out); Path(tag + ".ptx").write_text(comp.asm["ptx"])
ops = collections.Counter(re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", out, re.M))
spill = "local" if re.search(r"\b(STL|LDL)\b", out) else "no local"
print(plan.role_split, plan.block_h, plan.num_stages, "regs", regs, "stack", stack, spill, "total instr", sum(ops.values()))
