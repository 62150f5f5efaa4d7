"""The GPU architectures the kernel library targets: the one list the translator, the kernels,
the ISA tools and the kernel tests read.

gfx942 is MI300X / MI325X (CDNA3), gfx950 is MI350X / MI355X (CDNA4). flysim, its own
distribution, keeps the list of the architectures it interprets (flysim.toolchain.ARCHS).
"""

ARCHS = ("gfx942", "gfx950")
