"""Compile one planned shape of a warp-specialised kernel for sm_90 (compile only, no GPU), with
or without the change, and print its resources and SASS op counts; the SASS goes to /tmp.
Run from the repository root with tc-dequant.diff applied and Triton 3.6 on PYTHONPATH:
    python compile.py wide|ws HEADS TOKENS WIDTH nope|rope tc|base
`loop.py /tmp/<tag>.sass QGMMA` (or F2FP.F16 for base) then counts the producer's block loop."""

import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton

from nopebench import geometry as g
from nopebench.geometry import ROPE_DIM
from nopebench.impls.native import build
from nopebench.impls.native import hopper_wide_decode as wide
from nopebench.impls.native import hopper_ws_decode as ws
from nopebench.impls.native.plans import plan_hopper_wide, plan_hopper_ws

kind, heads, tokens, width = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rope, tc = sys.argv[5] == "rope", sys.argv[6] == "tc"
planner, module = (plan_hopper_wide, wide) if kind == "wide" else (plan_hopper_ws, ws)
kernel = wide.hopper_wide_decode_kernel if kind == "wide" else ws.hopper_ws_decode_kernel
plan = planner(tokens, heads, width, rope=rope, tc_dequant=tc)
constants, options = module.launch_constants(plan, g.row_bytes_read(ROPE_DIM if rope else 0))
compiled, secs, regs, stack = build._compile(kernel, constants, options)
tool = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
with tempfile.TemporaryDirectory() as t:
    cubin = Path(t) / "k.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    sass = subprocess.run([str(tool), "-sass", str(cubin)], capture_output=True, text=True).stdout
tag = f"/tmp/{kind}_h{heads}_t{tokens}_{'rope' if rope else 'nope'}_{'tc' if tc else 'base'}"
Path(tag + ".sass").write_text(sass)
ops = collections.Counter(
    re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", sass, re.M)
)
spills = "spills" if re.search(r"\b(STL|LDL)\b", sass) else "no spills"
print(plan, f"registers {regs}, stack {stack}, {spills}, {sum(ops.values())} instructions")
