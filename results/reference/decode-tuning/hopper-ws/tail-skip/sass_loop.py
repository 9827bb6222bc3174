import subprocess, tempfile, re, collections
from pathlib import Path
import triton
from nopebench import geometry as g
from nopebench.impls.native import hopper_ws_decode as ws, build
from nopebench.impls.native.plans import plan_hopper_ws
def prod_loop(out):
    ins=[]
    for l in out.splitlines():
        m=re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)(.*);',l)
        if m: ins.append((int(m.group(1),16),m.group(3).split('.')[0],m.group(4)))
    best=None
    for a,op,args in ins:
        if op=='BRA':
            m=re.search(r'0x([0-9a-f]+)',args)
            if m and int(m.group(1),16)<a:
                t=int(m.group(1),16); seg=[x for x in ins if t<=x[0]<=a]
                c=collections.Counter(o for _,o,_ in seg)
                if c['F2FP']>=128 and c['HGMMA']==0 and (best is None or len(seg)<best[0]):
                    best=(len(seg),c)
    return best
# Prints the producer block loop's SASS size and per-opcode change, plan against tail_skip.
for h, t in ((16, 512), (32, 512), (32, 64)):
    r=[]
    for kw in (dict(), dict(tail_skip=True)):
        plan = plan_hopper_ws(t, h, 2176, **kw)
        c, o = ws.launch_constants(plan, g.row_bytes_read(0))
        comp, *_ = build._compile(ws.hopper_ws_decode_kernel, c, o)
        tool = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "k.cubin"; p.write_bytes(comp.asm["cubin"])
            out = subprocess.run([str(tool), "-sass", str(p)], capture_output=True, text=True).stdout
        r.append(prod_loop(out))
    (na,ca),(nb,cb)=r
    diff={k:cb[k]-ca[k] for k in set(ca)|set(cb) if cb[k]!=ca[k]}
    print(h,t,na,'->',nb,diff)
