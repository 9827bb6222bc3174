"""Digest of the PTX of every SM90 decode kernel shape the build compiles, without a GPU.

A refactor of the kernels' Python (constants, helpers, formatting) should leave the PTX the
same; run this before and after and compare the lines. Debug lines (.loc, .file, the debug
sections, and the $L__tmp labels that only those sections refer to: they mark where inlined
helpers begin and end, so moving code into a helper adds some) are left out, since they name
source lines.

    python3 tools/ptx_digest.py > before.txt
    (edit the kernels)
    python3 tools/ptx_digest.py | diff before.txt -
"""

from __future__ import annotations

import hashlib
import re

from nopebench.impls.native import build

DEBUG = re.compile(r"^\s*(\.loc|\.file)\b|^\s*//|^\$L__tmp\d+:$")


def main() -> None:
    digests: list[str] = []
    compile_one = build._compile

    def recording(kernel, constants, options):
        compiled = compile_one(kernel, constants, options)
        ptx = compiled[0].asm["ptx"]
        body = ptx.split(".section\t.debug", 1)[0]
        kept = "\n".join(line for line in body.splitlines() if not DEBUG.match(line))
        key = ",".join(f"{k}={v}" for k, v in sorted(constants.items()))
        digests.append(
            f"{kernel.fn.__name__} {key} {hashlib.sha256(kept.encode()).hexdigest()[:16]}"
        )
        return compiled

    build._compile = recording
    build.build_hopper()
    print("\n".join(digests))


if __name__ == "__main__":
    main()
