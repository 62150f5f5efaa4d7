"""Kernel code generators (hand-written): each writes the FlyDSL source of an elementwise chain, a
reduction or a scan from a per-element program (translator_kernels.program), then builds it. What
they write is generated; this folder is not (docs/generated-kernels.md)."""
