"""What the tests and bench/ measure about our kernels, without a GPU: ISA statistics of a compile
(gemm_isa, attention_isa, layout_isa: each compiles in a child process through translator_kernels.isa)
and the global bytes flysim counts (traffic, against translator_kernels.traffic's model). The tests
assert on these; bench/ imports them and prints tables.
"""
