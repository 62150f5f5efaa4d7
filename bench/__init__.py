"""Performance evidence without an AMD GPU, and a latency benchmark for when one is present.

    python -m bench.kernels   ISA statistics, flysim traffic, roofline model per kernel
    python -m bench.models    translate / compile / verify timings and traffic model per model
    python -m bench.rocm      device-event latencies (needs a ROCm GPU; says so and exits 0 otherwise)
    python -m bench.report    runs the above and writes the tables with their commands (BENCHMARKS.md)
"""
