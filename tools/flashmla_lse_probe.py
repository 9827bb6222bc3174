"""FlashMLA's LSE on a GPU: the layout it returns and its error against the reference under
both readings ([1, heads, T] and [1, T, heads]), on the GPU tests' problems (a developer tool).

    PYTHONPATH=$PWD:/tmp/site:$PWD/.flashmla python3 tools/flashmla_lse_probe.py

Prints one line per shape and writes flashmla_lse_probe.json to $OUT (or the current folder).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import torch

from nopebench.checks.pagetable import build_problem, model_case
from nopebench.config import load_model_config
from nopebench.impls import flashmla
from nopebench.impls.reference import sparse_decode_reference

SHAPES = [(16, 16), (64, 16), (128, 16), (16, 64), (100, 128), (128, 128), (64, 64), (16, 128)]
SHAPES += [(64, 200)]


def main() -> None:
    cfg = load_model_config("glm53-flash")
    raw = {}
    read_lse = flashmla._lse_per_token

    def keep_raw(lse, tokens, padded, heads):
        raw["lse"] = lse
        return read_lse(lse, tokens, padded, heads)

    flashmla._lse_per_token = keep_raw
    rows = []
    for heads, tokens in SHAPES:
        for rope in (0, 64):
            case = dataclasses.replace(
                model_case(cfg, tokens, 0, rope_dim=rope),
                heads=heads,
                row_bytes=656 if rope else 528,
                real_rope=bool(rope),
                topk_width=256,
                active=200,
            )
            p = build_problem(case, torch.device("cuda"))
            got = flashmla.flashmla_prepare(p)()
            torch.cuda.synchronize()
            _, ref_lse = sparse_decode_reference(p.q, p.cache, p.indices, p.softmax_scale, rope)
            lse, valid = raw["lse"], ~(p.indices < 0).all(dim=1)
            padded = flashmla.padded_heads(heads)

            heads_major = lse[0, :heads].transpose(0, 1) if lse.shape[1] == padded else None
            tokens_major = lse[0, :, :heads] if lse.shape[1] == tokens else None

            def err(view, valid=valid, ref=ref_lse):
                return None if view is None else float((view[valid] - ref[valid]).abs().max())

            rows.append(
                dict(
                    heads=heads,
                    tokens=tokens,
                    rope=rope,
                    shape=list(lse.shape),
                    stride=list(lse.stride()),
                    err_heads_major=err(heads_major),
                    err_tokens_major=err(tokens_major),
                    err_adapter=err(got.lse),
                )
            )
            print(rows[-1], flush=True)
    out = Path(os.environ.get("OUT", ".")) / "flashmla_lse_probe.json"
    out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
