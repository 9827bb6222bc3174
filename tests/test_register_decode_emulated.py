"""The register decode kernel's own source (`impls/native/cuda/register_decode.cuh`) run on the
CPU by its emulator (threads as coroutines switched at every warp intrinsic and barrier, cp.async
copies landing only when waited for into NaN-poisoned shared memory, mma.sync and movmatrix from
their documented fragment layouts), through the ctypes binding, against the reference with the
strict rule. This is what catches a wrong fragment index, ring slot, head block or split on a
machine without a GPU; the hardware's arithmetic and timing are left to the GPU tests."""

from __future__ import annotations

import ctypes

import pytest
import torch
from native_cases import assert_matches_reference, decode_inputs, run_register

from nopebench import cuda_build as b
from nopebench import geometry as g
from nopebench import rowformat
from nopebench.impls.native import register_library
from nopebench.impls.native.constants import REG_BLOCK_N
from nopebench.impls.native.plans import plan_register
from nopebench.impls.native.register_library import LOG2E, REGISTER_LIBRARY, SIGNATURES

pytestmark = pytest.mark.skipif(b.emulator_missing() is not None, reason=str(b.emulator_missing()))


@pytest.fixture(scope="module")
def emulated_lib(tmp_path_factory) -> ctypes.CDLL:
    out = tmp_path_factory.mktemp("emulator") / "libnopedecode_emulated.so"
    lib = b.declare(ctypes.CDLL(str(b.compile_emulator(REGISTER_LIBRARY, out))), SIGNATURES)
    assert lib.nopedecode_abi_version() == register_library.ABI_VERSION
    return register_library.check_library(lib)  # struct size, index capacity, shapes


@pytest.fixture
def emulated(emulated_lib, monkeypatch):
    """The binding launches the emulated kernel on CPU tensors; its own checks still run."""
    monkeypatch.setattr(register_library, "load_library", lambda device: emulated_lib)
    return emulated_lib


# One 16-head block a token, and two (the grid's z).
HEADS = [16, 32]
ROWS = [(0, 528), (0, 656), (64, 656)]  # NoPE, NoPE on 656-byte rows, RoPE lanes


@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("rope, row_bytes", ROWS)
@pytest.mark.parametrize("splits", [1, 3])
def test_register_kernel_matches_the_reference_emulated(emulated, heads, rope, row_bytes, splits):
    """Three tokens (an empty row, -1 entries scattered through another), 10 blocks of keys: the
    ring wraps at both depths; with three splits each stages its own entries, the last a short
    one."""
    q, cache, idx = decode_inputs(
        heads, 3, 300, rope, row_bytes, "cpu", seed=heads + rope, rows=512
    )
    plan = plan_register(heads, 300, rope=bool(rope), splits=splits)
    assert plan.splits == splits
    assert_matches_reference(run_register(q, cache, idx, rope, plan), q, cache, idx, rope)


def reference_max_moves(q, cache, idx, block_n: int = REG_BLOCK_N, tau: float = 8.0) -> int:
    """How often the kernel's shared reference max moves after a row's first block: a block
    whose max score passes it by 2^tau (log2 units) in any head moves it to the running max."""
    from native_cases import SCALE

    latent, pe = rowformat.dequantize_rows(cache.reshape(-1, cache.shape[-1]))
    keys = torch.cat([latent, pe], -1) if q.shape[-1] > g.LATENT_DIM else latent
    moves = 0
    for t in range(q.shape[0]):
        valid = idx[t][idx[t] >= 0].long()
        if valid.numel() <= block_n:
            continue
        s = (q[t].float() @ keys[valid].float().T) * (SCALE * LOG2E)  # [heads, keys], log2 units
        m = s[:, :block_n].amax(1)
        for start in range(block_n, s.shape[1], block_n):
            block = s[:, start : start + block_n].amax(1)
            if bool((block > m + tau).any()):
                moves += 1
                m = torch.maximum(m, block)
    return moves


@pytest.mark.parametrize("heads", HEADS)
def test_the_reference_max_moves_for_every_warp_emulated(emulated, heads):
    """Two rows of growing score planted late in two tokens' rows (one head's q, scaled): the
    rare move of the shared reference max (every warp rescales O and l, P rewritten) runs after
    the first block; a -1 tail ends the rows."""
    q, cache, idx = decode_inputs(heads, 3, 240, 64, 656, "cpu", seed=7, rows=256)
    for t in (0, 2):
        valid = (idx[t] >= 0).nonzero().flatten()
        for at, gain in ((0.4, 1.0), (0.8, 2.0)):
            slot = idx[t, valid[int(at * len(valid))]].reshape(1)
            head = q[t, t % heads]
            latent = (head[: g.LATENT_DIM].float() * gain).to(torch.bfloat16)
            rowformat.write_cache(
                cache, latent[None], head[None, g.LATENT_DIM :], slot, "arbitrary_fp32"
            )
    assert reference_max_moves(q, cache, idx) >= 3
    plan = plan_register(heads, 240, rope=True)
    assert_matches_reference(run_register(q, cache, idx, 64, plan), q, cache, idx, 64)


def test_a_shim_row_scores_as_its_nope_row_emulated(emulated):
    """Zero RoPE lanes in q and rows: the 576-wide kernel gives the 512-wide kernel's output."""
    q, cache, idx = decode_inputs(32, 2, 96, 64, 656, "cpu", seed=3, shim=True)
    plan = plan_register(32, 96)
    shim = run_register(q, cache, idx, 64, plan)
    nope = run_register(q[..., : g.LATENT_DIM], cache, idx, 0, plan)
    assert torch.equal(shim.out, nope.out) and torch.equal(shim.lse, nope.lse)
