"""Counts the SASS of the longest loop holding an opcode (the producer's block loop):
    python loop.py FILE.sass OPCODE [v]   (v: also print the loop)"""
import re, sys, collections
out = open(sys.argv[1]).read()
ins = []
for l in out.splitlines():
    m = re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)(.*);', l)
    if m: ins.append((int(m.group(1), 16), m.group(3), m.group(4), l.strip()))
key = sys.argv[2]  # opcode prefix that identifies the loop
best = None
for a, op, args, _ in ins:
    if op.startswith('BRA'):
        m = re.search(r'0x([0-9a-f]+)', args)
        if m and int(m.group(1), 16) < a:
            t = int(m.group(1), 16); seg = [x for x in ins if t <= x[0] <= a]
            c = collections.Counter(o.split('.')[0] for _, o, _, _ in seg)
            if any(o.startswith(key) for _, o, _, _ in seg) and c['HGMMA'] == 0 and (best is None or len(seg) > best[0]):
                best = (len(seg), c, seg)
n, c, seg = best
print("loop instructions", n); print(dict(sorted(c.items())))
if len(sys.argv) > 3:
    for x in seg: print(x[3][:140])
