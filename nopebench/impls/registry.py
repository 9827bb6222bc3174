"""The registry of sparse MLA decode implementations, and dispatch over it.

Every consumer (check-pagetable, bench-decode, the CLI's choices, table columns) gets the list
of implementations from `implementations()`; nothing routes by name with if/elif chains. An
entry that this machine cannot run stays listed and says why in one line (`unsupported`), so
tables can show it as refused rather than silently missing.

The `native` entry belongs to `nopebench.impls.native.plans` (`native_spec()`); it is imported lazily
and, when that import fails, listed with the import failure as its reason.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from nopebench import environment, signatures
from nopebench.errors import UnsupportedError, UsageError
from nopebench.impls.interface import DecodeOutput, DecodeProblem, DecodeRun, ImplSpec
from nopebench.impls.reference import sparse_decode_reference

NATIVE_MODULE = "nopebench.impls.native.plans"


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


def _reference_prepare(problem: DecodeProblem) -> DecodeRun:
    """The reference needs no preparation; its closure is the whole computation."""

    def run() -> DecodeOutput:
        out, lse = sparse_decode_reference(
            problem.q, problem.cache, problem.indices, problem.softmax_scale, problem.rope_dim
        )
        return DecodeOutput(out, lse)

    return run


def reference_spec() -> ImplSpec:
    return ImplSpec(
        name="reference",
        description="torch reference over the dequantized cache (fp32 accumulation; CPU or GPU)",
        unsupported=lambda problem: None,
        prepare=_reference_prepare,
    )


def native_spec() -> ImplSpec:
    """The lead's native NoPE kernel, or a placeholder that names why it cannot be loaded."""
    try:
        module = importlib.import_module(NATIVE_MODULE)
        return module.native_spec()
    except Exception as exc:  # any import-time failure must not take the registry down
        reason = f"native is not available: {NATIVE_MODULE}.native_spec failed to load ({type(exc).__name__}: {exc})"

        def prepare(problem: DecodeProblem) -> DecodeRun:
            raise UnsupportedError(reason)

        return ImplSpec("native", "native NoPE sparse decode (not loadable here)", lambda problem: reason, prepare)


def implementations() -> dict[str, ImplSpec]:
    """Every implementation the harness knows, in display order, keyed by name."""
    from nopebench.impls import flashinfer as fa

    specs = [reference_spec(), native_spec(), *fa.flashinfer_specs()]
    return {spec.name: spec for spec in specs}


def names() -> list[str]:
    """Implementation names for CLI choices and table columns."""
    return list(implementations())


def lookup(impl_name: str, registry: dict[str, ImplSpec] | None = None) -> ImplSpec:
    registry = implementations() if registry is None else registry
    try:
        return registry[impl_name]
    except KeyError:
        raise UsageError(f"unknown implementation {impl_name!r}: choose one of {', '.join(registry)}") from None


def runnable(problem: DecodeProblem, registry: dict[str, ImplSpec] | None = None) -> tuple[list[ImplSpec], dict[str, str]]:
    """The implementations this machine can run on `problem`, and the refusal line of each other."""
    registry = implementations() if registry is None else registry
    ok, refused = [], {}
    for spec in registry.values():
        reason = spec.unsupported(problem)
        if reason is None:
            ok.append(spec)
        else:
            refused[spec.name] = reason
    return ok, refused


def prepare(problem: DecodeProblem, impl_name: str, registry: dict[str, ImplSpec] | None = None) -> DecodeRun:
    """The launch closure of one implementation for `problem`.

    Raises UsageError for an unknown name, UnsupportedError (one line) when this machine
    cannot run it, and signatures.KnownFailure when the failure is a known upstream one.
    """
    spec = lookup(impl_name, registry)
    reason = spec.unsupported(problem)
    if reason is not None:
        raise UnsupportedError(reason)
    try:
        run = spec.prepare(problem)
    except Exception as exc:
        signatures.raise_if_known(exc, spec.name)
        raise

    def checked_run() -> DecodeOutput:
        try:
            return run()
        except Exception as exc:
            signatures.raise_if_known(exc, spec.name)
            raise

    return checked_run


def decode(problem: DecodeProblem, impl_name: str, registry: dict[str, ImplSpec] | None = None) -> DecodeOutput:
    """Prepare and run one implementation once (host work included: not for timing)."""
    return prepare(problem, impl_name, registry)()
