"""The native Triton decode kernel: launch plans (pure), its logic on CPU through Triton's
interpreter, and on a GPU against the reference with the strict element rule."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from native_cases import SCALE, assert_matches_reference, decode_inputs

from nopebench.compare import close
from nopebench.impls.native import build as hopper_build
from nopebench.impls.native.adapter import use_hopper_wide, use_hopper_ws
from nopebench.impls.native.constants import (
    HOPPER_SMEM,
    REG_BLOCK_H,
    REG_INDEX_CAP,
    WIDE_BLOCK_H,
    WIDE_ROPE_SLOTS,
    WS_SPLIT_32_MIN_TOKENS,
)
from nopebench.impls.native.plans import (
    hopper_smem_bytes,
    plan_hopper,
    plan_hopper_wide,
    plan_hopper_ws,
    plan_launch,
    plan_register,
    register_fills,
    wide_q_reg_tiles,
    wide_smem_bytes,
    ws_smem_bytes,
)
from nopebench.impls.native.register_library import register_missing
from nopebench.impls.reference import sparse_decode_reference


@pytest.mark.parametrize("heads", [1, 16, 20, 32, 64, 100, 128])
@pytest.mark.parametrize("tokens", [1, 8, 64, 512])
@pytest.mark.parametrize("width", [64, 2048, 2176, 2200])
@pytest.mark.parametrize(
    "planner",
    [
        "triton",
        "hopper-nope",
        "hopper-rope",
        "hopper-ws",
        "hopper-ws-rope",
        "hopper-wide",
        "hopper-wide-rope",
        "register",
        "register-rope",
    ],
)
def test_plan_covers_every_entry_and_head_exactly_once(heads, tokens, width, planner):
    rope = planner.endswith("-rope")
    if planner.startswith("register"):
        if heads % REG_BLOCK_H:
            with pytest.raises(ValueError, match="blocks of 16"):
                plan_register(heads, width, rope=rope)
            return
        plan = plan_register(heads, width, rope=rope)
        assert plan.block_h == REG_BLOCK_H and plan.entries_per_split <= REG_INDEX_CAP
    elif planner == "triton":
        plan = plan_launch(tokens, heads, width, sms=132)
    elif planner.startswith("hopper-wide"):
        plan = plan_hopper_wide(tokens, heads, width, sms=132, rope=rope)
        assert wide_smem_bytes(plan.num_stages, rope) <= HOPPER_SMEM
        assert plan.block_h == WIDE_BLOCK_H and plan.rope == rope
    elif planner.startswith("hopper-ws"):
        plan = plan_hopper_ws(tokens, heads, width, sms=132, rope=rope)
        smem = ws_smem_bytes(plan.block_h, plan.num_stages, role_split=plan.role_split, rope=rope)
        assert smem <= HOPPER_SMEM and plan.rope == rope
        assert plan.block_h <= 32 and plan.role_split == (plan.block_h == 16)
    else:
        plan = plan_hopper(tokens, heads, width, rope, sms=132)
        assert hopper_smem_bytes(plan.block_h, plan.num_stages, rope) <= HOPPER_SMEM
    assert plan.block_h * plan.head_blocks >= heads > plan.block_h * (plan.head_blocks - 1)
    assert plan.entries_per_split % plan.block_n == 0
    assert (
        (plan.splits - 1) * plan.entries_per_split < width <= plan.splits * plan.entries_per_split
    )
    assert plan.block_h <= 64 and plan.block_h >= 16


def test_plan_splits_only_when_programs_are_few():
    for plan in (plan_launch, lambda t, h, w, s: plan_hopper(t, h, w, False, s)):
        assert plan(512, 64, 2176, 132).splits == 1
        assert plan(1, 16, 2176, 132).splits > 16
        assert plan(512, 128, 2176, 132).head_blocks == 2
    for plan in (plan_hopper_ws, plan_hopper_wide):
        assert plan(512, 64, 2176, 132).splits == 1
        assert plan(1, 16, 2176, 132).splits > 16
    assert plan_hopper_ws(512, 128, 2176, 132).head_blocks == 4  # 32 heads per program at most
    assert plan_hopper_wide(512, 128, 2176, 132).head_blocks == 2  # 64, always


def test_single_role_plan_takes_the_most_heads_that_still_fill_the_sms():
    """H200, results/reference/decode-tuning/hopper/few-programs-scan.csv: with few query tokens
    the most heads per program that shared memory holds while (token, head block) programs cut
    into one-block splits still cover the 132 SMs, and no split from half the SMs on. The split
    count keeps the programs within one wave (decode-tuning/few-tokens/tune.csv)."""

    def shape(tokens, heads, rope=False):
        plan = plan_hopper(tokens, heads, 2176, rope, sms=132)
        return plan.block_h, plan.splits

    assert shape(8, 64) == (64, 12)  # 96 programs: 0.025 ms; 17 splits (136 programs) 0.036
    assert shape(8, 128) == (64, 7)  # 112 programs: 0.035; 9 splits (144 programs) 0.045
    assert shape(8, 64, rope=True) == (32, 7)  # 64 heads with RoPE lanes do not fit
    assert shape(1, 128) == (32, 17)  # 4 programs x 34 one-block splits cover the SMs; 64 would not
    assert shape(1, 64)[0] == 16 and shape(1, 16)[0] == 16  # nothing larger can fill the SMs
    assert shape(64, 64) == (64, 2)  # 64 programs: split in 2, 0.088; in 3 (192 programs) 0.119
    # 128 programs: 0.157 against 0.172 split in 2
    assert shape(128, 64) == (64, 1) and shape(64, 128) == (64, 1)
    assert shape(64, 64, rope=True) == (32, 1)  # 0.134 against 0.143


def test_splits_keep_the_programs_within_one_wave():
    for planner in (
        lambda t, h: plan_hopper(t, h, 2176, False, 132),
        lambda t, h: plan_hopper_ws(t, h, 2176, 132),
        lambda t, h: plan_hopper_wide(t, h, 2176, 132),
    ):
        for tokens in (2, 8, 16, 64):
            for heads in (16, 32, 64, 128):
                plan = planner(tokens, heads)
                if plan.kernel == "hopper_ws" and plan.block_h > heads:
                    continue
                assert tokens * plan.programs <= 132 or plan.splits == 1, (tokens, heads, plan)


def test_register_kernel_is_planned_where_its_ctas_fill_their_waves():
    """16 heads, one split, the last wave of 2 CTAs an SM at least three quarters full: the H200
    sweep (results/reference/decode-tuning/register/) had it faster at 200-264, 400-528, 700
    and 1024 tokens, NoPE slower at 128, 300, 350 and 360."""
    for tokens in (200, 212, 256, 264, 400, 512, 528, 700, 1024):
        assert register_fills(tokens, 16, 2176, 132) and register_fills(tokens, 16, 2048, 132)
    for tokens in (0, 1, 8, 64, 128, 300, 350, 360, 550):
        assert not register_fills(tokens, 16, 2176, 132)
    assert not register_fills(512, 32, 2176, 132) and not register_fills(512, 8, 2176, 132)
    assert not register_fills(512, 16, REG_INDEX_CAP + 1, 132)  # two splits: not measured
    assert register_fills(396, 16, 2176, 132) and not register_fills(395, 16, 2176, 132)
    plan = plan_register(16, 2176)
    assert (plan.kernel, plan.splits, plan.entries_per_split, plan.head_blocks) == (
        "register",
        1,
        2176,
        1,
    )
    wide = plan_register(32, 5000, splits=2)  # more entries than one split stages: three
    assert (wide.splits, wide.head_blocks) == (3, 2) and wide.entries_per_split <= REG_INDEX_CAP


def _h200(monkeypatch, register: bool):
    """choose_plan as on an H200 (132 SMs, SM90), the register kernel available or not."""
    from types import SimpleNamespace

    from nopebench.impls.native import adapter

    monkeypatch.setattr(adapter, "hopper_available", lambda device: True)
    monkeypatch.setattr(adapter, "register_available", lambda device: register)
    monkeypatch.setattr(
        adapter.torch.cuda,
        "get_device_properties",
        lambda device: SimpleNamespace(multi_processor_count=132),
    )
    return adapter


def test_register_kernel_takes_its_shapes_for_nope_and_shim_or_leaves_them(monkeypatch):
    adapter = _h200(monkeypatch, register=True)
    for rope in (0, 64):
        plan = adapter.choose_plan(512, 16, 2176, rope, "cuda")
        assert (plan.kernel, plan.rope) == ("register", bool(rope))
        assert adapter.choose_plan(128, 16, 2176, rope, "cuda").kernel == "hopper_ws"
        assert adapter.choose_plan(512, 32, 2176, rope, "cuda").kernel == "hopper_ws"
    adapter = _h200(monkeypatch, register=False)  # no nvcc: the Gluon kernel's plan
    assert adapter.choose_plan(512, 16, 2176, 0, "cuda").kernel == "hopper_ws"


def test_register_kernel_unavailable_is_said_once(monkeypatch, capsys):
    from nopebench.impls.native import adapter, register_library

    monkeypatch.setattr(register_library, "register_missing", lambda device: "nvcc not found")
    monkeypatch.setattr(adapter.torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(adapter, "_REGISTER_WARNED", set())
    assert not adapter.register_available("cuda") and not adapter.register_available("cuda:0")
    err = capsys.readouterr().err
    assert err.count("nvcc not found") == 1 and "Gluon kernels run its shapes" in err


def test_register_operands_the_kernel_cannot_take_are_one_line_errors():
    from nopebench.impls.native.register_library import check_operands

    q, cache, _ = decode_inputs(16, 2, 64, 0, 528, "cpu")
    check_operands(q, cache, 16)  # a strided q (head stride 576) is fine
    with pytest.raises(ValueError, match="blocks of 16"):
        check_operands(q[:, :8], cache, 8)
    odd = torch.zeros(2, 16, 514, dtype=torch.bfloat16)[..., :512]
    with pytest.raises(ValueError, match="8-byte aligned"):
        check_operands(odd, cache, 16)
    with pytest.raises(ValueError, match="contiguous, 16-byte aligned cache"):
        check_operands(q, cache[:, ::2], 16)


def test_warp_specialised_kernel_is_chosen_where_it_was_measured_faster():
    """NoPE with at most 16 heads, or at most 32 heads and 8 tokens or more (H200,
    results/reference/decode-tuning/hopper-ws/tune-ws-split.csv, as planned: 16 heads 0.293 vs
    0.337 ms at 512 tokens, 0.018 vs 0.022 at 8, a tie at 1; 32 heads 0.360 vs 0.497 at 512;
    decode-tuning/few-tokens/tune.csv: 32 heads in one program, one consumer, 0.0166 vs 0.0195
    single-role at 8 tokens, 0.052 vs 0.072 at 64; at 64 heads two blocks of 32 lose, 0.698 vs
    0.596)."""
    assert use_hopper_ws(512, 16) and use_hopper_ws(512, 32) and use_hopper_ws(64, 20)
    assert use_hopper_ws(8, 16) and use_hopper_ws(1, 16) and use_hopper_ws(8, 32)
    assert not use_hopper_ws(512, 64) and not use_hopper_ws(512, 128)
    assert not use_hopper_ws(1, 32) and not use_hopper_ws(1, 20)
    plan = plan_hopper_ws(8, 32, 2176, 132)
    assert (plan.block_h, plan.role_split, plan.splits) == (32, False, 12)


def test_64_head_kernel_is_chosen_where_the_single_role_plan_takes_64_heads():
    """hopper_wide replaces the single-role kernel wherever that one's planner puts 64 heads in a
    program for NoPE rows (the H200 measured it 1.03-1.44x faster there); where fewer heads per
    program fill the SMs (1 query token), the single-role plan stays."""
    for tokens, heads in ((512, 64), (512, 128), (64, 64), (8, 64), (8, 128), (128, 100)):
        assert use_hopper_wide(plan_hopper(tokens, heads, 2176, False, 132)), (tokens, heads)
    assert not use_hopper_wide(
        plan_hopper(1, 64, 2176, False, 132)
    )  # 16 heads per program fill the SMs
    assert not use_hopper_wide(plan_hopper(1, 128, 2176, False, 132))
    assert not use_hopper_wide(plan_hopper(512, 32, 2176, False, 132))


@pytest.mark.parametrize("heads", [1, 16, 20, 32, 64, 100, 128])
@pytest.mark.parametrize("tokens", [1, 8, 64, 512])
@pytest.mark.parametrize("register", [True, False])
def test_nope_and_the_shim_run_in_the_same_kernel_at_every_shape(
    monkeypatch, heads, tokens, register
):
    """The SM90 kernel is chosen by the shape alone, so a NoPE-against-shim ratio compares the
    rows and nothing else; each plan is made for its rows' QK width (shared memory). Recorded
    on CPU with the device queries stood in for an H200's, with and without the register
    kernel."""
    adapter = _h200(monkeypatch, register)
    nope = adapter.choose_plan(tokens, heads, 2176, 0, "cuda")
    shim = adapter.choose_plan(tokens, heads, 2176, 64, "cuda")
    assert shim.kernel == nope.kernel and (nope.rope, shim.rope) == (False, True)
    assert (shim.block_h, shim.head_blocks, shim.role_split) == (
        nope.block_h,
        nope.head_blocks,
        nope.role_split,
    ) or nope.kernel == "hopper"  # the single-role planner takes fewer heads with RoPE lanes


def test_64_head_shared_memory_model_covers_the_compiled_kernel():
    """Shared bytes of the 64-head kernel compiled for sm_90 (Triton 3.6 and 3.9 agree: 231376
    with three ring slots; with RoPE lanes Triton 3.9 takes 226544 with seven slots of 32-row
    blocks); for NoPE rows the planner takes as many slots as the model fits under the limit,
    with RoPE lanes the two that measured faster."""
    assert 0 <= wide_smem_bytes(3) - 231376 <= 1024
    assert plan_hopper_wide(512, 64, 2176).num_stages == 3 and wide_smem_bytes(4) > HOPPER_SMEM
    with pytest.raises(ValueError, match="shared memory"):
        plan_hopper_wide(512, 64, 2176, slots=4)
    # With RoPE lanes two 64-row tiles leave no room for a ring slot: 32-row blocks.
    rope = plan_hopper_wide(512, 64, 2176, rope=True)
    assert (rope.block_n, rope.num_stages, rope.rope) == (32, WIDE_ROPE_SLOTS, True)
    assert plan_hopper_wide(512, 64, 2176, rope=True, slots=7).num_stages == 7
    assert 0 <= wide_smem_bytes(7, rope=True) - 226544 <= 1024
    assert wide_smem_bytes(8, rope=True) > HOPPER_SMEM


def test_64_head_scorer_holds_q_tiles_in_registers_where_measured():
    """q's first latent tiles go to the scorer's registers only under the Triton where that was
    measured faster and spill-free (3.6: one tile for NoPE rows, two with RoPE lanes); under 3.9
    (whose scorer spills with one) and unknown versions q stays in shared memory."""
    assert [wide_q_reg_tiles(rope, "3.6.0") for rope in (False, True)] == [1, 2]
    for version in ("3.9.0", "3.7.1", "3.10.0+git", "", None):
        assert [wide_q_reg_tiles(rope, version) for rope in (False, True)] == [0, 0], version
    assert plan_hopper_wide(512, 64, 2176, q_regs=0).q_regs == 0
    assert plan_hopper_wide(512, 64, 2176, rope=True, q_regs=2).q_regs == 2
    with pytest.raises(ValueError, match="0 to 3"):
        plan_hopper_wide(512, 64, 2176, q_regs=4)


def test_64_head_output_warpgroups_split_off_for_pairs_or_when_helpers_are_asked_for():
    """The output halves run in warpgroups of their own (the scorer only scores) for NoPE rows
    in programs of WIDE_PV_SPLIT_MIN_BLOCKS blocks or more where the 2-CTA pair runs, or where
    helper rows are asked for (then WIDE_HELP_ROWS by default). Unpaired programs keep the
    scorer's left half (measured faster on the H200), as RoPE rows and few-block programs do.
    The launch gives a fourth warpgroup its share of the register file."""
    from nopebench.impls.native import hopper_wide_decode as wide
    from nopebench.impls.native.constants import WIDE_HELP_ROWS, WIDE_PV_SPLIT_MIN_BLOCKS

    nope, shim = plan_hopper_wide(512, 64, 2176), plan_hopper_wide(512, 64, 2176, rope=True)
    assert (nope.pv_split, nope.helpers) == (False, 0)
    assert (shim.pv_split, shim.helpers) == (False, 0)
    for tokens, heads in ((8, 64), (8, 128), (64, 64), (64, 128), (512, 128)):
        plan = plan_hopper_wide(tokens, heads, 2176)
        blocks = plan.entries_per_split // plan.block_n
        paired = plan.head_blocks == 2 and plan.splits == 1
        assert plan.pv_split == (paired and blocks >= WIDE_PV_SPLIT_MIN_BLOCKS), (tokens, heads)
        assert plan.pair == plan.pv_split, (tokens, heads)
    assert not plan_hopper_wide(8, 64, 2176).pv_split
    assert plan_hopper_wide(512, 64, 2176, pv_split=False).helpers == 0
    assert plan_hopper_wide(512, 64, 2176, helpers=0).pv_split
    helped = plan_hopper_wide(512, 64, 2176, pv_split=True)
    assert (helped.pv_split, helped.helpers) == (True, WIDE_HELP_ROWS)
    assert plan_hopper_wide(512, 64, 2176, helpers=8) == helped
    constants, options = wide.launch_constants(helped, 528)
    assert (constants["PV_SPLIT"], constants["HELPERS"]) == (True, WIDE_HELP_ROWS)
    assert options["maxnreg"] == wide.launch_regs(True) == 128
    assert wide.launch_constants(shim, 656)[1]["maxnreg"] == wide.LAUNCH_REGS == 168
    # The register split: scorer, two output halves and the producer share 512 a thread.
    regs = 4 * options["maxnreg"] - 2 * constants["R_REGS"] - constants["P_REGS"]
    assert regs >= 96 + 8 * (nope.q_regs > 0)
    for bad, match in (
        (dict(helpers=24), "0, 8 or 16"),
        (dict(pv_split=False, helpers=8), "pv_split only"),
        (dict(rope=True, pv_split=True, helpers=8), "NoPE rows"),
    ):
        with pytest.raises(ValueError, match=match):
            plan_hopper_wide(512, 64, 2176, **bad)


def record_launches(
    monkeypatch, module, kernel: str, heads: int, tokens: int, plan, rope: int = 0
) -> list:
    """native_decode on CPU tensors with stand-ins for the Gluon kernel `module.kernel` and the
    splits' combine kernel: each launch as (grid, args, kwargs). `rope`: 64 for shim rows."""
    from nopebench.impls.native import triton_decode
    from nopebench.impls.native.adapter import native_decode

    calls = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: calls.append((grid, args, kwargs))

    monkeypatch.setattr(module, kernel, Recorder())
    monkeypatch.setattr(triton_decode, "combine_kernel", Recorder())
    q, cache, idx = decode_inputs(
        heads, tokens, 2176, rope, 656 if rope else 528, "cpu", rows=4096, shim=bool(rope)
    )
    native_decode(q, cache, idx, SCALE, rope, plan)
    return calls


def test_64_head_launch_is_what_the_build_compiles(monkeypatch):
    """Like the warp-specialised launch: a 1-D grid of (token, head block, split) items, the
    token count after the shared arguments, and the constexprs the compile-only build checks."""
    if (reason := hopper_build.gluon_missing()) is not None:
        pytest.skip(reason)
    from nopebench.impls.native import hopper_wide_decode as wide
    from nopebench.impls.native.adapter import native_decode

    plan = plan_hopper_wide(8, 128, 2176, sms=132)
    (grid, args, kwargs), (combine_grid, _, _) = record_launches(
        monkeypatch, wide, "hopper_wide_decode_kernel", 128, 8, plan
    )
    assert plan.splits > 1 and combine_grid == (8 * 128,)
    constants, options = wide.launch_constants(plan, 528)
    assert grid == (8 * 2 * plan.splits,) and args[-1] == 8 and kwargs == {**constants, **options}
    assert kwargs["HEAD_BLOCKS"] == 2 and kwargs["BLOCKS"] * plan.block_n == plan.entries_per_split
    assert not kwargs["ROPE"]
    with pytest.raises(ValueError, match="is for NoPE rows"):  # its shared memory has no RoPE
        native_decode(
            *decode_inputs(64, 8, 2176, 64, 656, "cpu", rows=4096),
            SCALE,
            64,
            plan_hopper_wide(8, 64, 2176),
        )


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="on a GPU the kernel itself runs in the GPU tests"
)
@pytest.mark.parametrize("case", hopper_build.WIDE_PLAN_CASES)
def test_64_head_kernel_compiles_for_sm90_within_its_budget(case):
    """Compile-only, no GPU: the 64-head kernel as plan_hopper_wide launches it uses wgmma,
    spills nothing under its register split, and fits the planner's shared memory."""
    if (reason := hopper_build.gluon_missing()) is not None:
        pytest.skip(reason)
    from nopebench.impls.native import hopper_wide_decode as wide
    from nopebench.impls.native.constants import WIDE_RING_ROWS

    assert WIDE_RING_ROWS == 4 * wide.PRODUCER_WARPS
    # The two cases compile both forms of the producer's work-item arithmetic: constexpr with
    # one split, run-time divisions with more.
    plan = plan_hopper_wide(case[1], case[0], 2176)
    assert wide.launch_constants(plan, 528)[0]["ONE_SPLIT"] == (plan.splits == 1)
    build = hopper_build.compile_wide_shape(*case)
    assert build.kernel == "hopper_wide" and build.has_wgmma
    assert build.problems == [], build.problems


def test_128_heads_run_as_2cta_pairs_where_the_plan_allows():
    """NoPE rows at two head blocks in one split with the output split off: the head blocks of
    a token run as a 2-CTA cluster, in WIDE_PAIR_SLOTS ring slots, without helper rows (measured
    faster on the H200). Elsewhere, or when helpers are asked for, the plan stays unpaired; a
    pair it cannot run is a ValueError."""
    from nopebench.impls.native.constants import WIDE_PAIR_SLOTS

    for tokens, heads in ((64, 128), (512, 128), (200, 100)):
        plan = plan_hopper_wide(tokens, heads, 2176, 132)
        assert (plan.pair, plan.num_stages, plan.helpers) == (True, WIDE_PAIR_SLOTS, 0)
        assert plan.grid(tokens) == (2 * tokens,)  # head block = program id mod 2
    for tokens, heads, kw in (
        (512, 64, {}),
        (8, 128, {}),  # split: programs of a few blocks keep the scorer's left half
        (512, 128, dict(rope=True)),
        (512, 128, dict(helpers=8)),
        (512, 128, dict(helpers=0)),
        (512, 128, dict(pv_split=False)),
    ):
        assert not plan_hopper_wide(tokens, heads, 2176, 132, **kw).pair, (tokens, heads, kw)
    assert plan_hopper_wide(512, 128, 2176, 132, pair=True, slots=3).num_stages == 3
    for tokens, heads, kw in (
        (512, 64, {}),
        (8, 128, {}),
        (512, 128, dict(rope=True)),
        (512, 128, dict(helpers=8)),
        (512, 128, dict(pv_split=False)),
    ):
        with pytest.raises(ValueError, match="2-CTA pairs"):
            plan_hopper_wide(tokens, heads, 2176, 132, pair=True, **kw)


def test_plan_description_names_kernel_form_and_shape():
    """Result rows name the native kernel a cell ran: its form, then heads and rows a block,
    head blocks and splits where there are several."""
    assert plan_register(16, 2176).describe() == (
        "register kernel (CUDA C++, mma.sync): 16 heads x 32 rows a block"
    )
    assert plan_register(32, 4096).describe().endswith("2 head blocks, 2 splits")
    assert plan_hopper_wide(512, 128, 2176, 132).describe() == (
        "64-head Gluon (wgmma), output halves apart from the scorer, 2-CTA pairs: "
        "64 heads x 64 rows a block, 2 head blocks"
    )
    split = plan_hopper_wide(8, 64, 2176, 132)
    assert split.splits > 1
    assert split.describe() == (
        f"64-head Gluon (wgmma): 64 heads x 64 rows a block, {split.splits} splits"
    )
    assert plan_hopper_wide(512, 64, 2176, 132, rope=True).describe().endswith("x 32 rows a block")
    persistent = plan_hopper_ws(8, 16, 2176, 132)
    assert "persistent, at most 132 programs" in persistent.describe()
    assert plan_launch(4, 16, 256, 132).describe().startswith("portable Triton: 16 heads")


def test_2cta_launch_asks_triton_for_clusters_of_two():
    """The pair kernel is compiled for one CTA; its launch metadata then asks Triton's launcher
    for clusters of two (which launches grid x 2 CTAs), keeping warps and shared memory."""
    from nopebench.impls.native import cluster

    class Compiled:
        packed_metadata = (4, 1, 231368)

    compiled = Compiled()
    cluster.launch_in_pairs(compiled)
    assert compiled.packed_metadata == (4, 2, 231368)
    cluster.launch_in_pairs(compiled)  # again: unchanged
    assert compiled.packed_metadata == (4, 2, 231368)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="on a GPU the kernel itself runs in the GPU tests"
)
def test_2cta_kernel_finds_its_partner_offsets_in_the_compiled_allocation():
    """Compile-only: the replayed allocation of the pair kernel gives the compiled kernel's total
    and the four tiles equally spaced (each [2, 64, 128] bf16), the barriers 8-byte aligned; the
    kernel built with them copies rows into the partner (bulk copies between the CTAs' shared
    memories) and joins the cluster barrier."""
    if (reason := hopper_build.gluon_missing()) is not None:
        pytest.skip(reason)
    from nopebench.impls.native import cluster
    from nopebench.impls.native import hopper_wide_decode as wide

    plan = plan_hopper_wide(512, 128, 2176, 132)
    constants, options = wide.launch_constants(plan, 528)
    assert constants["PAIR"] and constants["KV_OFF"] == 0  # placeholders change no allocation
    compiled, *_ = hopper_build._compile(wide.hopper_wide_decode_kernel, constants, options)
    found = cluster.smem_offsets(compiled, wide.PAIR_ALLOCATIONS)
    offsets = wide.pair_offsets(found)
    assert len(found["kv_bufs"]) == 4 and offsets["KV_STEP"] == 2 * 64 * 128 * 2
    assert offsets["FULL_OFF"] % 8 == 0 and offsets["EMPTY_OFF"] % 8 == 0
    assert offsets["KV_OFF"] + 4 * offsets["KV_STEP"] <= compiled.metadata.shared
    with pytest.raises(RuntimeError, match="no shared allocation named"):
        cluster.smem_offsets(compiled, ("no_such_buffer",))
    with pytest.raises(ValueError, match="equally spaced"):
        wide.pair_offsets({**found, "kv_bufs": [0, 10, 30, 40]})
    build = hopper_build.compile_wide_shape(128, 512)
    assert build.problems == [], build.problems
    constants, options = wide.launch_constants(plan, 528, offsets)
    ptx = hopper_build._compile(wide.hopper_wide_decode_kernel, constants, options)[0].asm["ptx"]
    assert "cp.async.bulk.shared::cluster.shared::cta" in ptx and "barrier.cluster.wait" in ptx


def test_rows_a_pair_sends_are_contiguous_in_tritons_128_byte_swizzle():
    """The 2-CTA producer copies a run of rows of each 64-lane half of a tile as one range of
    bytes: in Triton's own NVMMA shared layout for a [64, 128] bf16 tile (read from its linear
    layout; Triton 3.9 or later, 3.6 asserts on the linear form of a shared layout) row r's
    lanes 64 h .. 64 h + 63 fill bytes h * 64 * 128 + r * 128 onwards, 128 of them, in some
    order (the swizzle permutes 16-byte chunks within the row)."""
    triton = pytest.importorskip("triton")
    if tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 9):
        pytest.skip(f"Triton {triton.__version__} cannot give a shared layout's linear form")
    from triton._C.libtriton import gluon_ir, ir
    from triton.experimental.gluon import language as gl

    ctx = ir.context()
    ir.load_dialects(ctx)
    builder = gluon_ir.GluonOpBuilder(ctx)
    layout = gl.NVMMASharedLayout.get_default_for([64, 128], gl.bfloat16)
    bases = builder.to_linear_layout(layout._to_ir(builder), [64, 128]).offset_bases
    rows = torch.arange(64).view(-1, 1)
    # The element at each offset, from the bases (offset bit k adds bases[k], XOR-combined).
    where = {}
    for offset in range(64 * 128):
        r = c = 0
        for k, (br, bc) in enumerate(bases):
            if offset >> k & 1:
                r, c = r ^ br, c ^ bc
        where[(r, c)] = offset * 2
    theirs = torch.tensor([[where[(r, c)] for c in range(128)] for r in range(64)])
    for h in (0, 1):
        start = h * 64 * 128 + rows * 128  # [64, 1]
        half = theirs[:, 64 * h : 64 * (h + 1)]
        assert bool(((half >= start) & (half < start + 128)).all())
        assert torch.equal(half.sort(dim=1).values, start + 2 * torch.arange(64).view(1, -1))


def test_warp_specialised_shared_memory_model_covers_the_compiled_kernels():
    """Shared bytes of the warp-specialised kernel compiled for sm_90 by Triton 3.6 (the H200's)
    and 3.9, in the shapes plan_hopper_ws emits; the model must cover both, tightly. With RoPE
    lanes (ring, tiles and q 128 bytes a row wider) Triton 3.9's sizes; fewer slots fit."""
    compiled = {
        (16, 2, True, False): (186492, 186492),
        (32, 2, True, False): (207452, 207356),
        (32, 1, True, True): (215004, 214956),
        (32, 3, False, False): (223656, 223416),
        (16, 4, False, False): (219960, 219960),
        (16, 2, True, True): (213164,),
        (32, 1, False, True): (213976,),
        (16, 2, False, True): (212568,),
    }
    for (block_h, slots, split, rope), sizes in compiled.items():
        plan = plan_hopper_ws(512, block_h, 2176, role_split=split, rope=rope)
        assert (plan.block_h, plan.num_stages, plan.role_split) == (block_h, slots, split)
        for nbytes in sizes:
            model = ws_smem_bytes(block_h, slots, role_split=split, rope=rope)
            assert 0 <= model - nbytes <= 1536
    with pytest.raises(ValueError, match="at most 32 heads"):
        plan_hopper_ws(512, 64, 2176, block_h=64)
    with pytest.raises(ValueError, match="shared memory"):
        plan_hopper_ws(512, 16, 2176, slots=6, role_split=False)
    with pytest.raises(ValueError, match="16 or 32 heads per program only"):
        plan_hopper_ws(512, 8, 2176, block_h=8, role_split=True)


def test_32_head_programs_split_their_consumer_from_256_tokens_where_both_rows_fit(monkeypatch):
    """At 32 heads per program the role split from WS_SPLIT_32_MIN_TOKENS tokens on, for NoPE
    rows and the shim alike, under the Triton where both compile spill-free (3.6, with its own
    register budgets); under 3.9 (whose RoPE form spills) and unknown versions one consumer.
    16 heads per program always split, below the threshold 32 never do by default."""
    from nopebench.impls.native import hopper_ws_decode as ws
    from nopebench.impls.native import plans

    assert [plans.ws_split_32_regs(rope, "3.6.0") for rope in (False, True)] == [
        (96, 120),
        (88, 120),
    ]
    for version in ("3.9.0", "3.7.1", "", None):
        assert plans.ws_split_32_regs(False, version) is None, version
    for version, split in (("3.6.0", True), ("3.9.0", False), (None, False)):
        monkeypatch.setattr(plans, "installed_triton", lambda v=version: v)
        monkeypatch.setattr(ws, "installed_triton", lambda v=version: v)
        for rope in (False, True):
            for tokens in (WS_SPLIT_32_MIN_TOKENS, 512, 2048):
                plan = plan_hopper_ws(tokens, 32, 2176, 132, rope=rope)
                assert (plan.role_split, plan.max_programs) == (split, 132 if split else 0)
                assert plan.num_stages == (1 if rope else 2 if split else 3)
            assert not plan_hopper_ws(WS_SPLIT_32_MIN_TOKENS - 1, 32, 2176, rope=rope).role_split
            assert plan_hopper_ws(64, 16, 2176, rope=rope).role_split
        forced = plan_hopper_ws(512, 32, 2176, role_split=True, rope=True)
        constants, _ = ws.launch_constants(forced, 656)
        assert (constants["P_REGS"], constants["S_REGS"]) == ((88, 120) if split else (96, 120))


def test_32_head_programs_keep_their_softmax_sums_per_thread():
    """At WS_PARTIAL_SUM_BLOCK_H heads per program, in both consumer forms and for both row
    kinds, the plan keeps each thread's share of the softmax sums until the item's last block;
    at 16 heads per program it sums every block; an explicit choice wins, and the launch passes
    it to the kernel."""
    from nopebench.impls.native import hopper_ws_decode as ws
    from nopebench.impls.native.constants import WS_PARTIAL_SUM_BLOCK_H

    assert WS_PARTIAL_SUM_BLOCK_H == 32
    for rope in (False, True):
        for tokens in (8, 64, 512):
            for split in (None, True, False):
                at_32 = plan_hopper_ws(tokens, 32, 2176, 132, role_split=split, rope=rope)
                at_16 = plan_hopper_ws(tokens, 16, 2176, 132, role_split=split, rope=rope)
                assert (at_32.block_h, at_32.l_partial) == (32, True)
                assert (at_16.block_h, at_16.l_partial) == (16, False)
        assert not plan_hopper_ws(512, 32, 2176, 132, rope=rope, l_partial=False).l_partial
        assert plan_hopper_ws(512, 16, 2176, 132, rope=rope, l_partial=True).l_partial
    for heads in (16, 32):
        plan = plan_hopper_ws(512, heads, 2176, 132)
        assert ws.launch_constants(plan, 528)[0]["L_PARTIAL"] == (heads == 32)


def test_32_head_role_split_producer_takes_one_split_as_a_constant():
    """The role split's producer at WS_CONST_SPLIT_BLOCK_H heads per program, NoPE rows, one
    split: the split count is the constexpr 1; with RoPE lanes, more splits, 16 heads per
    program or one consumer it stays a run-time value."""
    from nopebench.impls.native import hopper_ws_decode as ws

    def const(tokens, heads, rope=False, split=True):
        plan = plan_hopper_ws(tokens, heads, 2176, 132, role_split=split, rope=rope)
        return ws.launch_constants(plan, 656 if rope else 528)[0]["P_ONE_SPLIT"], plan.splits

    assert const(512, 32) == (True, 1) and const(256, 32) == (True, 1)
    assert const(512, 32, rope=True) == (False, 1)
    assert const(512, 16) == (False, 1)
    assert const(512, 32, split=False) == (False, 1)
    assert const(8, 32)[1] > 1 and not const(8, 32)[0]


@pytest.mark.parametrize(
    "tokens, heads", [(1, 16), (8, 16), (8, 32), (100, 16), (512, 16), (512, 32), (512, 64)]
)
def test_warp_specialised_grid_walks_every_work_item_once(tokens, heads):
    """The kernel's 1-D grid: with the role split one persistent program per SM, each taking
    items pid, pid + programs, ...; with one consumer one program per item. The walk uses the
    kernel's own trip count, cdiv(items - pid, programs)."""
    plan = plan_hopper_ws(tokens, heads, 2176, sms=132)
    (programs,) = plan.grid(tokens)
    items = tokens * plan.head_blocks * plan.splits
    assert programs == (min(items, 132) if plan.role_split else items)
    walked = sorted(
        pid + it * programs
        for pid in range(programs)
        for it in range(-(-(items - pid) // programs))
    )
    assert walked == list(range(items))
    other = plan_hopper(
        tokens, heads, 2176, False, 132
    )  # the other kernels: (token, head block) x split
    assert other.grid(tokens) == (tokens * other.head_blocks, other.splits)


def test_warp_specialised_launch_is_what_the_build_compiles(monkeypatch):
    """The launcher (GPU-only otherwise) hands the kernel its plan's 1-D grid, the token count
    after the shared arguments, and exactly the constexprs and options the compile-only build
    checks; recorded here with a stand-in kernel on CPU tensors."""
    if (reason := hopper_build.gluon_missing()) is not None:
        pytest.skip(reason)
    from nopebench.impls.native import hopper_ws_decode as ws

    plan = plan_hopper_ws(512, 16, 2176, sms=132)
    ((grid, args, kwargs),) = record_launches(
        monkeypatch, ws, "hopper_ws_decode_kernel", 16, 512, plan
    )
    constants, options = ws.launch_constants(plan, 528)
    assert grid == (132,) and args[-1] == 512 and kwargs == {**constants, **options}
    assert kwargs["ROLE_SPLIT"] and kwargs["BLOCKS"] == 2176 // 64 and kwargs["maxnreg"] == 128
    assert not kwargs["ROPE"] and kwargs["ROW_BYTES"] == 528


@pytest.mark.parametrize("kernel", ["hopper_ws", "hopper_wide"])
def test_shim_launch_is_what_the_build_compiles(monkeypatch, kernel):
    """The shim (rope_dim 64, 656-byte rows) launches the same kernel with ROPE set, the 656-byte
    row, and the constexprs of its RoPE plan, which the compile-only build checks."""
    if (reason := hopper_build.gluon_missing()) is not None:
        pytest.skip(reason)
    from nopebench.impls.native import hopper_wide_decode as wide
    from nopebench.impls.native import hopper_ws_decode as ws

    module, heads = (ws, 16) if kernel == "hopper_ws" else (wide, 64)
    planner = plan_hopper_ws if kernel == "hopper_ws" else plan_hopper_wide
    plan = planner(512, heads, 2176, sms=132, rope=True)
    ((grid, args, kwargs),) = record_launches(
        monkeypatch, module, f"{kernel}_decode_kernel", heads, 512, plan, rope=64
    )
    constants, options = module.launch_constants(plan, 656)
    assert grid == plan.grid(512) and args[-1] == 512 and kwargs == {**constants, **options}
    assert kwargs["ROPE"] and kwargs["ROW_BYTES"] == 656 and args[0].shape[-1] == 576
    with pytest.raises(ValueError, match="is for RoPE lanes"):
        record_launches(monkeypatch, module, f"{kernel}_decode_kernel", heads, 512, plan)


def test_hopper_shared_memory_model_covers_the_compiled_kernels():
    """Dynamic shared bytes of the kernels compiled for sm_90 by Triton 3.9 (3.6, on the H200,
    asks 512 more: 232960 for 64 heads with RoPE). The model must cover both, tightly."""
    compiled = {
        (16, 2, False, 64): 152320,
        (16, 3, False, 64): 186368,
        (64, 2, False, 64): 207872,
        (16, 2, True, 64): 170752,
        (64, 2, True, 64): 232448,
        (16, 1, False, 128): 220160,
        (16, 1, True, 128): 238592,
        (32, 2, True, 64): 191488,
    }
    for (block_h, stages, rope, block_n), nbytes in compiled.items():
        assert 0 <= hopper_smem_bytes(block_h, stages, rope, block_n) - (nbytes + 512) <= 256
    assert plan_hopper(512, 64, 2176, True).block_h == 32  # 64 heads with RoPE lanes do not fit
    with pytest.raises(ValueError, match="shared memory"):
        plan_hopper(512, 64, 2176, True, stages=4)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="on a GPU the kernel itself runs in the GPU tests"
)
@pytest.mark.parametrize("case", hopper_build.WS_PLAN_CASES)
def test_warp_specialised_kernel_compiles_for_sm90_within_its_budget(case):
    """Compile-only, no GPU: the warp-specialised kernel as plan_hopper_ws launches it uses wgmma,
    spills nothing under its register split, and fits the shared memory the planner assumed."""
    if (reason := hopper_build.gluon_missing()) is not None:
        pytest.skip(reason)
    from nopebench.impls.native import hopper_ws_decode as ws
    from nopebench.impls.native.constants import WS_RING_ROWS

    assert (
        WS_RING_ROWS == 4 * ws.PRODUCER_WARPS
    )  # the planner's ring slot is one pass of the producer
    build = hopper_build.compile_ws_shape(*case)
    assert build.kernel == "hopper_ws" and build.has_wgmma
    assert build.problems == [], build.problems


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="on a GPU the kernel itself runs in the GPU tests"
)
@pytest.mark.parametrize("shape", hopper_build.PLAN_SHAPES)
def test_hopper_kernel_compiles_for_sm90_within_its_budget(shape):
    """Compile-only, no GPU: Triton builds the Gluon kernel for sm_90 in each shape the planner
    uses, with wgmma, no register spills, and no more shared memory than the planner assumes."""
    if (reason := hopper_build.gluon_missing()) is not None:
        pytest.skip(reason)
    build = hopper_build.compile_shape(*shape)
    assert build.problems == [], build.problems
    assert build.registers is None or build.registers <= 255


def test_hopper_build_flags_spills_missing_wgmma_and_shared_memory_overruns(monkeypatch):
    monkeypatch.setattr(hopper_build.environment, "package_version", lambda name: "3.9.0")
    ok = hopper_build.KernelBuild(16, 128, 1, False, 1.0, True, 220160, 220672, 173, 0)
    assert ok.problems == []
    assert hopper_build.KernelBuild(
        16, 128, 1, False, 1.0, True, 220161, 220672, 173, 0
    ).problems  # over the model
    assert (
        "16 B spilled"
        in hopper_build.KernelBuild(64, 64, 2, False, 1.0, True, 207872, 208384, 255, 16).problems
    )
    assert (
        "no wgmma"
        in hopper_build.KernelBuild(16, 64, 2, False, 1.0, False, 152320, 153088, 128, 0).problems
    )
    # The warp-specialised kernel's model carries its own margin: compiled bytes up to the model
    # pass.
    ws = dict(kernel="hopper_ws")
    assert (
        "scorer + accumulator"
        in hopper_build.KernelBuild(
            16, 64, 2, False, 1.0, True, 1, 2, 128, 0, kernel="hopper_ws", role_split=True
        ).shape
    )
    assert (
        hopper_build.KernelBuild(16, 64, 4, False, 1.0, True, 219136, 219136, 168, 0, **ws).problems
        == []
    )
    over = hopper_build.KernelBuild(
        16, 64, 4, False, 1.0, True, 219137, 219136, 168, 0, **ws
    ).problems
    assert over == ["219137 B shared > planned 219136"]


def test_single_role_shared_memory_model_is_exact_for_triton_36_and_covers_39(monkeypatch):
    """The 64-head single-role shape compiles to 208384 shared bytes with Triton 3.6 and 3.7,
    207872 with 3.8 and 3.9; its model, 208384, must pass both and fail one byte more."""
    planned = hopper_smem_bytes(64, 2, False)
    assert planned == 208384

    def problems(version, shared):
        monkeypatch.setattr(hopper_build.environment, "package_version", lambda name: version)
        build = hopper_build.KernelBuild(64, 64, 2, False, 1.0, True, shared, planned, 255, 0)
        return build.problems

    assert problems("3.6.0", 208384) == [] and problems("3.7.1", 208384) == []
    assert problems("3.9.0", 207872) == [] and problems("3.8.0", 207872) == []
    assert problems("3.6.0", 208385) == ["208385 B shared > planned 208384"]
    assert problems("3.9.0", 207873) == ["207873 B shared > planned 207872"]
    assert problems("3.10.0", 207873)


INTERPRETER_SCRIPT = textwrap.dedent("""
    import json, os, sys
    os.environ["TRITON_INTERPRET"] = "1"
    import dataclasses, torch
    sys.path[:0] = [os.getcwd(), os.path.join(os.getcwd(), "tests")]
    from nopebench.impls.native.adapter import native_decode
    from nopebench.impls.native.plans import plan_launch
    from nopebench.impls.reference import sparse_decode_reference
    from native_cases import decode_inputs
    results = []
    for heads, tokens, width, rope, row_bytes, splits, factored in json.loads(sys.argv[1]):
        q, cache, idx = decode_inputs(heads, tokens, width, rope, row_bytes, "cpu")
        plan = plan_launch(tokens, heads, width, block_n=16, splits=splits)
        plan = dataclasses.replace(plan, factored=factored)
        got = native_decode(q, cache, idx, 0.0625, rope, plan)
        ref, lse = sparse_decode_reference(q, cache, idx, 0.0625, rope)
        err = (got.out.float() - ref.float()).abs()
        finite = torch.isfinite(lse)
        results.append({"max_err": float(err.max()), "ref_max": float(ref.float().abs().max()),
                        "nan": bool(torch.isnan(got.out).any()),
                        "empty_rows_zero": bool((got.out[~finite] == 0).all()),
                        "lse_inf_match": bool(torch.equal(torch.isinf(got.lse), ~finite)),
                        "lse_err": float((got.lse[finite] - lse[finite]).abs().max())})
    print(json.dumps(results))
""")


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="on a GPU the strict GPU grid below runs instead "
    "(Triton 3.6's interpreter, on the H200 image, fails on this kernel's loop bounds)",
)
def test_kernel_logic_in_triton_interpreter(tmp_path):
    """Masking, -1 anywhere, empty rows, head padding, split-K and its combine, RoPE lanes and
    the factored variant, all on CPU. The interpreter truncates bf16 conversions (GPU rounds to
    nearest), so outputs are held to 2% of the largest value and LSE to 0.1 here; the strict rule
    runs on a GPU below. Wrong indexing or masking gives errors of order 1."""
    cases = [
        [16, 3, 96, 0, 528, None, False],
        [20, 3, 80, 0, 656, 2, False],
        [16, 3, 64, 64, 656, 1, False],
        [16, 3, 96, 0, 528, 3, True],
        [32, 2, 64, 64, 656, 2, True],
    ]
    script = tmp_path / "interp.py"
    script.write_text(INTERPRETER_SCRIPT)
    env = {**os.environ, "TRITON_DEFAULT_FP_FUSION": "1"}
    proc = subprocess.run(
        [sys.executable, str(script), json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=os.path.dirname(os.path.dirname(__file__)),
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for case, res in zip(cases, json.loads(proc.stdout.strip().splitlines()[-1]), strict=True):
        assert not res["nan"], case  # poisoned rows are never read
        assert res["empty_rows_zero"] and res["lse_inf_match"], case
        assert res["max_err"] <= 0.02 * res["ref_max"], (case, res)
        assert res["lse_err"] < 0.1, (case, res)


GPU_GRID = [
    (h, t, w, rope, rb)
    for h in (16, 32, 64, 128)
    for t in (1, 8, 64)
    for w in (2048, 2176)
    for rope, rb in ((0, 528), (0, 656), (64, 656))
]


def gpu_plan(kernel: str, tokens: int, heads: int, width: int, rope: int):
    """The launch plan of one of the four kernels (hopper_ws: its planned form, at 16 heads per
    program the role split; hopper_ws_one: one consumer; hopper_wide: 64 heads per program, fewer
    heads masked; hopper_wide_smem_q: the same with all of q in shared memory, as Tritons other
    than the measured one run it; hopper_wide_helpers: NoPE rows with the output halves split off
    and each dequantizing helper rows (the planned form runs them as the scorer's left half,
    beside the producer alone, as for RoPE rows); hopper_ws_split32: the role split at 32
    heads per program, as Triton 3.6's plan runs it from 256 tokens), for the rows' QK width;
    the Hopper ones are skipped off SM90; register: the CUDA C++ kernel, for whole 16-head
    blocks, in as few splits as its staged index entries allow, skipped off SM89+ or without
    nvcc)."""
    from nopebench.impls.native.adapter import hopper_available
    from nopebench.impls.native.plans import plan_hopper

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if kernel == "triton":
        return plan_launch(tokens, heads, width, sms)
    if kernel.startswith("register"):
        if heads % REG_BLOCK_H:
            pytest.skip("the register kernel takes whole 16-head blocks")
        if (why := register_missing()) is not None:
            pytest.skip(why)
        splits = 3 if kernel == "register_split" else None
        return plan_register(heads, width, rope=bool(rope), splits=splits)
    if not hopper_available(0):
        pytest.skip("the Hopper kernels need an SM90 GPU and Triton's Gluon")
    if kernel.startswith("hopper_wide"):
        q_regs = 0 if kernel == "hopper_wide_smem_q" else None
        if kernel == "hopper_wide_helpers" and rope:
            pytest.skip("the output warpgroups split off for NoPE rows only")
        pv_split = True if kernel == "hopper_wide_helpers" else None
        return plan_hopper_wide(
            tokens, heads, width, sms, rope=bool(rope), q_regs=q_regs, pv_split=pv_split
        )
    if kernel == "hopper_ws_split32":
        return plan_hopper_ws(
            tokens, heads, width, sms, block_h=32, role_split=True, rope=bool(rope)
        )
    if kernel.startswith("hopper_ws"):
        return plan_hopper_ws(
            tokens,
            heads,
            width,
            sms,
            role_split=False if kernel == "hopper_ws_one" else None,
            rope=bool(rope),
        )
    return plan_hopper(tokens, heads, width, bool(rope), sms)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "kernel",
    [
        "triton",
        "hopper",
        "hopper_ws",
        "hopper_ws_one",
        "hopper_wide",
        "hopper_wide_smem_q",
        "hopper_wide_helpers",
        "hopper_ws_split32",
        "register",
        "register_split",
    ],
)
@pytest.mark.parametrize("heads, tokens, width, rope, row_bytes", GPU_GRID)
def test_native_matches_reference_on_gpu(heads, tokens, width, rope, row_bytes, kernel):
    from nopebench.impls.native.adapter import native_decode

    q, cache, idx = decode_inputs(
        heads, tokens, width, rope, row_bytes, "cuda", seed=heads * 7 + tokens, rows=4096
    )
    plan = gpu_plan(kernel, tokens, heads, width, rope)
    got = native_decode(q, cache, idx, SCALE, rope, plan)  # kernel first, reference second
    got.out.fill_(float("nan"))
    got = native_decode(q, cache, idx, SCALE, rope, plan)
    assert_matches_reference(got, q, cache, idx, rope)


@pytest.mark.gpu
@pytest.mark.parametrize("heads, tokens", [(128, 64), (100, 64), (128, 200)])
@pytest.mark.parametrize("width", [2048, 2176])
@pytest.mark.parametrize("row_bytes", [528, 656])
def test_2cta_pairs_match_the_reference_on_gpu(heads, tokens, width, row_bytes):
    """The 64-head kernel's two head blocks in 2-CTA clusters, each CTA dequantizing half of
    every block for both: every query token under the strict rule, outputs poisoned first (also
    with the second head block partly masked, 100 heads)."""
    from nopebench.impls.native.adapter import hopper_available, native_decode

    if not hopper_available(0):
        pytest.skip("the Hopper kernels need an SM90 GPU and Triton's Gluon")
    q, cache, idx = decode_inputs(
        heads, tokens, width, 0, row_bytes, "cuda", seed=heads + tokens + width, rows=4096
    )
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    plan = plan_hopper_wide(tokens, heads, width, sms, pair=True)
    got = native_decode(q, cache, idx, SCALE, 0, plan)
    got.out.fill_(float("nan"))
    got = native_decode(q, cache, idx, SCALE, 0, plan)
    assert_matches_reference(got, q, cache, idx, 0)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "kernel", ["hopper_ws", "hopper_ws_one", "hopper_wide", "hopper_ws_split32", "register"]
)
@pytest.mark.parametrize("heads, tokens", [(16, 1), (16, 64), (32, 64), (64, 8), (128, 64)])
def test_shim_runs_the_rope_path_of_the_warp_specialised_kernels(heads, tokens, kernel):
    """The shim (zero RoPE lanes in the 656-byte rows and in q's last 64) through the RoPE path
    of the kernels NoPE runs in, under the strict rule, outputs poisoned before the second run.
    Its RoPE score group adds exact zeros, so where the two plans cut the rows into the same
    blocks (the warp-specialised kernel: only the ring depth differs) the output is NoPE's over
    the same rows bit for bit; the 64-head kernel's 32-row RoPE blocks round P elsewhere."""
    from nopebench.impls.native.adapter import native_decode

    q, cache, idx = decode_inputs(
        heads, tokens, 2176, 64, 656, "cuda", seed=heads + tokens, rows=4096, shim=True
    )
    plan = gpu_plan(kernel, tokens, heads, 2176, 64)
    got = native_decode(q, cache, idx, SCALE, 64, plan)
    got.out.fill_(float("nan"))
    got = native_decode(q, cache, idx, SCALE, 64, plan)
    assert_matches_reference(got, q, cache, idx, 64)
    if kernel != "hopper_wide":
        nope = native_decode(
            q[..., :512], cache, idx, SCALE, 0, gpu_plan(kernel, tokens, heads, 2176, 0)
        )
        assert torch.equal(got.out, nope.out) and torch.equal(got.lse, nope.lse)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["triton", "hopper", "hopper_ws", "hopper_wide", "register"])
@pytest.mark.parametrize("scale_format", ["arbitrary_fp32", "pow2_fp32"])
@pytest.mark.parametrize("magnitude", [1e-3, 1.0])
def test_native_meets_the_rule_for_small_and_unit_latents(kernel, scale_format, magnitude):
    """Both scale formats, and latents of 1e-3 (tile maxima near 3.5e-3) as well as 1. The
    kernels dequantize as the reference does (fp32 product, one bf16 rounding). A variant with
    fp16 tiles failed here at 1e-3 with arbitrary_fp32 scales on the H200 (cosine difference
    7.7e-6, limit 5e-6: fp16 tile scales below 6.1e-5 are subnormal)."""
    from nopebench.impls.native.adapter import native_decode

    heads, tokens = (64, 64) if kernel == "hopper_wide" else (16, 64)
    q, cache, idx = decode_inputs(
        heads,
        tokens,
        2176,
        0,
        528,
        "cuda",
        seed=5,
        rows=8192,
        magnitude=magnitude,
        scale_format=scale_format,
    )
    got = native_decode(q, cache, idx, SCALE, 0, gpu_plan(kernel, tokens, heads, 2176, 0))
    ref, _ = sparse_decode_reference(q, cache, idx, SCALE, 0)
    cmp = close(got.out, ref)
    assert cmp.passed, cmp.detail


# Valid lengths: an empty row, one entry, and lengths on both sides of 64-entry block edges. Not
# a few dozen entries: there the output is an average of so few rows that rounding P to bf16
# (every kernel does, as FlashMLA and FlashInfer do) moves some elements past the element rule;
# on the H200 all four kernels failed it alike at lengths 63-65, and so does the reference
# computed on the CPU with only P rounded to bf16.
TAIL_COUNTS = (0, 1, 700, 1023, 1024, 1025, 2048, 2049, 2051, 2111, 2112, 2113, 2175, 2176)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "kernel",
    [
        "triton",
        "hopper",
        "hopper_ws",
        "hopper_wide",
        "hopper_ws_split32",
        "register",
        "register_split",
    ],
)
@pytest.mark.parametrize("tokens", [8, 64])
def test_native_handles_rows_that_end_in_minus_one_padding(kernel, tokens):
    """Top-k rows of different lengths, each ending in -1 padding (the 64-head kernel skips the
    trailing blocks that hold no valid entry): lengths on both sides of the 64-entry block
    edges, an empty row and a full one, one row also with -1 inside."""
    from nopebench.impls.native.adapter import native_decode

    heads = {"hopper_wide": 64, "hopper_ws_split32": 32}.get(kernel, 16)
    q, cache, idx = decode_inputs(heads, tokens, 2176, 0, 528, "cuda", seed=11, rows=4096)
    for t in range(tokens):
        idx[t, TAIL_COUNTS[t % len(TAIL_COUNTS)] :] = -1
    got = native_decode(q, cache, idx, SCALE, 0, gpu_plan(kernel, tokens, heads, 2176, 0))
    assert_matches_reference(got, q, cache, idx, 0)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "kernel",
    ["triton", "hopper", "hopper_ws", "hopper_ws_one", "hopper_wide", "register", "register_split"],
)
def test_native_replays_in_a_cuda_graph(kernel):
    from nopebench.impls.native.adapter import DecodeBuffers, native_decode

    q, cache, idx = decode_inputs(16, 64, 2176, 0, 528, "cuda", rows=4096)
    plan = gpu_plan(kernel, 64, 16, 2176, 0)
    bufs = DecodeBuffers.allocate(64, 16, plan, "cuda")
    eager = native_decode(q, cache, idx, SCALE, 0, plan, bufs).out.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        native_decode(q, cache, idx, SCALE, 0, plan, bufs)
    bufs.out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(bufs.out, eager)
