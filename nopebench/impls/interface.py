"""What every sparse decode implementation receives and returns.

An implementation is an adapter: `prepare(problem)` does all host-side work (format
conversion, FlashInfer's plan(), workspace allocation) and returns a closure that launches the
decode and returns its output. The closure does no host synchronisation where the
implementation allows it, so timing can capture it in a CUDA graph.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from nopebench import environment
from nopebench import geometry as g
from nopebench.compare import ABS_TOL, COS_DIFF_TOL, REL_TOL


@dataclass(frozen=True)
class DecodeProblem:
    """One decode step, all tensors on one device.

    q: [T, H, 512 + rope_dim] bf16. For the zero-padded shim, rope_dim is 64 and q's last 64
       lanes are zero.
    cache: [num_blocks, block_size, row_bytes] uint8 packed fp8_ds_mla rows.
    indices: [T, W] int32 physical slots, -1 padded (W is the top-k buffer width).
    """

    q: torch.Tensor
    cache: torch.Tensor
    indices: torch.Tensor
    softmax_scale: float
    rope_dim: int
    kv_scale_format: str = "arbitrary_fp32"

    @property
    def tokens(self) -> int:
        return self.q.shape[0]

    @property
    def heads(self) -> int:
        return self.q.shape[1]

    @property
    def width(self) -> int:
        return self.indices.shape[1]

    @property
    def qk_dim(self) -> int:
        return g.qk_dim(self.rope_dim)


@dataclass(frozen=True)
class DecodeOutput:
    out: torch.Tensor  # [T, H, 512] bf16
    lse: torch.Tensor | None = None  # [T, H] fp32, natural log; None if the implementation has none


DecodeRun = Callable[[], DecodeOutput]


@dataclass(frozen=True)
class Tolerance:
    """How close an implementation's output must be to the reference (compare.close's rule).

    `name` labels the class in result rows; `why` says where its numbers come from.
    """

    abs_tol: float
    rel_tol: float
    cos_tol: float
    why: str
    max_mismatch: float = 0.0  # fraction of elements allowed outside the element rule
    name: str = "strict"
    # natural-log LSE, absolute: fp32 softmax sums round far below this
    lse_abs_tol: float = 1e-3

    def kwargs(self) -> dict:
        return {
            "abs_tol": self.abs_tol,
            "rel_tol": self.rel_tol,
            "cos_tol": self.cos_tol,
            "max_mismatch": self.max_mismatch,
        }

    def rule(self) -> str:
        """The class in one line, for records: 'abs 0.001 / rel 0.0156, cos < 5e-06, 0% outside'."""
        return (
            f"abs {self.abs_tol:g} / rel {self.rel_tol:.3g}, cos < {self.cos_tol:g}, "
            f"{self.max_mismatch:.4%} outside"
        )


# FlashMLA's rule (compare.py explains each number): the bar for the harness's own kernels.
STRICT = Tolerance(ABS_TOL, REL_TOL, COS_DIFF_TOL, "FlashMLA's sparse-decode rule")


def torch_library() -> tuple[str, str | None]:
    return "torch", environment.package_version("torch")


@dataclass(frozen=True)
class ImplSpec:
    """A registry entry: name, which devices it runs on, the adapter factory, and what it is.

    `unsupported(problem)` returns None when this machine can run the implementation on the
    problem, else one line naming the GPU and what the implementation needs.
    `prepare(problem)` returns the DecodeRun closure. `tolerance` is its accuracy class: the
    rule check-pagetable and bench-decode hold its output to against the reference.
    `serving_backend` names the serving-engine backend that runs this kernel (None: no engine
    runs it as measured here); `deployable` says in a few words why it is or is not a path a
    server can take. `library()` gives (package, version) of the code behind the kernel.
    `kernel(problem)`, where given, says in one line which kernel and launch shape `prepare`
    takes for the problem (implementations that choose by shape, or pad it).
    """

    name: str
    description: str
    unsupported: Callable[[DecodeProblem], str | None]
    prepare: Callable[[DecodeProblem], DecodeRun]
    tolerance: Tolerance = STRICT
    serving_backend: str | None = None
    deployable: str = ""
    library: Callable[[], tuple[str, str | None]] = torch_library
    kernel: Callable[[DecodeProblem], str] | None = None

    @property
    def is_deployable(self) -> bool:
        """A serving engine runs this kernel on the fp8 cache as measured here."""
        return self.serving_backend is not None


def gpu_refusal(impl: str, sms: Iterable[int], need: str) -> str | None:
    """None when GPU 0 has one of the compute capabilities `sms`, else one line naming the
    GPU and what `impl` needs, e.g. 'flashinfer-sm120 needs an SM120/SM121 GPU (this is
    NVIDIA H200, SM90)'."""
    info = environment.gpu_info()
    if info.get("gpu") is None:
        return f"{impl} needs a CUDA GPU ({need}); none is visible"
    if info.get("sm") not in set(sms):
        return f"{impl} needs {need} (this is {info['gpu']}, SM{info['sm']})"
    return None


def device_refusal(impl: str, problem: DecodeProblem) -> str | None:
    """None when the problem's tensors are on a CUDA device, else one line."""
    if problem.q.device.type != "cuda":
        return f"{impl} runs on CUDA tensors; this problem is on {problem.q.device}"
    return None
