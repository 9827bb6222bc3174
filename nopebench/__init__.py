"""nopebench: validate and benchmark NoPE sparse MLA on FlashInfer's sparse MLA backends."""

__version__ = "0.1.0"
