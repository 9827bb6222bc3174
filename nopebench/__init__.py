"""nopebench: validate and benchmark NoPE sparse MLA (GLM-5.3-Flash) against the decode backends
serving engines run (FlashMLA, FlashInfer), with native kernels of its own."""

__version__ = "0.1.0"
# The one-line description: the CLI's help and the report open with it; pyproject.toml's
# `description` is the same text (a test holds them together).
SUMMARY = (
    "Validate and benchmark NoPE sparse MLA (GLM-5.3-Flash) against the decode backends "
    "serving engines run (FlashMLA, FlashInfer), with native kernels of its own"
)
