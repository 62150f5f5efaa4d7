"""Our FlyDSL kernel library (named so it never clashes with FlyDSL's upstream `kernels` package).

Kernel builders take shapes, dtypes and constexprs, never graph nodes. Each op module exposes
``build_<kernel>(...)`` (returns a compiled @flyc.jit launcher, cached per specialization) and a
torch-tensor entry point that allocates outputs and launches it. Nothing here imports `translator`.
"""
