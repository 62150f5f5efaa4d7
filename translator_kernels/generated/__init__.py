"""Generated kernels: elementwise chains, reductions and scans, written from a per-element program."""
